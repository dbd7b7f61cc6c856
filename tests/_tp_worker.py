"""Worker of tests/test_tensor_parallel.py (not a test itself): under torchrun with 2 CPU processes, the tiny Qwen2
split by `rlhf_nb.sharding.tensor_parallelize` gives the unsplit model's logits, runs backward, an AdamW step and
`generate`; prints 'tp ok' on success."""
import torch, torch.distributed as dist
from rlhf_nb.models import char_tokenizer, tiny_causal_lm
from rlhf_nb.sharding import tensor_parallelize

dist.init_process_group("gloo")
tok = char_tokenizer()
tp, full = tensor_parallelize(tiny_causal_lm(tok, seed=0)), tiny_causal_lm(tok, seed=0)
local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in tp.parameters())
assert local < 0.9 * sum(p.numel() for p in full.parameters()), local           # the blocks' weights really are split
torch.manual_seed(0); x = torch.randint(5, 50, (2, 8))                      # every rank sees the same batch
out, want = tp(input_ids=x, labels=x), full(input_ids=x, labels=x)
assert torch.allclose(out.logits, want.logits, atol=1e-5), (out.logits - want.logits).abs().max()
out.loss.backward(); torch.optim.AdamW(tp.parameters(), lr=1e-3).step()
assert tp.generate(input_ids=x[:, :3], max_new_tokens=3, do_sample=False, pad_token_id=0).shape == (2, 6)
if dist.get_rank() == 0: print("tp ok", flush=True)
dist.destroy_process_group()
from rlhf_nb.dist import exit_process
exit_process(0)

"""The chunked LM head (rlhf_nb.chunked_head) inside the RL trainer gives the plain head's numbers.

Worker level: the actor's log-probs, entropies and parameter gradients (tied embeddings, a shared value head, a LoRA
policy) and the reference's log-probs (frozen copy, LoRA with the adapter disabled) with `logprob_chunk_size` equal
the plain forward's in float32 (1e-5). Trainer level: one GRPO step of the plain trainer gives the same metrics with
and without it. The option's refusals (with the fast paths, a bad size, a model that changes logits after the head)
are one line each."""
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from rlhf_nb.config import ConfigError
from rlhf_nb.models import char_tokenizer, tiny_causal_lm, wrap_lora
from rlhf_nb.workers import ActorRolloutWorker, Reference, RefPolicyWorker, sequence_positions
from rlhf_nb.rl_config import GRPOConfig

EPS = 1e-5


@pytest.fixture(scope="module")
def tok(): return char_tokenizer()


def rows(vocab, B=4, P=5, R=7, seed=0):
    "Left-padded prompts with right-padded responses, as the trainer's batches hold them."
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, vocab, (B, P + R), generator=g)
    mask = torch.ones(B, P + R, dtype=torch.long); mask[1, :2] = 0; mask[2, P + 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": sequence_positions(mask), "responses": ids[:, P:]}


def wcfg(chunk, entropy_coef=0.1):
    return SimpleNamespace(learning_rate=1e-3, weight_decay=0.0, lr_scheduler_type="constant", warmup_steps=0, max_steps=2,
                           max_completion_length=7, temperature=0.8, top_k=0, top_p=1.0, num_generations=2,
                           share_prompt_prefix=False, entropy_coef=entropy_coef, max_grad_norm=1.0, logprob_chunk_size=chunk)


def actor_out(policy, tok, chunk, value_head=False):
    w = ActorRolloutWorker(policy, tok, wcfg(chunk), Accelerator(cpu=True), value_head=value_head)
    d = rows(len(tok))
    lp, ent, v = w.forward(d, with_entropy=True)
    ((lp * torch.linspace(-1, 1, lp.shape[1])).sum() + 0.1 * ent.sum() + (0 if v is None else v.sum())).backward()
    grads = [p.grad.clone() for p in w.module.parameters() if p.grad is not None]
    return [lp.detach(), ent.detach()] + ([] if v is None else [v.detach()]), grads


@pytest.mark.parametrize("value_head,lora", [(False, False), (True, False), (False, True)])
def test_actor_forward_and_gradients_equal_plain(tok, value_head, lora):
    make = lambda: wrap_lora(tiny_causal_lm(tok, seed=0), r=4, alpha=8) if lora else tiny_causal_lm(tok, seed=0)
    torch.manual_seed(0); want, gw = actor_out(make(), tok, None, value_head)
    torch.manual_seed(0); got, gg = actor_out(make(), tok, 3, value_head)
    assert len(gw) == len(gg) > 0
    for a, b in zip(want + gw, got + gg): torch.testing.assert_close(b, a, atol=EPS, rtol=EPS)


def test_head_is_back_after_the_forward(tok):
    pol = tiny_causal_lm(tok, seed=0)
    w = ActorRolloutWorker(pol, tok, wcfg(4), Accelerator(cpu=True))
    w.compute_log_prob(rows(len(tok)))
    assert isinstance(pol.lm_head, torch.nn.Linear) and pol.lm_head.weight is pol.model.embed_tokens.weight


@pytest.mark.parametrize("strategy", ["copy", "peft"])
def test_reference_log_probs_equal_plain(tok, strategy):
    pol = tiny_causal_lm(tok, seed=1)
    if strategy == "peft": pol = wrap_lora(pol, r=4, alpha=8)
    ref, d = Reference(pol, strategy), rows(len(tok), seed=2)
    want = RefPolicyWorker(ref, wcfg(None), Accelerator(cpu=True)).compute_ref_log_prob(d)
    got = RefPolicyWorker(ref, wcfg(5), Accelerator(cpu=True)).compute_ref_log_prob(d)
    torch.testing.assert_close(got, want, atol=EPS, rtol=EPS)


def test_option_refusals(tok):
    with pytest.raises(ConfigError, match="logprob_chunk_size runs on the plain trainer's workers: set fast_paths false"):
        GRPOConfig(logprob_chunk_size=256)
    assert GRPOConfig(logprob_chunk_size=256, fast_paths=False).logprob_chunk_size == 256
    assert GRPOConfig().logprob_chunk_size is None                      # off by default: golden runs unchanged
    from rlhf_nb.chunked_head import checked_head
    pol = tiny_causal_lm(tok, seed=0); pol.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"): checked_head(pol)


def test_one_grpo_step_equal_plain(tmp_path):
    from rlhf_nb.ppo import RLTrainer
    def step(chunk):
        cfg = GRPOConfig(output_dir=str(tmp_path / f"run{chunk}"), per_device_train_batch_size=2, num_generations=2,
                         max_completion_length=4, arith_train_size=8, eval_steps=0, disable_tqdm=True, save_final=False,
                         seed=0, max_steps=1, fast_paths=False, logprob_chunk_size=chunk, kl_coef=0.05, use_kl_loss=True)
        return RLTrainer(cfg).fit()[-1]
    a, b = step(None), step(3)
    keys = [k for k in a if k.startswith(("actor/", "reward/", "response/")) and isinstance(a[k], float)]
    assert "actor/pg_loss" in keys
    for k in keys: assert b[k] == pytest.approx(a[k], abs=1e-5), k



def test_under_bf16_autocast_matches_plain():
    "Under bf16 autocast (the trainer's bf16): the same log-probs and entropies, gradients within bf16 rounding."
    import torch.nn as nn
    from rlhf_nb.core import logprobs_and_entropy
    from rlhf_nb.chunked_head import lm_head_logprobs
    torch.manual_seed(0)
    head, h0, y = nn.Linear(32, 500, bias=False), torch.randn(4, 9, 32), torch.randint(0, 500, (4, 9))
    def run(f):
        h = h0.clone().requires_grad_(); head.zero_grad()
        with torch.autocast("cpu", torch.bfloat16): lp, ent = f(h)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return lp.detach(), ent.detach(), h.grad.clone(), head.weight.grad.clone()
    a = run(lambda h: logprobs_and_entropy(head(h), y, 0.9, entropy_grad=True))
    b = run(lambda h: lm_head_logprobs(h, head, y, 0.9, 5, entropy_grad=True))
    for x, z in zip(a[:2], b[:2]): torch.testing.assert_close(z, x, atol=EPS, rtol=EPS)
    for x, z in zip(a[2:], b[2:]): torch.testing.assert_close(z, x, atol=2e-2, rtol=2e-2)

# --- tools/gpu_check.sh in its smoke mode: the GPU check's code on a tiny shape on the CPU ---------------------------
def test_gpu_check_smoke_mode(tmp_path):
    import json, subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([str(root / "tools/gpu_check.sh"), "--cpu", "--tiny", "--steps", "1", "--out", str(tmp_path / "gc")],
                       capture_output=True, text=True, timeout=300, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "gc.json").read_text())
    assert res["matmul_peak_tflops"] > 0 and res["mode"] == "cpu tiny"
    pad = res["arms"]["padded"]
    assert pad["step_s"] > 0 and pad["tokens_per_s"] > 0 and 0 < pad["mfu"] and pad["dtype"] == "bf16"
    assert abs(pad["rollout_s"] + pad["logprobs_s"] + pad["update_s"] - pad["step_s"]) < pad["step_s"]
    assert all(c["status"].startswith("skipped") for c in res["gpu_cells"])
    assert "Measured bf16 matmul peak" in (tmp_path / "gc.md").read_text()
    bad = subprocess.run([str(root / "tools/gpu_check.sh"), "--bogus"], capture_output=True, text=True, cwd=root)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("gpu_check.sh: error: unknown option --bogus")


# --- adapter-only sync in the trainer, with vLLM (in its own interpreter, as tests/test_rollout_vllm.py runs it) -----
LORA_SYNC_CHECK = r"""
import torch
from rlhf_nb.algos import GRPOConfig, rl_trainer_class
from rlhf_nb.rollout import SamplingParams, adapter_weights, tensor_bytes, checkpoint_weights
from rlhf_nb.core import logprobs_from_logits
from rlhf_nb.workers import causal_lm_logits, sequence_positions
cfg = GRPOConfig(rollout_engine="vllm", use_peft=True, lora_r=4, lora_alpha=8, max_steps=1, eval_steps=0, output_dir="run",
                 disable_tqdm=True, save_final=False, per_device_train_batch_size=4, num_generations=4, arith_train_size=64,
                 max_completion_length=8, learning_rate=1e-2, entropy_coef=0.01)
T = rl_trainer_class(cfg)(cfg).init_workers()
m = T.step()
pol = T.unwrapped_policy
assert T.rollout.supports_adapter and T.rollout.weight_version == 1
with checkpoint_weights(pol) as w: merged = tensor_bytes(w)
assert m["sync/bytes"] == tensor_bytes(adapter_weights(pol)) < merged / 5, (m["sync/bytes"], merged)
prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
worst = 0.0
for p, c in zip(prompts, T.rollout.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0, seed=0))):
    ids = torch.tensor([p + c.token_ids]); mask = torch.ones_like(ids)
    with torch.no_grad():
        lp = logprobs_from_logits(causal_lm_logits(pol, ids, mask, sequence_positions(mask), len(c.token_ids)), ids[:, len(p):])[0]
    worst = max(worst, float((lp - torch.tensor(c.logprobs)).abs().max()))
assert worst <= 1e-4, worst
print("LORA_SYNC_OK", m["sync/bytes"], merged, worst)
"""


def test_lora_adapter_sync_with_vllm(tmp_path):
    "GRPO with use_peft and the colocated vLLM engine: one update, the adapter alone synced, vLLM's log-probs = the trainer's."
    import os, subprocess
    from pathlib import Path
    from test_rollout_vllm import vllm_python, ENV
    py, root = vllm_python(), Path(__file__).resolve().parents[1]
    (tmp_path / "check.py").write_text(LORA_SYNC_CHECK)
    r = subprocess.run([py, "check.py"], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                       env={**ENV, "PYTHONPATH": str(root)})
    assert r.returncode == 0 and "LORA_SYNC_OK" in r.stdout, r.stderr[-4000:]

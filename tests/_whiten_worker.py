"""Worker of tests/test_placement.py::test_reinforce_pp_whitens_over_every_process (not a test itself).

Under `accelerate launch` with 2 processes each rank computes REINFORCE++ advantages for its half of a fixed batch;
rank 0 checks that the gathered advantages are the one-process advantages of the whole batch (global statistics),
and that they differ from whitening each half on its own (so the check has teeth). Exit status 0 = both hold."""
import sys
import torch
from rlhf_nb.core import get_adv_estimator
from rlhf_nb.ppo import PPOConfig, RLTrainer

cfg = PPOConfig(adv_estimator="reinforce_plus_plus", critic="none", whiten_advantages=False, per_device_train_batch_size=2,
                arith_train_size=8, eval_steps=0, disable_tqdm=True, output_dir=sys.argv[1])
t = RLTrainer(cfg).init_workers()
g = torch.Generator().manual_seed(0)
scores, mask = torch.randn(4, 5, generator=g), (torch.rand(4, 5, generator=g) > 0.3).float()
mask[:, 0] = 1
mine = slice(2 * t.rank, 2 * t.rank + 2)
zeros = torch.zeros(2, 5)
data = t.compute_advantages({"token_level_scores": scores[mine], "response_mask": mask[mine], "old_log_probs": zeros, "ref_log_probs": zeros})
got = t.accelerator.gather(data["advantages"])
if t.rank == 0:
    est = get_adv_estimator("reinforce_plus_plus")
    want = est(scores * mask, mask)[0]
    per_rank = torch.cat([est(scores[s] * mask[s], mask[s])[0] for s in (slice(0, 2), slice(2, 4))])
    assert t.world == 2, t.world
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    assert not torch.allclose(got, per_rank, atol=1e-3), "per-rank and global whitening agree: the test data is too easy"
    print("global whitening ok")
from rlhf_nb.dist import exit_process
exit_process(0)

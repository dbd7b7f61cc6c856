"""A small deterministic reward for tests that need a trainer but not a grader (not a test module itself)."""
import torch


class ParityReward:
    "Reward manager: the fraction of even token ids in each response, placed on its last token. No decoding, no randomness."
    def __call__(self, batch):
        resp, mask = batch["responses"], batch["response_mask"].float()
        s = ((resp % 2 == 0).float() * mask).sum(-1) / mask.sum(-1).clamp_min(1)          # [B]
        out = torch.zeros_like(mask)                                                       # [B, R]
        out[torch.arange(len(s)), (mask.sum(-1).long() - 1).clamp_min(0)] = s
        return out, {"parity/mean": float(s.mean())}

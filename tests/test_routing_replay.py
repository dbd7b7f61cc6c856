"""enable_routing_replay through the command line: a 2-step GRPO run of a tiny Qwen3-MoE policy whose sampler routes
on noisy logits (the trainer's log-probs equal the sampler's only because its choices are replayed), and the refusals."""
import json
from contextlib import contextmanager
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import rlhf_nb.routing_replay as rr
from rlhf_nb.models import char_tokenizer

from test_rollout_corr import TINY, run           # the same 2-step GRPO run through launch.main


@contextmanager
def noisy_routing(model, std=0.05):
    "The sampler's routers choose on logits plus noise (weights unchanged)."
    g = torch.Generator().manual_seed(0)
    def choose(router, hidden_states):
        z = F.linear(hidden_states.reshape(-1, router.hidden_dim), router.weight)
        noisy = z.float() + std * torch.randn(z.shape, generator=g)
        return rr.route(router, hidden_states, torch.topk(noisy, router.top_k, -1).indices)
    for _, m in rr.moe_routers(model): m.forward = partial(choose, m)
    try: yield
    finally:
        for _, m in rr.moe_routers(model): m.__dict__.pop("forward", None)


def test_replay_gives_the_noisy_samplers_logprobs_back(capsys, monkeypatch, tmp_path):
    tok = char_tokenizer()
    model = rr.tiny_moe_causal_lm(tok); model.save_pretrained(tmp_path / "moe"); tok.save_pretrained(tmp_path / "moe")
    inner, replays = rr._inner_generate, []
    def noisy_generate(self, batch):
        with noisy_routing(self.policy): return inner(self, batch)
    real_replay = rr.replay_routing
    def counted(model, experts): replays.append(tuple(experts.shape)); return real_replay(model, experts)
    monkeypatch.setattr(rr, "_inner_generate", noisy_generate); monkeypatch.setattr(rr, "replay_routing", counted)
    rc, err = run(capsys, monkeypatch, tmp_path, "--model_name_or_path", "moe", "--output_dir", "g",
                  "--enable_routing_replay", "true", "--fast_paths", "false", "--importance_sampling_mode", "token_truncate")
    assert rc == 0, err
    assert replays and all(s[2:] == (2, 2) for s in replays)          # [rows, positions, layers, experts per token]
    steps = [json.loads(l) for l in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "sampling/kl_prox_behav" in r]
    assert len(steps) == 2
    for r in steps: assert r["sampling/sampling_logp_difference/max"] < 1e-5, r


@pytest.mark.parametrize("args,msg", [
    (["--enable_routing_replay", "true", "--rollout_engine", "vllm"],
     "enable_routing_replay records the plain trainer's synchronous hf sampler: it needs fast_paths false, rollout_engine hf"),
    (["--enable_routing_replay", "true", "--fast_paths", "false"], "enable_routing_replay needs a mixture-of-experts policy"),
])
def test_refusals_name_the_option(capsys, monkeypatch, tmp_path, args, msg):
    rc, err = run(capsys, monkeypatch, tmp_path, "--output_dir", "r", *args)
    assert rc == 2 and f"rlhf-nb grpo: error: {msg}" in err, err

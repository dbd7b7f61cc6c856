"""Multi-turn, tool-calling rollouts in the trainer: the batch a tool-using run trains on, its masks, log-probs,
gradients and metrics, with GRPO, PPO (critic) and an asynchronous sampler. The loop itself is taught and tested in
`nbs/01ft_agents.ipynb`; these tests run the trainer on episodes from a tiny policy warm-started on a few
calculator demonstrations.
"""
import subprocess, sys

import pytest
import torch

from rlhf_nb.agents import calc_warm_start, AgentLoop, CalculatorEnv, Trajectory
from rlhf_nb.algos import GRPOConfig
from rlhf_nb.arith import make_calc
from rlhf_nb.config import ConfigError
from rlhf_nb.core import actor_loss
from rlhf_nb.models import load_causal_lm, load_tokenizer
from rlhf_nb.ppo import RLTrainer
from rlhf_nb.rl_config import PPOConfig

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    "A tiny policy that has seen a few calculator demonstrations: it calls the tool in most episodes."
    return calc_warm_start(tmp_path_factory.mktemp("agents") / "warm", n_demos=8, steps=60, progress=False)


def trainer(warm, out, cls=GRPOConfig, **kw):
    opts = dict(environment="calculator", max_tool_calling_iterations=2, max_completion_length=160, max_prompt_length=64,
                per_device_train_batch_size=4, num_generations=2, max_steps=2, eval_steps=0, output_dir=str(out),
                disable_tqdm=True, seed=0, data_seed=0)
    cfg = cls(**{**opts, **kw})
    t = RLTrainer(cfg, policy=load_causal_lm(warm), tokenizer=load_tokenizer(warm), train_dataset=make_calc(32, "train"),
                  eval_dataset=make_calc(8, "test"))
    return t.init_workers()


def episodes(t):
    data = t.generate_sequences(t.next_batch())
    data, _ = t.compute_scores(data)
    return t.compute_log_probs_and_values(data)


def test_the_batch_masks_tool_tokens_and_matches_the_sampler(warm, tmp_path):
    t = trainer(warm, tmp_path / "g")
    data = episodes(t)
    mask, att = data["response_mask"].bool(), data["attention_mask"][:, data["prompts"].shape[1]:].bool()
    assert (att & ~mask).any(), "some episodes must contain tool tokens (attention 1, loss 0)"
    assert data["rollout_metrics"]["tools/call_frequency"] > 0
    # Σ mask is the number of sampled tokens: each sampled turn ends with eos, tool turns contain none sampled
    eos = t.tokenizer.eos_token_id
    for row, m in zip(data["responses"], mask):
        assert int(m.sum()) == len([i for i, k in zip(row.tolist(), m.tolist()) if k])
        assert int((row[m] == eos).sum()) >= 1
    # the sampler's log-probs equal the trainer's recomputed ones on sampled tokens (fp32, same weights)
    gap = (data["old_log_probs"] - data["rollout_log_probs"])[mask].abs().max().item()
    assert gap < 1e-4, gap
    assert data["rollout_log_probs"][~mask].abs().max().item() == 0.0


def test_gradient_is_zero_at_tool_tokens(warm, tmp_path):
    t = trainer(warm, tmp_path / "g")
    data = t.compute_advantages(episodes(t))
    actor = t.workers[next(r for r in t.workers if r.name == "ActorRollout")]
    logits = actor.module(data["input_ids"], data["attention_mask"], data["position_ids"], data["responses"].shape[1])[0]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, data["responses"].unsqueeze(-1)).squeeze(-1)
    lp.retain_grad()
    loss, _ = actor_loss(lp, data["old_log_probs"], data["advantages"], data["response_mask"], loss_agg_mode="token-mean")
    loss.backward()
    m = data["response_mask"].bool()
    assert lp.grad[~m].abs().max().item() == 0.0
    assert data["advantages"][~m].abs().max().item() == 0.0


@pytest.mark.parametrize("kind", ["grpo", "rloo", "ppo"])
def test_a_training_step_logs_the_tool_metrics(kind, warm, tmp_path):
    cls, kw = (PPOConfig, {}) if kind == "ppo" else (GRPOConfig, {"adv_estimator": kind})
    t = trainer(warm, tmp_path / kind, cls, **kw)
    m = t.step()
    for k in ("tools/call_frequency", "tools/failure_frequency", "num_turns/mean", "num_turns/max"):
        assert k in m, sorted(m)
    assert m["num_turns/max"] >= 2 and torch.isfinite(torch.tensor(m["actor/pg_loss"] if "actor/pg_loss" in m else 0.0))
    if kind == "ppo":                                                    # the critic is fitted on sampled tokens only
        data = episodes(t)
        assert data["values"][~data["response_mask"].bool()].abs().max().item() == 0.0


def test_asynchronous_sampling_runs_episodes(warm, tmp_path):
    t = trainer(warm, tmp_path / "a", max_staleness=1, max_steps=2)
    t.fit()
    rows = t.history
    steps = [r for r in rows if "tools/call_frequency" in r]
    assert len(steps) == 2 and all(r["num_turns/mean"] >= 1 for r in steps)


def test_evaluation_runs_the_episodes(warm, tmp_path):
    t = trainer(warm, tmp_path / "e", eval_steps=1)
    out = t.evaluate()
    assert out["eval/n"] == 8
    assert any("<tool_call>" in a for _, a in t.last_eval_samples)


def test_ray_placement_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="placement colocate or accelerate, not ray"):
        GRPOConfig(environment="calculator", placement="ray")


@pytest.mark.parametrize("args,msg", [
    (["--environment", "abacus"], "unknown environment 'abacus'"),
    (["--tools", "math.sqrt"], "write it as 'package.module:name'"),
    (["--tool_call_parser", "xml"], "unknown tool_call_parser 'xml'"),
    (["--max_tool_response_length", "0"], "max_tool_response_length must be >= 1"),
])
def test_bad_agent_options_are_one_line(args, msg, tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlhf_nb.launch", "grpo", "--output_dir", str(tmp_path / "x"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    err = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and msg in err[0], r.stderr
    assert not (tmp_path / "x").exists()

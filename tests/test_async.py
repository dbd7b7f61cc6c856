"""Asynchronous training (`max_staleness`, issue 27): the synchronous trainer is unchanged at 0, a one-step-off run
trains on exactly the batches its schedule says, and a run killed mid-way and resumed equals the run never stopped.

Runs use the kill-and-resume harness of `tests/test_resume.py` (the CLI's own entry point in a fresh process, a dense
reward so a tiny policy gets real gradients, one thread each, bit-reproducible).
"""
import json, signal
from pathlib import Path

import pytest

from test_resume import Run, cmd, metrics, assert_same_metrics, assert_same_weights, assert_same_samples, checkpoints, N


def rows(out):
    return [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])                    # PPO with its separate critic, and GRPO
def test_max_staleness_zero_is_the_synchronous_trainer(algo, tmp_path):
    "`max_staleness: 0` logs exactly the synchronous trainer's metrics (every key, every step) and its weights."
    sync, zero = tmp_path / "sync", tmp_path / "zero"
    runs = [Run(cmd(algo, sync), sync), Run(cmd(algo, zero, "--max_staleness", 0), zero)]
    for r in runs: r.ok()
    assert metrics(sync) == metrics(zero)
    assert not any(k.startswith("staleness/") for r in rows(zero) for k in r)
    assert_same_weights(sync, zero)


_ASYNC_REFS = {}

def async_reference(algo, tmp_path_factory):
    "The uninterrupted `max_staleness: 1` run of `algo` (started once per session)."
    if algo not in _ASYNC_REFS:
        out = tmp_path_factory.mktemp(f"async-ref-{algo}") / "run"
        _ASYNC_REFS[algo] = Run(cmd(algo, out, "--max_staleness", 1, "--save_total_limit", 100), out)
    return _ASYNC_REFS[algo]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_one_step_off_schedule(algo, tmp_path_factory):
    "Step 1 trains on a batch of version 0, every later step on a batch exactly one version old; the gap is logged."
    ref = async_reference(algo, tmp_path_factory).ok()
    got = [r for r in rows(ref) if r["step"] >= 1]                   # PPO also logs its evaluation at step 0
    assert [r["step"] for r in got] == list(range(1, N + 1))
    assert [r["staleness/max"] for r in got] == [0] + [1] * (N - 1)
    assert all(r["staleness/mean"] == r["staleness/max"] for r in got)
    assert all("sampling/kl_prox_behav" in r and "time/trainer_wait" in r for r in got)
    assert any(r["sampling/kl_prox_behav"] > 0 for r in got[1:]), "stale batches must show a gap to the trainer's policy"


@pytest.mark.parametrize("algo,point", [("grpo", "mid"), ("ppo", "rename")])
def test_one_step_off_kill_and_resume_equals_uninterrupted(algo, point, tmp_path, tmp_path_factory):
    "SIGKILL while checkpoint-3 is written, resume from `latest` (checkpoint-2 and the batch it had in flight) == never stopped."
    ref = async_reference(algo, tmp_path_factory)
    out = tmp_path / "run"
    killed = Run(cmd(algo, out, "--max_staleness", 1, "--save_total_limit", 2, kill_at=3, kill_point=point), out)
    rc = killed.wait()
    assert rc == -signal.SIGKILL, f"the run was meant to die while saving checkpoint-3, exited {rc}:\n{killed.tail()}"
    assert checkpoints(out)[-1].name == "checkpoint-2"
    assert (checkpoints(out)[-1] / "rollouts_in_flight.pt").exists(), "the batch sampled ahead must be in the checkpoint"
    Run(cmd(algo, out, "--max_staleness", 1, "--save_total_limit", 2, "--resume_from_checkpoint", "latest"), out).ok()
    ref.ok()
    assert_same_metrics(ref.out, out)
    assert_same_weights(ref.out, out)
    assert_same_samples(ref.out, out)


# --- bad input: one line each, exit status 2, nothing written -------------------------------------------------------

BAD = [(["--max_staleness", "-1"], "max_staleness must be an integer >= 0"),
       (["--max_staleness", "1", "--placement", "accelerate"], "colocate (a sampler thread beside the trainer) or ray (a Rollout pool)"),
       (["--off_policy_objective", "fancy"], "off_policy_objective"),
       (["--max_staleness", "1", "--placement", "ray", "--resource_pools", "t=1", "--role_pools", "ActorRollout=t"],
        "samples on a Rollout pool of its own"),
       (["--max_staleness", "1", "--placement", "ray", "--resource_pools", "t=1", "--role_pools", "ActorRollout=t,Rollout=t"],
        "Rollout must have a pool of its own")]

@pytest.mark.parametrize("args,needle", BAD, ids=["negative", "accelerate", "objective", "ray-no-pool", "ray-same-pool"])
def test_bad_async_options_are_one_line(args, needle, tmp_path, capsys, monkeypatch):
    from rlhf_nb import launch
    monkeypatch.setenv("TQDM_DISABLE", "1"); monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
    out = tmp_path / "out"
    rc = launch.main(["grpo", "--output_dir", str(out), "--max_steps", "1", "--per_device_train_batch_size", "2",
                      "--num_generations", "2", "--max_completion_length", "2", "--eval_steps", "0", "--arith_train_size", "4", *args])
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert rc == 2 and len(err) == 1 and needle in err[0], (rc, err)
    assert not out.exists() or not any(out.iterdir()), f"a refused run wrote {list(out.iterdir())}"


def test_resume_a_synchronous_checkpoint_asynchronously(tmp_path):
    "A checkpoint without batches in flight resumes with max_staleness 1: the first batch uses the restored weights (staleness 0)."
    sync, out = tmp_path / "sync", tmp_path / "async"
    Run(cmd("grpo", sync, "--save_total_limit", 100), sync).ok()
    Run(cmd("grpo", out, "--max_staleness", 1, "--resume_from_checkpoint", sync / "checkpoint-3"), out).ok()
    got = [r for r in rows(out) if r["step"] > 3]
    assert [r["staleness/max"] for r in got] == [0] + [1] * (N - 4)

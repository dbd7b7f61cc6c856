"""The same update reports the same metrics on every executor.

A short seeded run of each shipped recipe (configs/ppo_arith.yaml with its critic, configs/grpo_arith.yaml,
configs/dpo_arith.yaml) at tiny sizes, once through the plain trainer and once through the fast paths (roles and
micro-batch halves side by side in threads, shared-prompt forwards). Every metric that both metrics.jsonl files hold
must agree to 1e-5 relative (with a small absolute floor for values near 0), except the keys named in `EXCLUDED`.
The roles on Ray pools against one colocated process (PPO's critic on a pool of its own, GRPO, two micro-batches per
optimiser step, exact equality) are compared in `tests/test_placement.py`.

Every run is a fresh process of the CLI's entry point (`tests/_resume_worker.py`: `rlhf_nb.launch.main` with a dense
reward for the arithmetic task, so the tiny untrained policy gets varying scores and real gradients), pinned to one
torch thread; the fast runs ask for `parallel_roles on` / `parallel_halves on`, which the default ('auto') turns on
only with two or more threads. No SFT warm start (`--warm_start_dir ""`): the tiny model starts from its seed."""
import json, math, subprocess, sys
from pathlib import Path

import pytest
import torch

from _worker_env import ROOT, worker_env

WORKER = Path(__file__).with_name("_resume_worker.py")
ENV = worker_env()
TIMEOUT = 300
RTOL, ATOL = 1e-5, 1e-6
# ATOL: values near 0 that are differences of float32 sums, e.g. DPO's implicit reward beta*(log pi - log ref) of two
# log-probs near -70, whose rounding (about 1e-5 each) the threads' order of adding gradients moves.
# Wall-clock seconds, not properties of the update: the RL step's phases, the elapsed time
# (RL trainers: time/elapsed; DPO: time).
EXCLUDED = ("time/rollout", "time/reward", "time/logprobs", "time/update", "time/sync", "time/step", "time/elapsed", "time")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs: threads and one torch thread per process")

SHORT = ["--max_steps", 3, "--save_steps", 0, "--seed", 3, "--warm_start_dir", ""]
RL_SIZES = ["--eval_steps", 0, "--save_final", "false", "--max_completion_length", 6, "--arith_train_size", 64,
            "--rollout_threads", 1]
RUNS = {   # algo -> (config file, options that make it tiny, plain, fast)
    "ppo": ("configs/ppo_arith.yaml",
            RL_SIZES + ["--per_device_train_batch_size", 8, "--mini_batch_size", 4, "--gradient_accumulation_steps", 2],
            ["--fast_paths", "false"], ["--fast_paths", "true", "--parallel_roles", "on"]),
    "grpo": ("configs/grpo_arith.yaml",
             RL_SIZES + ["--per_device_train_batch_size", 4, "--num_generations", 4, "--mini_batch_size", 8,
                         "--gradient_accumulation_steps", 2],
             ["--fast_paths", "false"], ["--fast_paths", "true", "--parallel_roles", "on"]),
    "dpo": ("configs/dpo_arith.yaml",
            ["--num_pairs", 32, "--num_eval_pairs", 0, "--num_eval_prompts", 0, "--per_device_train_batch_size", 8,
             "--logging_steps", 1, "--eval_steps", 10**6],
            ["--parallel_halves", "off", "--share_prompt_prefix", "false"], ["--parallel_halves", "on", "--share_prompt_prefix", "true"]),
}


def run(algo, out, which):
    "Run `algo`'s tiny recipe through executor `which` ('plain' or 'fast') into `out`; -> its metric rows."
    config, sizes, *executors = RUNS[algo]
    extra = dict(zip(("plain", "fast"), executors))[which]
    args = [algo, "--config", config, "--output_dir", out, *SHORT, *sizes, *extra]
    r = subprocess.run([sys.executable, str(WORKER), "--", *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT,
                       env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]


def differences(a, b):
    "Every (step, key, a, b) where two runs' metrics differ, over the keys both hold (EXCLUDED aside)."
    assert len(a) == len(b) and len(a) >= 2, (len(a), len(b))
    out, compared = [], 0
    for x, y in zip(a, b):
        for k in sorted(set(x) & set(y) - set(EXCLUDED)):
            compared += 1
            if not math.isclose(x[k], y[k], rel_tol=RTOL, abs_tol=ATOL): out.append((x.get("step"), k, x[k], y[k]))
    assert compared >= 30, compared                                     # the comparison is not empty: 3 steps of 10+ metrics
    return out


def learning(rows, key):
    "The runs say something: every step's update had a gradient."
    vals = [r[key] for r in rows if key in r]
    assert len(vals) >= 2 and all(v > 0 for v in vals), vals


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    "Each algorithm's plain run, shared by its comparisons."
    cache = {}
    def get(algo):
        if algo not in cache: cache[algo] = run(algo, tmp_path_factory.mktemp(f"{algo}_plain"), "plain")
        return cache[algo]
    return get


@pytest.mark.parametrize("algo", ["ppo", "grpo", "dpo"])
def test_fast_and_plain_report_the_same_metrics(tmp_path, plain, algo):
    "The fast paths (threads, halves, shared prompts, deferred old log-probs) log what the plain trainer logs."
    a, b = plain(algo), run(algo, tmp_path / "fast", "fast")
    assert differences(a, b) == []
    learning(a, "grad_norm" if algo == "dpo" else "actor/grad_norm")
    if algo == "ppo": learning(a, "critic/grad_norm")

"""Placements give the same run: `colocate` (one process), `ray` split over pools, a Ray worker group of 2
data-parallel actors against accelerate DDP with 2 processes, and a Ray worker killed mid-run then resumed.

Every run is a fresh process of the CLI's entry point (`tests/_resume_worker.py`: `rlhf_nb.launch.main` with a dense
reward for the arithmetic task, so a tiny untrained policy gets varying scores and real gradients), pinned to one
torch thread per process so that results are bit-reproducible. Metrics are compared without the `time/` keys.
Equality is exact (==) unless a test says otherwise."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from _worker_env import ROOT, worker_env

pytest.importorskip("ray")
WORKER = Path(__file__).with_name("_resume_worker.py")
ENV = worker_env()
TIMEOUT = 300
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU layouts; GPU runs are in the notebook's gpu cells")

COMMON = ["--max_completion_length", 4, "--arith_train_size", 16, "--eval_steps", 0, "--fast_paths", "false",
          "--ray_cpus_per_worker", 1, "--ray_num_cpus", 4]
ARGS = {"ppo": ["--per_device_train_batch_size", 4, "--mini_batch_size", 2, "--critic", "separate", "--adaptive_kl", "true",
                "--kl_target", 0.05, "--kl_horizon", 50, "--lr_scheduler_type", "cosine", "--warmup_steps", 1],
        "grpo": ["--per_device_train_batch_size", 2, "--num_generations", 4, "--filter_groups", "false"]}
SPLIT = {"ppo": ["--resource_pools", "actor_pool=1,critic_pool=1", "--role_pools", "ActorRolloutRef=actor_pool,Critic=critic_pool"],
         "grpo": ["--resource_pools", "actor_pool=1", "--role_pools", "ActorRolloutRef=actor_pool"]}


def cli(algo, out, *extra):
    return [sys.executable, str(WORKER), "--", algo, "--output_dir", str(out), *map(str, ARGS[algo] + COMMON), *map(str, extra)]


def run(cmd, prefix=()):
    r = subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=TIMEOUT, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def metrics(out):
    rows = [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def assert_moving(rows):
    "The comparison is not empty: scores vary and the policy gets a gradient."
    assert len({r["score/mean"] for r in rows}) > 1 and all(r["actor/grad_norm"] > 0 for r in rows), rows


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_colocate_and_ray_split_log_the_same_metrics(tmp_path, algo):
    """PPO with a separate critic (actor+rollout+ref on one pool, critic on another) and GRPO: 3 steps, equal metrics.
    Two micro-batches per optimiser step, so the pools' gradient accumulation and loss weights are compared too."""
    accumulate = ("--max_steps", 3, "--gradient_accumulation_steps", 2)
    run(cli(algo, tmp_path / "colocate", *accumulate))
    run(cli(algo, tmp_path / "ray", *accumulate, "--placement", "ray", *SPLIT[algo]))
    a, b = metrics(tmp_path / "colocate"), metrics(tmp_path / "ray")
    assert len(a) == 3 and a == b, [(k, x[k], y.get(k)) for x, y in zip(a, b) for k in x if x[k] != y.get(k)][:10]
    assert_moving(a)
    workers = json.loads((tmp_path / "ray" / "ray_workers.json").read_text())
    assert {w["pool"]: tuple(w["roles"]) for w in workers} == (
        {"actor_pool": ("ActorRollout", "RefPolicy"), "critic_pool": ("Critic",)} if algo == "ppo" else {"actor_pool": ("ActorRollout", "RefPolicy")})


def test_ray_worker_group_of_two_matches_accelerate_ddp(tmp_path):
    "A pool of 2 Ray workers (gloo process group, one shard each) logs what 2 accelerate DDP processes log, ends with their weights."
    ddp = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")]
    run(cli("ppo", tmp_path / "ddp", "--max_steps", 2)[1:], prefix=ddp)
    run(cli("ppo", tmp_path / "ray", "--max_steps", 2, "--placement", "ray", "--resource_pools", "dp_pool=2",
            "--role_pools", "ActorRolloutRef=dp_pool,Critic=dp_pool"))
    a, b = metrics(tmp_path / "ddp"), metrics(tmp_path / "ray")
    assert len(a) == 2 and a == b, [(k, x[k], y.get(k)) for x, y in zip(a, b) for k in x if x[k] != y.get(k)][:10]
    assert_moving(a)
    assert len(json.loads((tmp_path / "ray" / "ray_workers.json").read_text())) == 2
    ddp_s, ray_s = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("ddp", "ray"))
    assert (ddp_s["world_size"], ray_s["world_size"]) == (2, 2)                          # the pool's workers
    # hashed on each Ray worker (actor + critic, as each DDP process hashes its copy): the same two checksums
    assert ray_s["ranks_identical"] and ray_s["param_checksums"] == ddp_s["param_checksums"] and len(ray_s["param_checksums"]) == 2


def test_killed_ray_worker_stops_the_driver_and_resume_reproduces_the_run(tmp_path):
    "SIGKILL to the critic's Ray worker mid-run: one line naming role and pool, no half-written checkpoint, then `latest`."
    n, args = 6, ["--save_steps", 2, "--save_total_limit", 5]
    ref = subprocess.Popen(cli("ppo", tmp_path / "ref", "--max_steps", n, *args), env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cmd = cli("ppo", tmp_path / "ray", "--max_steps", n, *args, "--placement", "ray", *SPLIT["ppo"])
    cmd.insert(cmd.index("--"), "--step_sleep"); cmd.insert(cmd.index("--"), "1.0")
    p = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, deadline = tmp_path / "ray", time.time() + TIMEOUT
    while time.time() < deadline and p.poll() is None:
        if (out / "checkpoint-2" / "trainer_state.json").exists() and (out / "metrics.jsonl").exists() and len(metrics(out)) >= 3: break
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before it could be interrupted"
    critic = next(w for w in json.loads((out / "ray_workers.json").read_text()) if w["pool"] == "critic_pool")
    os.kill(critic["pid"], signal.SIGKILL)
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 2, err[-3000:]
    errors = [l.split("]")[-1].strip() for l in err.replace("\r", "\n").splitlines() if "error:" in l]    # past the progress bar
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith("rlhf-nb ppo: error: Ray worker of role Critic on pool 'critic_pool'") and f"pid {critic['pid']}" in errors[0], errors
    done = sorted(int(c.name.split("-")[1]) for c in out.glob("checkpoint-*"))
    assert done and all((out / f"checkpoint-{s}" / "trainer_state.json").exists() for s in done) and max(done) < n
    assert len(metrics(out)) < n
    run(cmd + ["--resume_from_checkpoint", "latest"])
    assert ref.wait(timeout=TIMEOUT) == 0, ref.stderr.read()[-3000:]
    a, b = metrics(tmp_path / "ref"), metrics(out)
    assert len(a) == n and a == b, [(k, x[k], y.get(k)) for x, y in zip(a, b) for k in x if x[k] != y.get(k)][:10]


def test_reinforce_pp_whitens_over_every_process(tmp_path):
    "REINFORCE++'s whitening under DDP x2 uses the statistics of the global batch, not of each rank's half."
    ddp = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")]
    r = run([str(Path(__file__).with_name("_whiten_worker.py")), str(tmp_path / "o")], prefix=ddp)
    assert "global whitening ok" in r.stdout, r.stdout + r.stderr[-2000:]

"""Two Ray nodes on one host (`rlhf_nb.nodes.LocalCluster`): pools pinned to nodes, a pool of two trainer workers,
metrics equal to the colocate placement under 2 DDP processes; the second node lost mid-run, then resumed on a fresh one.

One cluster (node_a: the head, node_b: the second node) serves the module; it is shut down at the end and no process
of it may remain. Runs are fresh processes of the CLI's entry point (`tests/_resume_worker.py`, a dense arithmetic
reward, one torch thread each) that join the cluster with `--ray_address`. Metrics are compared without `time/` keys."""
import json, os, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from _worker_env import ROOT, worker_env

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from rlhf_nb.nodes import LocalCluster

WORKER = Path(__file__).with_name("_resume_worker.py")
ENV = worker_env()
TIMEOUT = 300
DDP = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU layouts; GPU runs are in the notebook's gpu cells")

COMMON = ["--max_completion_length", 4, "--arith_train_size", 16, "--eval_steps", 0, "--fast_paths", "false",
          "--ray_cpus_per_worker", 1]
ARGS = {"ppo": ["--per_device_train_batch_size", 2, "--mini_batch_size", 1, "--critic", "separate"],
        "grpo": ["--per_device_train_batch_size", 1, "--num_generations", 4, "--filter_groups", "false"]}
NODES = {"ppo": ["--resource_pools", "actor_pool=2@node_a,critic_pool=2@node_b",
                 "--role_pools", "ActorRolloutRef=actor_pool,Critic=critic_pool"],
         "grpo": ["--resource_pools", "actor_pool=2@node_b", "--role_pools", "ActorRolloutRef=actor_pool"]}


@pytest.fixture(scope="module")
def cluster():
    """Two nodes for the module; at the end every process of the cluster must be gone. A local cluster is started and
    stopped first, as an earlier test in this process may have done: Ray then turns token authentication on for every
    cluster this process starts, and the runs below must join with the cluster's `env` (without it they are refused)."""
    from rlhf_nb.placement import start_ray
    if "RAY_AUTH_MODE" not in os.environ: start_ray(None, 1).shutdown()
    c = LocalCluster({"node_a": 4, "node_b": 4})
    yield c
    left = c.shutdown()
    assert not left, f"processes of the cluster left behind: {left}"


def cli(algo, out, *extra):
    return [sys.executable, str(WORKER), "--", algo, "--output_dir", str(out), *map(str, ARGS[algo] + COMMON), *map(str, extra)]


def start(cmd, prefix=(), cluster=None):
    "A worker subprocess; one that joins `cluster` runs with its authentication mode."
    env = {**ENV, **(cluster.env if cluster else {})}
    return subprocess.Popen([*prefix, *cmd], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def ok(p):
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, err[-3000:]


def metrics(out):
    rows = [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def differ(a, b, tol=1e-5):
    "The (step, key, a, b) that differ by more than `tol` (or exist in one row only)."
    return [(x.get("step"), k, x.get(k), y.get(k)) for x, y in zip(a, b) for k in set(x) | set(y)
            if not (isinstance(x.get(k), (int, float)) and isinstance(y.get(k), (int, float)) and abs(x[k] - y[k]) <= tol)
            and x.get(k) != y.get(k)]


def test_a_run_without_the_clusters_token_mode_is_refused_in_one_line(cluster, tmp_path):
    """The cluster asks for a token; a run that joins it with RAY_AUTH_MODE unset is refused by Ray. The CLI says which
    setting to change in one line, exit status 2 (the tests below join with the cluster's `env`)."""
    if cluster.env["RAY_AUTH_MODE"] != "token": pytest.skip("this cluster runs without token authentication")
    env = {k: v for k, v in ENV.items() if k != "RAY_AUTH_MODE"}
    cmd = cli("grpo", tmp_path / "ray", "--max_steps", 1, "--placement", "ray", "--ray_address", cluster.address, *NODES["grpo"])
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    errors = [l for l in p.stderr.splitlines() if l.startswith("rlhf-nb grpo: error:")]     # Ray logs its retries too
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-3000:]
    assert f"the Ray cluster at {cluster.address} asks for an authentication token" in errors[0], errors
    assert "set RAY_AUTH_MODE=token" in errors[0], errors


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_two_nodes_match_colocate(cluster, tmp_path, algo):
    """PPO: actor+ref (2 workers) on node_a, critic (2 workers) on node_b; GRPO: actor+ref (2 workers) on node_b, the
    driver beside the head. Both against the colocate placement in 2 DDP processes: 2 steps, every metric within 1e-5."""
    ref = start(cli(algo, tmp_path / "colocate", "--max_steps", 2)[1:], prefix=DDP)
    ray_run = start(cli(algo, tmp_path / "ray", "--max_steps", 2, "--placement", "ray", "--ray_address", cluster.address,
                        *NODES[algo]), cluster=cluster)
    ok(ray_run); ok(ref)
    a, b = metrics(tmp_path / "colocate"), metrics(tmp_path / "ray")
    assert len(a) == 2 and len(b) == 2 and not differ(a, b), differ(a, b)[:10]
    assert len({r["score/mean"] for r in a}) > 1 and all(r["actor/grad_norm"] > 0 for r in a), a
    workers = json.loads((tmp_path / "ray" / "ray_workers.json").read_text())
    assert sorted((w["pool"], w["rank"]) for w in workers) == sorted((p, r) for p in {w["pool"] for w in workers} for r in (0, 1))
    for w in workers:                                   # each worker really ran on the node its pool names
        node = "node_b" if algo == "grpo" or w["pool"] == "critic_pool" else "node_a"
        assert (w["node"], w["node_id"]) == (node, cluster.node_id(node)), w


def test_rollout_pool_on_the_other_node_matches_colocate(cluster, tmp_path):
    """GRPO one step off (max_staleness 1): the actor on node_a, the Rollout pool on node_b (new weights reach it through
    Ray's object store every step) against the colocate placement's sampler thread: 3 steps, every metric within 1e-5."""
    extra = ["--max_steps", 3, "--max_staleness", 1, "--per_device_train_batch_size", 2]
    ref = start(cli("grpo", tmp_path / "colocate", *extra))
    ray_run = start(cli("grpo", tmp_path / "ray", *extra, "--placement", "ray", "--ray_address", cluster.address,
                        "--resource_pools", "actor_pool=1@node_a,rollout_pool=1@node_b",
                        "--role_pools", "ActorRolloutRef=actor_pool,Rollout=rollout_pool"), cluster=cluster)
    ok(ray_run); ok(ref)
    a, b = metrics(tmp_path / "colocate"), metrics(tmp_path / "ray")
    assert len(a) == 3 and not differ(a, b), differ(a, b)[:10]
    assert [r["staleness/max"] for r in b] == [0, 1, 1] and a[-1]["score/mean"] != a[0]["score/mean"]
    nodes = {w["pool"]: w["node_id"] for w in json.loads((tmp_path / "ray" / "ray_workers.json").read_text())}
    assert nodes == {"actor_pool": cluster.node_id("node_a"), "rollout_pool": cluster.node_id("node_b")}


def test_lost_node_stops_the_run_and_a_fresh_node_resumes_it(cluster, tmp_path):
    """node_b's raylet killed mid-run (the critic's node): one line naming the node and its role, exit status 2, every
    checkpoint complete; resumed from `latest` after a fresh node_b joined, the run equals one never interrupted."""
    n, args = 5, ["--max_steps", 5, "--save_steps", 2, "--save_total_limit", 5]
    split = ["--resource_pools", "actor_pool=1@node_a,critic_pool=1@node_b", "--role_pools", "ActorRolloutRef=actor_pool,Critic=critic_pool"]
    ref = start(cli("ppo", tmp_path / "ref", *args))
    out = tmp_path / "ray"
    cmd = cli("ppo", out, *args, "--placement", "ray", "--ray_address", cluster.address, *split)
    cmd[cmd.index("--"):cmd.index("--")] = ["--step_sleep", "0.5"]
    p = start(cmd, cluster=cluster)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and p.poll() is None:
        if (out / "checkpoint-2" / "trainer_state.json").exists() and (out / "metrics.jsonl").exists() and len(metrics(out)) >= 3: break
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before its node could be lost"
    cluster.kill("node_b")
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 2, err[-3000:]
    errors = [l.split("]")[-1].strip() for l in err.replace("\r", "\n").splitlines() if "error:" in l]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith("rlhf-nb ppo: error: Ray worker of role Critic on pool 'critic_pool' on node 'node_b'"), errors
    done = sorted(int(c.name.split("-")[1]) for c in out.glob("checkpoint-*"))
    assert done and all((out / f"checkpoint-{s}" / "trainer_state.json").exists() for s in done) and max(done) < n
    cluster.add("node_b", 4)
    ok(start(cmd + ["--resume_from_checkpoint", "latest"], cluster=cluster))
    ok(ref)
    a, b = metrics(tmp_path / "ref"), metrics(out)
    assert len(a) == n and a == b, differ(a, b, 0)[:10]

"""Two Ray nodes on one host: who runs where, per-phase times and bytes moved per step.

    python bench/nodes.py                        # small default (a few minutes on 2 busy CPU cores): 4 steps per layout
    python bench/nodes.py --steps 20 --batch 8 --completion 32     # full size

Two layouts, each on a fresh `rlhf_nb.nodes.LocalCluster` (node_a: the head, node_b: the second node), the driver in
this process beside the head, the tiny default model, placement ray:

    ppo_split     PPO, actor + reference on actor_pool=2@node_a (two data-parallel workers, gloo), critic on
                  critic_pool=2@node_b
    grpo_rollout  GRPO one step off (max_staleness 1): actor + reference on actor_pool=1@node_a, the sampler on
                  rollout_pool=1@node_b; the new weights reach node_b through Ray's object store after every step

`rlhf_nb.nodes.PhaseTrace` records every call the driver makes to a pool (phase, pool, rank, node, seconds on the
worker, pickled bytes sent and returned). Per layout the json keeps the traced steps after the first (start-up left
out): the per-(phase, pool) table of each step, the timeline bars (PPO: the median step; GRPO: two steps with the
sampler's calls between them), the logged `time/*` of each step, and
two figures computed from the model's size, not traced: the bytes of one copy of the policy's weights (the object-store
transfer to the Rollout pool per step) and the gradient bytes each worker of a pool of n moves in one ring all-reduce
(2 (n-1)/n x the trainable parameters' bytes, per backward). Results: bench/results_nodes.{json,md}.
"""
from __future__ import annotations
import argparse, json, os, statistics, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("TQDM_DISABLE", "1"); os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from rlhf_nb.nodes import LocalCluster, PhaseTrace, phase_table, trace_bars     # noqa: E402

LAYOUTS = {
    "ppo_split": ["ppo", "--critic", "separate", "--resource_pools", "actor_pool=2@node_a,critic_pool=2@node_b",
                  "--role_pools", "ActorRolloutRef=actor_pool,Critic=critic_pool"],
    "grpo_rollout": ["grpo", "--max_staleness", "1", "--num_generations", "4", "--resource_pools",
                     "actor_pool=1@node_a,rollout_pool=1@node_b", "--role_pools", "ActorRolloutRef=actor_pool,Rollout=rollout_pool"],
}


def weight_bytes(out):
    "Bytes of the policy's parameters, read from the run's final weights (float32 on CPU)."
    from safetensors import safe_open
    files = sorted(Path(out).rglob("model.safetensors"))
    total = 0
    with safe_open(str(files[-1]), "pt") as f:
        for k in f.keys(): t = f.get_tensor(k); total += t.numel() * t.element_size()
    return total


def run_layout(name, a, root):
    "One traced run of layout `name` on a fresh two-node cluster -> its json entry."
    from rlhf_nb import launch
    out = root / name
    argv = [*LAYOUTS[name][:1], "--output_dir", str(out), "--max_steps", str(a.steps), "--per_device_train_batch_size",
            str(a.batch), "--max_completion_length", str(a.completion), "--eval_steps", "0", "--placement", "ray",
            "--ray_cpus_per_worker", "1", "--save_steps", str(a.steps), *LAYOUTS[name][1:]]
    t0 = time.perf_counter()
    with LocalCluster({"node_a": 4, "node_b": 4}) as c:
        argv += ["--ray_address", c.address]
        with PhaseTrace() as trace: rc = launch.main(argv)
    assert rc == 0, f"{name}: exit status {rc}"
    steps = trace.steps[1:] or trace.steps
    mid = sorted(steps, key=lambda s: s["times"].get("time/step", 0))[len(steps) // 2]
    if name == "grpo_rollout":                          # two steps after the first: the sampler's calls run between them
        origin = steps[0]["at"]
        window = [c for s in steps[:2] for c in s["calls"] if c["at"] >= origin]
        bars = trace_bars(window, origin)
    else: bars = trace_bars(mid["calls"])
    wb = weight_bytes(out)
    n = 2 if name == "ppo_split" else 1
    return {"argv": argv[:-2], "wall_seconds": time.perf_counter() - t0, "weight_bytes": wb,
            "allreduce_bytes_per_worker": int(2 * (n - 1) / n * wb), "workers_per_pool": n,
            "steps": [{"times": s["times"], "table": [{"phase": p, "pool": q, **row} for (p, q), row in phase_table(s["calls"]).items()]}
                      for s in steps],
            "bars": bars, "median_step_times": mid["times"]}


def markdown(res):
    "The results table: per layout, the median over steps of each phase's slowest worker and its bytes."
    lines = ["# Two Ray nodes on one host", "", f"`{res['command']}` ({res['when']})", ""]
    for name, r in res["layouts"].items():
        lines += [f"## {name}", "", f"weights {r['weight_bytes'] / 1e6:.2f} MB per copy; ring all-reduce per backward per worker "
                  f"{r['allreduce_bytes_per_worker'] / 1e6:.2f} MB (pool of {r['workers_per_pool']}); "
                  f"median step {statistics.median(s['times'].get('time/step', 0) for s in r['steps']):.3f} s", "",
                  "| phase | pool | node | workers | seconds (median) | bytes sent | bytes returned |", "|---|---|---|---|---|---|---|"]
        rows = {}
        for s in r["steps"]:
            for t in s["table"]: rows.setdefault((t["phase"], t["pool"]), []).append(t)
        for (p, q), ts in rows.items():
            lines.append(f"| {p} | {q} | {ts[0]['node']} | {ts[0]['workers']} | {statistics.median(t['seconds'] for t in ts):.3f} | "
                         f"{int(statistics.median(t['sent'] for t in ts))} | {int(statistics.median(t['returned'] for t in ts))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4); ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--completion", type=int, default=8); ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--work", default=str(HERE / "_work" / "nodes"))
    a = ap.parse_args(argv)
    import shutil
    shutil.rmtree(a.work, ignore_errors=True)
    res = {"command": " ".join(["python bench/nodes.py", *(argv if argv is not None else sys.argv[1:])]),
           "when": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
           "layouts": {name: run_layout(name, a, Path(a.work)) for name in LAYOUTS}}
    Path(a.out, "results_nodes.json").write_text(json.dumps(res, indent=1))
    Path(a.out, "results_nodes.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()

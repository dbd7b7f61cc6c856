"""Asynchronous training on Ray against synchronous training on the same pools, on this machine, in one run.

    python bench/async_ray.py                  # 60 GRPO steps from the SFT start, max_staleness 0 and 1, seeds 0 and 1
    python bench/async_ray.py --steps 20 --seeds 0

Both arms place the same two Ray workers, one CPU each: the actor (trainer) pool and a Rollout (sampler) pool
(`resource_pools trainer=1,sampler=1`, `role_pools ActorRollout=trainer,Rollout=sampler`). With `max_staleness: 0`
the sampler samples each batch with the weights of the step before while the trainer waits (synchronous, split);
with `max_staleness: 1` it samples the next batch while the trainer trains (one-step-off). Each arm is a fresh
process with its own local Ray cluster; the first two steps are warm-up and not timed. The work is the demo's: the
~1M-parameter model from the cached SFT start (`bench/_work/sft_arith`, as `bench/rollout_engines.py --curve` uses),
16 prompts x 8 completions x 16 new tokens, GRPO with the demo's learning rate, held-out greedy accuracy on 256
prompts at the start and the end.

From the synchronous arm: T_gen = the trainer's wait for each batch (sampling, its weight load and the reward),
T_train = the rest of the step; the ideal one-step-off time is max(T_gen, T_train), a ratio of
max(T_gen, T_train) / (T_gen + T_train) to the synchronous time. Results: bench/results_async.json and .md.
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP = 2


def arm(staleness, steps, seed, sft_dir, objective="decoupled"):
    "One GRPO run on the Ray split with `max_staleness` = `staleness`: per-step timings and the held-out accuracy."
    from rlhf_nb.algos import GRPOConfig, rl_trainer_class
    cfg = GRPOConfig(model_name_or_path=sft_dir, max_steps=steps, eval_steps=steps, seed=seed, learning_rate=2e-4, kl_coef=0.0,
                     ref_strategy="none", max_staleness=staleness, off_policy_objective=objective if staleness else "decoupled", placement="ray",
                     resource_pools="trainer=1,sampler=1", role_pools="ActorRollout=trainer,Rollout=sampler", ray_num_cpus=2,
                     output_dir=tempfile.mkdtemp(prefix=f"bench_async_{staleness}_"), disable_tqdm=True, save_final=False, report_to="none")
    trainer = rl_trainer_class(cfg)(cfg)
    try: hist = trainer.fit()
    finally: trainer.placement.shutdown()
    rows = [h for h in hist if "time/step" in h]
    timed = rows[WARMUP:]
    evals = [(h["step"], h["eval/accuracy"]) for h in hist if "eval/accuracy" in h]
    mean = lambda k: statistics.mean(r[k] for r in timed)
    return {"max_staleness": staleness, "objective": objective if staleness else "-", "seed": seed, "steps": steps, "step_s": mean("time/step"), "trainer_wait_s": mean("time/trainer_wait"),
            "sampler_wait_s": mean("time/sampler_wait"), "staleness_max": max(r["staleness/max"] for r in rows),
            "kl_prox_behav": statistics.mean(r.get("sampling/kl_prox_behav", 0.0) for r in rows),
            "acc_start": evals[0][1], "acc_final": evals[-1][1], "seconds": hist[-1].get("time/elapsed")}


def run_arm(**kw):
    "One arm in a fresh process -> its result."
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "RAY_AUTH_MODE": "disabled"}
    r = subprocess.run([sys.executable, __file__, "--arm", json.dumps(kw)], capture_output=True, text=True, env=env, timeout=3000)
    lines = [l for l in r.stdout.splitlines() if l.startswith("ARM ")]
    if r.returncode or not lines: raise RuntimeError(f"arm {kw} failed:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][4:])


def summarise(rows):
    "Per staleness: medians over seeds; the synchronous arm's T_gen/T_train and the ideal ratio; the measured ratio."
    by = {s: [r for r in rows if r["max_staleness"] == s] for s in sorted({r["max_staleness"] for r in rows})}
    med = lambda s, k: statistics.median(r[k] for r in by[s])
    t_gen = med(0, "trainer_wait_s"); t_train = med(0, "step_s") - t_gen
    out = {"t_gen_s": t_gen, "t_train_s": t_train, "ideal_ratio": max(t_gen, t_train) / (t_gen + t_train),
           "ideal_speedup": (t_gen + t_train) / max(t_gen, t_train)}
    for s in by:
        out[f"step_s_{s}"] = med(s, "step_s"); out[f"acc_final_{s}"] = statistics.mean(r["acc_final"] for r in by[s])
    if 1 in by:
        out["measured_ratio"] = out["step_s_1"] / out["step_s_0"]
        out["acc_diff_points"] = 100 * (out["acc_final_1"] - out["acc_final_0"])
    return out


def table(rows, cols):
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    return "\n".join(out + ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm"); ap.add_argument("--steps", type=int, default=60); ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--objective", default="bypass", help="the max_staleness 1 arm's loss: bypass (the default of an asynchronous run) or decoupled (no correction with the hf engine)")
    ap.add_argument("--reuse_sync", help="a results json whose synchronous rows (same steps, seeds) are kept: run only the asynchronous arm")
    a = ap.parse_args()
    if a.arm: print("ARM " + json.dumps(arm(**json.loads(a.arm))), flush=True); return
    from rlhf_nb.sft import sft_warm_start
    sft = str(sft_warm_start(str(HERE / "_work/sft_arith"), seed=0, progress=False))
    load0, t0 = os.getloadavg()[0], time.time()
    old = json.loads(Path(a.reuse_sync).read_text())["rows"] if a.reuse_sync else []
    keep = [r for r in old if r["max_staleness"] == 0 and r["steps"] == a.steps and str(r["seed"]) in a.seeds.split(",")]
    rows = keep + [run_arm(staleness=s, steps=a.steps, seed=int(seed), sft_dir=sft, objective=a.objective)
                   for seed in a.seeds.split(",") for s in ((1,) if keep else (0, 1))]
    for r in rows: r.setdefault("objective", "decoupled" if r["max_staleness"] else "-")
    summary = summarise(rows)
    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "load_before": load0, "load_after": os.getloadavg()[0],
           "wall_s": time.time() - t0, "rows": rows, "summary": summary}
    (HERE / "results_async.json").write_text(json.dumps(res, indent=1))
    md = [f"# Asynchronous GRPO on Ray against synchronous, same two workers ({res['date']}, {res['cpus']} CPUs)", "",
          f"Load average before / after: {load0:.2f} / {res['load_after']:.2f}. {a.steps} steps per arm (the first {WARMUP} not timed), "
          "16 prompts x 8 completions x 16 tokens, the ~1M demo model from the SFT start; pools trainer=1, sampler=1 (one CPU each).", "",
          table(rows, ["max_staleness", "objective", "seed", "step_s", "trainer_wait_s", "sampler_wait_s", "staleness_max", "kl_prox_behav", "acc_start", "acc_final"]), "",
          "## Summary (medians over seeds; accuracy: mean)", "", table([summary], list(summary)), "",
          f"One-step-off takes **{summary.get('measured_ratio', float('nan')):.2f}x** the synchronous time per step (target <= 0.75); "
          f"the ideal from the synchronous arm's T_gen = {summary['t_gen_s']:.3f} s and T_train = {summary['t_train_s']:.3f} s is "
          f"{summary['ideal_ratio']:.2f}x (a speed-up of {summary['ideal_speedup']:.2f}). Final held-out accuracy differs by "
          f"{summary.get('acc_diff_points', float('nan')):+.1f} points (one-step-off minus synchronous; target within 3)."]
    (HERE / "results_async.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__": main()

"""A black-box agent learns as the built-in agent loop does: GRPO on the calculator task, both arms from the same warm
start, with the same seed and the same number of steps.

    python bench/blackbox_agent.py                       # full size: 48 steps, held-out eval of 200 problems every 8
    python bench/blackbox_agent.py --steps 24 --seeds 0 1 2      # three RL seeds from the one warm start; the means compared
    python bench/blackbox_agent.py --steps 16 --eval_steps 8 --eval_size 100      # a small run
    python bench/blackbox_agent.py --only blackbox       # one arm (builtin | blackbox); the other is read back from the json
    python bench/blackbox_agent.py --report              # rewrite the table from the json

`builtin` is `configs/grpo_calc.yaml` (the calculator environment, the agent loop of `rlhf_nb.agents`). `blackbox` is
the same config without the environment and with `agent_function: rlhf_nb.endpoint:calculator_agent`: the same task
written as a plain function that talks to the policy with the `openai` SDK through the endpoint of
`rlhf_nb.endpoint`, and returns the task's reward. Both start from one warm start on the calculator demonstrations
(`calc_warm_start`, as `bench/tool_use.py` builds it), run exactly `--steps` steps (no time budget) and evaluate greedily
on the same held-out problems (`make_calc`'s test split), each through its own agent. The result: the held-out
accuracy of each arm at every evaluation and the largest gap between them (the target: within 5 points). With several
`--seeds` (each seed: the RL run's sampling and data order; the warm start is seed 0's for all), the gap is taken
between the arms' mean curves, and each seed's own gap is listed beside the gap between two seeds of the same arm.
Results: bench/results_blackbox_agent.{json,md}.
"""
from __future__ import annotations
import argparse, json, os, shutil, subprocess, sys, time
from pathlib import Path
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tool_use import HERE, ROOT, rows                                     # the calculator bench's paths and log reader

WORK = HERE / "_work" / "blackbox_agent"
ARMS = {"builtin": "the built-in agent loop (environment: calculator)",
        "blackbox": "a black-box openai-SDK agent through the endpoint (agent_function)"}


def arm_config(name, warm, a):
    "The run config of arm `name`: grpo_calc.yaml from warm start `warm`, exactly `a.steps` steps."
    cfg = yaml.safe_load((ROOT / "configs" / "grpo_calc.yaml").read_text())
    for k in ("warm_start_dir", "warm_start_demos", "warm_start_steps", "max_seconds"): cfg.pop(k, None)
    cfg.update(model_name_or_path=str(warm), max_steps=a.steps, eval_steps=a.eval_steps, eval_size=a.eval_size, seed=a.seed,
               data_seed=a.seed, output_dir="run")
    if name == "blackbox":
        cfg.pop("environment"); cfg.pop("max_tool_calling_iterations")    # calculator_agent stops after 2 rounds of calls too
        cfg["agent_function"] = "rlhf_nb.endpoint:calculator_agent"
    return cfg


def run_arm(name, warm, a):
    "Run one arm in a fresh folder; -> its summary (seconds, evaluation curve, reward curve)."
    folder = WORK / f"seed{a.seed}" / name
    shutil.rmtree(folder, ignore_errors=True); folder.mkdir(parents=True)
    (folder / "run.yaml").write_text(yaml.safe_dump(arm_config(name, warm, a)))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "RLHF_NB_CACHE": str(WORK / "cache")}
    t0 = time.time()
    with open(folder / "log.txt", "w") as log:
        subprocess.run(["rlhf-nb", "grpo", "--config", "run.yaml", "--disable_tqdm", "true"], cwd=folder, env=env, check=True,
                       stdout=log, stderr=subprocess.STDOUT)
    m = rows(folder / "run" / "metrics.jsonl")
    evals = [(r["step"], r["eval/accuracy"]) for r in m if "eval/accuracy" in r]
    score = [(r["step"], r["score/mean"]) for r in m if "score/mean" in r]
    return {"seconds": round(time.time() - t0, 1), "steps": max(r["step"] for r in m), "eval": evals,
            "start_accuracy": evals[0][1], "final_accuracy": evals[-1][1], "score": score,
            "turns": [(r["step"], r["num_turns/mean"]) for r in m if "num_turns/mean" in r],
            "agent_failures": sum(r.get("agent/failures", 0) for r in m)}


def max_gap(x, y):
    "Largest |x - y| in points over the steps both evaluation curves share."
    same = dict(y)
    gaps = [abs(acc - same[s]) for s, acc in x if s in same]
    return round(100 * max(gaps), 1) if gaps else None


def mean_curve(curves):
    "The pointwise mean of evaluation curves at the steps all of them share."
    steps = sorted(set.intersection(*[{s for s, _ in c} for c in curves]))
    return [(s, sum(dict(c)[s] for c in curves) / len(curves)) for s in steps]


def write_table(res, path):
    lines = ["| seed | arm | steps | seconds | held-out accuracy at start | at end | eval curve (step: accuracy) |", "|---|---|---|---|---|---|---|"]
    ordered = dict(sorted(res["runs"].items(), key=lambda kv: int(kv[0])))
    runs = {k: v for k, v in ordered.items() if {"builtin", "blackbox"} <= set(v["arms"])}           # seeds with both arms
    for seed, run in ordered.items():
        for k, r in run["arms"].items():
            curve = ", ".join(f"{s}: {acc:.3f}" for s, acc in r["eval"])
            lines.append(f"| {seed} | {k}: {ARMS[k]} | {r['steps']} | {r['seconds']:.0f} | {r['start_accuracy']:.3f} | {r['final_accuracy']:.3f} | {curve} |")
    if runs:
        means = {k: mean_curve([run["arms"][k]["eval"] for run in runs.values()]) for k in ARMS}
        res["max_gap_points"] = max_gap(means["blackbox"], means["builtin"])
        res["seed_gaps_points"] = {seed: max_gap(run["arms"]["blackbox"]["eval"], run["arms"]["builtin"]["eval"]) for seed, run in runs.items()}
        seeds = list(runs)
        res["same_arm_gaps_points"] = {f"builtin {a} vs {b}": max_gap(runs[a]["arms"]["builtin"]["eval"], runs[b]["arms"]["builtin"]["eval"])
                                       for i, a in enumerate(seeds) for b in seeds[i + 1:]}
        lines += ["", "| mean over seeds " + ", ".join(seeds) + " (columns: step) | " + " | ".join(f"{s}" for s, _ in means["builtin"]) + " |",
                  "|---|" + "---|" * len(means["builtin"])]
        lines += [f"| {k} | " + " | ".join(f"{acc:.3f}" for _, acc in means[k]) + " |" for k in ARMS]
        b, x = means["builtin"], means["blackbox"]
        lines += ["", f"Largest gap between the arms' mean held-out accuracy at equal steps: **{res['max_gap_points']} points** "
                  f"(target: within 5). Gain over the start (means): built-in {100 * (b[-1][1] - b[0][1]):+.1f}, black-box "
                  f"{100 * (x[-1][1] - x[0][1]):+.1f} points. Largest gap per seed: "
                  + ", ".join(f"seed {k}: {v}" for k, v in res["seed_gaps_points"].items())
                  + (". Between two seeds of the built-in arm (run-to-run noise): " + ", ".join(f"{k}: {v}" for k, v in res["same_arm_gaps_points"].items()) if res["same_arm_gaps_points"] else "")
                  + f" points. Settings: {res['settings']}."]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=48); p.add_argument("--eval_steps", type=int, default=8)
    p.add_argument("--eval_size", type=int, default=200); p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--only", choices=list(ARMS)); p.add_argument("--report", action="store_true")
    a = p.parse_args(argv)
    out = HERE / "results_blackbox_agent.json"
    res = json.loads(out.read_text()) if out.exists() else {}
    res.setdefault("runs", {})
    if not a.report:
        from rlhf_nb.agents import calc_warm_start
        cfg = yaml.safe_load((ROOT / "configs" / "grpo_calc.yaml").read_text())
        warm = calc_warm_start(WORK / "warm", n_demos=cfg["warm_start_demos"], steps=cfg["warm_start_steps"], seed=0)
        settings = {k: getattr(a, k) for k in ("steps", "eval_steps", "eval_size")}
        res["settings"] = settings
        for seed in a.seeds:
            a.seed = seed
            for name in ([a.only] if a.only else list(ARMS)):
                arm = run_arm(name, warm, a)
                old = json.loads(out.read_text()) if out.exists() else {}
                runs = old.get("runs", {}) if old.get("settings") == settings else {}      # arms run beside this one keep theirs; other settings' results are dropped
                runs.setdefault(str(seed), {"arms": {}})["arms"][name] = arm
                res["runs"] = runs
                out.write_text(json.dumps(res, indent=1))
    write_table(res, HERE / "results_blackbox_agent.md")
    out.write_text(json.dumps(res, indent=1))
    print((HERE / "results_blackbox_agent.md").read_text())


if __name__ == "__main__":
    main()

"""Tool use on a 2-core CPU: GRPO with the calculator tool against GRPO without it, on the same step budget.

    python bench/tool_use.py               # both runs (about 10 minutes each here), then the table and the figure
    python bench/tool_use.py --only tool   # one of them (tool | notool); the other is read back from the json
    python bench/tool_use.py --plot_only   # redraw the figure and rewrite the table from the json

`tool` is exactly the README's command, `rlhf-nb grpo --config configs/grpo_calc.yaml`, timed from a cold start in
a fresh folder (preparing the data and the warm start on the demonstrations included). `notool` is the same config
without the environment: its policy is warm-started on the same demonstrations written as direct answers
(`calc_warm_start(use_tool=False)`: same problems, same number of supervised steps), then GRPO samples one answer per
prompt. Both evaluate greedily on the same 200 held-out problems (`make_calc`'s test split) every `eval_steps`.
Results: bench/results_tool_use.json, .md and .png (accuracy against step, and the tool-call and failure rates).
"""
from __future__ import annotations
import argparse, json, os, shutil, subprocess, sys, time
from pathlib import Path
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "_work" / "tool_use"


def rows(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def run_arm(name):
    "Run one arm in a fresh folder; -> its summary (seconds, evaluation curve, tool rates)."
    folder = WORK / name
    shutil.rmtree(folder, ignore_errors=True); folder.mkdir(parents=True)
    cfg = yaml.safe_load((ROOT / "configs" / "grpo_calc.yaml").read_text())
    if name == "notool":
        from rlhf_nb.agents import calc_warm_start
        t0 = time.time()
        cfg["model_name_or_path"] = calc_warm_start(folder / "sft_direct", n_demos=cfg["warm_start_demos"], steps=cfg["warm_start_steps"], use_tool=False)
        warm = time.time() - t0
        for k in ("environment", "max_tool_calling_iterations", "warm_start_dir", "warm_start_demos", "warm_start_steps"): cfg.pop(k)
    (folder / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "RLHF_NB_CACHE": str(folder / "cache")}   # a cold start: nothing cached
    t0 = time.time()
    subprocess.run(["rlhf-nb", "grpo", "--config", "run.yaml", "--disable_tqdm", "true"], cwd=folder, env=env, check=True)
    seconds = time.time() - t0 + (warm if name == "notool" else 0.0)
    m = rows(folder / cfg["output_dir"] / "metrics.jsonl")
    evals = [(r["step"], r["eval/accuracy"]) for r in m if "eval/accuracy" in r]
    train = [r for r in m if "tools/call_frequency" in r or "score/mean" in r]
    return {"seconds": round(seconds, 1), "eval": evals, "start_accuracy": evals[0][1], "final_accuracy": evals[-1][1],
            "best_accuracy": max(a for _, a in evals), "steps": max(r["step"] for r in m),
            "tool_calls": [(r["step"], r.get("tools/call_frequency")) for r in train if "tools/call_frequency" in r],
            "tool_failures": [(r["step"], r.get("tools/failure_frequency")) for r in train if "tools/failure_frequency" in r],
            "score": [(r["step"], r["score/mean"]) for r in train if "score/mean" in r]}


def write_table(res, path):
    lines = ["| run | seconds (all stages) | steps | held-out accuracy at start | at end | best |", "|---|---|---|---|---|---|"]
    for k, r in res["arms"].items():
        lines.append(f"| {k} | {r['seconds']:.0f} | {r['steps']} | {r['start_accuracy']:.3f} | {r['final_accuracy']:.3f} | {r['best_accuracy']:.3f} |")
    if {"tool", "notool"} <= set(res["arms"]):
        t, n = res["arms"]["tool"], res["arms"]["notool"]
        lines += ["", f"With the tool GRPO adds {100 * (t['final_accuracy'] - t['start_accuracy']):+.1f} points over its start and ends "
                  f"{100 * (t['final_accuracy'] - n['final_accuracy']):+.1f} points above GRPO without the tool."]
    path.write_text("\n".join(lines) + "\n")


def plot(res, path):
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, r in res["arms"].items():
        a.plot(*zip(*r["eval"]), marker="o", label={"tool": "GRPO with the calculator", "notool": "GRPO without a tool"}[k])
    a.set(xlabel="step", ylabel="held-out accuracy (greedy)", ylim=(0, 1), title="3-digit multiplication")
    a.legend(); a.xaxis.set_major_locator(MaxNLocator(integer=True))
    if "tool" in res["arms"]:
        r = res["arms"]["tool"]
        b.plot(*zip(*r["tool_calls"]), label="tools/call_frequency (calls per episode)")
        b.plot(*zip(*r["tool_failures"]), label="tools/failure_frequency (failed / calls)")
        b.set(xlabel="step", title="tool use while training"); b.legend(); b.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout(); fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["tool", "notool"]); p.add_argument("--plot_only", action="store_true")
    a = p.parse_args(argv)
    out = HERE / "results_tool_use.json"
    res = json.loads(out.read_text()) if out.exists() else {"arms": {}}
    if not a.plot_only:
        for name in ([a.only] if a.only else ["tool", "notool"]):
            res["arms"][name] = run_arm(name)
            out.write_text(json.dumps(res, indent=1))
    write_table(res, HERE / "results_tool_use.md"); plot(res, HERE / "results_tool_use.png")
    print((HERE / "results_tool_use.md").read_text())


if __name__ == "__main__":
    main()

"""Start-up time of the `rlhf-nb` command line: `--help`, `grpo --help` and a one-step GRPO run, median of several runs.

    python bench/cli_startup.py --before /path/to/an/older/checkout   # both, runs interleaved: before, after, before, ...
    python bench/cli_startup.py --label after                          # this checkout only (PYTHONPATH = the repository)

Interleaving the two checkouts' runs keeps a busy machine's load from favouring either. Each label's medians go to
bench/results_cli.json (other labels kept), the table with ratios to bench/results_cli.md.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ONE_STEP = ["grpo", "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
            "--max_completion_length", "2", "--eval_steps", "0", "--arith_train_size", "4", "--disable_tqdm", "true"]
COMMANDS = {"rlhf-nb --help": ["--help"], "rlhf-nb grpo --help": ["grpo", "--help"], "rlhf-nb grpo (1 step)": ONE_STEP}


def time_once(root, args):
    "Wall seconds of one `python -m rlhf_nb.launch ARGS` with `root` first on PYTHONPATH (a fresh output folder for a run)."
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    extra = ["--output_dir", tempfile.mkdtemp(prefix="cli_bench_")] if args is ONE_STEP else []
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rlhf_nb.launch", *args, *extra], capture_output=True, text=True, env=env, cwd=root)
    if r.returncode != 0: raise SystemExit(f"{args}: status {r.returncode}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def measure(roots, runs):
    "{label: {command: median seconds}} over `runs` runs of each command, the labels' runs interleaved (one warm-up each first)."
    out = {label: {} for label in roots}
    for c, args in COMMANDS.items():
        for root in roots.values(): time_once(root, args)                           # compiles .pyc, warms the page cache
        times = {label: [] for label in roots}
        for _ in range(runs if "step" not in c else max(3, runs // 2)):
            for label, root in roots.items(): times[label].append(time_once(root, args))
        for label in roots: out[label][c] = round(statistics.median(times[label]), 3)
    return out


def table(results):
    "Markdown table of every label's medians, with after/before ratios when both exist."
    labels = list(results)
    rows = ["| command | " + " | ".join(f"{l} (s)" for l in labels) + (" | after / before |" if {"before", "after"} <= set(labels) else " |"),
            "|---" * (len(labels) + 1 + ({"before", "after"} <= set(labels))) + "|"]
    for c in COMMANDS:
        cells = [f"{results[l]['medians'].get(c, float('nan')):.2f}" for l in labels]
        ratio = [f"{results['after']['medians'][c] / results['before']['medians'][c]:.2f}x"] if {"before", "after"} <= set(labels) else []
        rows.append(f"| `{c}` | " + " | ".join(cells + ratio) + " |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="after"); ap.add_argument("--root", default=str(HERE.parent))
    ap.add_argument("--before", default=None, help="an older checkout, measured as 'before', interleaved with this one")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args(argv)
    roots = {"before": Path(a.before), a.label: Path(a.root)} if a.before else {a.label: Path(a.root)}
    out = HERE / "results_cli.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    for label, medians in measure(roots, a.runs).items():
        results[label] = {"root": str(roots[label]), "runs": a.runs, "cpus": os.cpu_count(), "load": os.getloadavg()[0], "medians": medians}
    out.write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "results_cli.md").write_text("# rlhf-nb start-up (median seconds, this machine: %d CPUs)\n\n" % os.cpu_count() + table(results))
    print(table(results))


if __name__ == "__main__":
    main()

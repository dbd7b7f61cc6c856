"""Start-up time of the `rlhf-nb` command line: `--help`, `grpo --help` and a one-step GRPO run, median of several runs.

    python bench/cli_startup.py --label after                     # this checkout (PYTHONPATH = the repository)
    python bench/cli_startup.py --label before --root /path/to/an/older/checkout

Each label's medians go to bench/results_cli.json (other labels kept) and the table with ratios to bench/results_cli.md.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ONE_STEP = ["grpo", "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
            "--max_completion_length", "2", "--eval_steps", "0", "--arith_train_size", "4", "--disable_tqdm", "true"]
COMMANDS = {"rlhf-nb --help": ["--help"], "rlhf-nb grpo --help": ["grpo", "--help"], "rlhf-nb grpo (1 step)": ONE_STEP}


def time_command(root, args, runs):
    "Median wall seconds of `python -m rlhf_nb.launch ARGS` with `root` first on PYTHONPATH (fresh output folder each run)."
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    times = []
    for _ in range(runs):
        extra = ["--output_dir", tempfile.mkdtemp(prefix="cli_bench_")] if args is ONE_STEP else []
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "rlhf_nb.launch", *args, *extra], capture_output=True, text=True, env=env, cwd=root)
        times.append(time.perf_counter() - t0)
        if r.returncode != 0: raise SystemExit(f"{args}: status {r.returncode}\n{r.stderr[-2000:]}")
    return round(statistics.median(times), 3)


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
    ap.add_argument("--label", default="after"); ap.add_argument("--root", default=str(HERE.parent)); ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args(argv)
    out = HERE / "results_cli.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results[a.label] = {"root": a.root, "runs": a.runs, "cpus": os.cpu_count(),
                        "medians": {c: time_command(Path(a.root), args, a.runs if "step" not in c else max(3, a.runs // 2)) for c, args in COMMANDS.items()}}
    out.write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "results_cli.md").write_text("# rlhf-nb start-up (median seconds, this machine: %d CPUs)\n\n" % os.cpu_count() + table(results))
    print(table(results))


if __name__ == "__main__":
    main()

"""Reward-model over-optimisation on a 2-core CPU: `rlhf-nb overopt`, its three files kept as the bench's results.

    python bench/overopt.py                    # the full run (defaults)               -> bench/results_overopt.{json,md,png}
    python bench/overopt.py --quick            # the quick run (about 3 minutes)      -> bench/results_overopt_quick.*
    python bench/overopt.py --from_dir DIR     # keep the files of a run already made with `rlhf-nb overopt --output_dir DIR`
    python bench/overopt.py --from_dir DIR --stem results_overopt_seed1   # ... under another name (a second seed)
    python bench/overopt.py --plot_only        # redraw the figure and rewrite the table from the json

The run is exactly `rlhf-nb overopt [--quick] --output_dir bench/_work/overopt`; this script only times it and copies
overopt.json, overopt.md and overopt.png to the results names. The notebook nbs/04f_overopt.ipynb reads the json.
"""
from __future__ import annotations
import argparse, json, shutil, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the quick run")
    p.add_argument("--from_dir", help="copy the outputs of an existing `rlhf-nb overopt --output_dir DIR` run")
    p.add_argument("--plot_only", action="store_true", help="redraw the figure and the table from the json")
    p.add_argument("--stem", help="the results' file name without extension (default results_overopt[_quick])")
    a = p.parse_args(argv)
    stem = a.stem or ("results_overopt_quick" if a.quick else "results_overopt")
    if a.plot_only:
        from rlhf_nb.overopt import overopt_markdown, plot_overopt
        res = json.loads((HERE / f"{stem}.json").read_text())
        plot_overopt(res, HERE / f"{stem}.png"); (HERE / f"{stem}.md").write_text(overopt_markdown(res))
        return
    src = Path(a.from_dir) if a.from_dir else HERE / "_work" / ("overopt_quick" if a.quick else "overopt")
    if not a.from_dir:
        t = time.time()
        cmd = [sys.executable, "-m", "rlhf_nb.launch", "overopt", "--output_dir", str(src), "--overwrite_output_dir", "true"]
        cmd += ["--quick"] if a.quick else []
        subprocess.run(cmd, check=True, cwd=ROOT)
        print(f"overopt: {time.time() - t:.0f} s", file=sys.stderr)
    for ext in ("json", "md", "png"): shutil.copyfile(src / f"overopt.{ext}", HERE / f"{stem}.{ext}")
    print("\n".join(str(HERE / f"{stem}.{ext}") for ext in ("json", "md", "png")))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Check per-notebook times against the course's budget: every notebook top to bottom in at most 180 s on 2 cores,
the heaviest one in at most 600 s.

Two ways in:
    nbdev_test --timing | tee log; python tools/notebook_budget.py log     # what CI checks: the fast path
    python tools/notebook_budget.py --run --slow [NOTEBOOK ...]            # Run All by hand, slow cells included
`--run` tests one notebook at a time (`nbdev_test --n_workers 1 --timing [--flags slow] --path nbs/X.ipynb`, with
OMP_WAIT_POLICY=PASSIVE), every notebook in nbs/ unless some are named (`02_ppo`, `02_ppo.ipynb` or a path), then
checks the times. Times on a shared machine vary with its load, so an overrun is a loud WARNING, not a failure (pass
--strict to fail); a notebook whose cells fail is always a failure.
"""
import os, re, subprocess, sys, time
from pathlib import Path

EACH, HEAVIEST = 180, 600
ROOT = Path(__file__).resolve().parent.parent

def check(text):
    "(lines to print, whether the budget holds) for nbdev_test --timing output `text`."
    times = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+\.ipynb): (\d+) secs$", text, re.M)}
    if not times: return ["notebook budget: no timings found (nbdev_test prints them only when every notebook passed)"], True
    ranked = sorted(times.items(), key=lambda kv: -kv[1])
    over = [(n, t) for i, (n, t) in enumerate(ranked) if t > (HEAVIEST if i == 0 else EACH)]
    lines = [f"  {n:<28} {t:>4} s" for n, t in ranked]
    verdict = (f"notebook budget: all {len(times)} within {EACH} s (heaviest {ranked[0][0]} {ranked[0][1]} s <= {HEAVIEST} s)"
               if not over else "WARNING notebook budget exceeded: " + ", ".join(f"{n} {t} s" for n, t in over)
               + f" (budget {EACH} s each, {HEAVIEST} s for the heaviest)")
    return lines + [verdict], not over

def notebook_paths(names):
    "The notebooks `names` point to (every nbs/*.ipynb when none); an unknown name exits with one line (status 2)."
    if not names: return sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if p.name != "index.ipynb")
    out = []
    for n in names:
        cands = [Path(n), ROOT / "nbs" / n, ROOT / "nbs" / f"{n}.ipynb"]
        p = next((c for c in cands if c.is_file() and c.suffix == ".ipynb"), None)
        if p is None:
            print(f"notebook_budget: no notebook {n!r} in {ROOT / 'nbs'}", file=sys.stderr); sys.exit(2)
        out.append(p.resolve())
    return out

def run_one(path, slow):
    "Run All of one notebook with nbdev_test: -> (its `name: N secs` line or None when it failed, wall seconds, what failed)."
    cmd = ["nbdev_test", "--n_workers", "1", "--timing", *(["--flags", "slow"] if slow else []), "--path", str(path)]
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, out = time.time() - t0, p.stdout + p.stderr
    m = re.search(rf"^{re.escape(path.name)}: \d+ secs$", out, re.M)
    cells, errors = re.findall(r"^While Executing Cell #(\d+)", out, re.M), re.findall(r"^\w+(?:Error|Exception|Interrupt)\b:? .*$", out, re.M)
    last = (f"cell #{cells[-1]}: " if cells else "") + (errors[-1] if errors else next((l for l in reversed(out.splitlines()) if l.strip()), ""))
    return (m.group(0) if p.returncode == 0 and m else None), wall, last

def run(names, slow):
    "Test each notebook in turn, print its time as it finishes, then the budget's verdict; -> (timing text, failed names)."
    found, failed = [], []
    for path in notebook_paths(names):
        line, wall, last = run_one(path, slow)
        if line: found.append(line)
        else: failed.append(path.name)
        print(line or f"{path.name}: FAILED after {wall:.0f} s: {last}", flush=True)
    return "\n".join(found), failed

if __name__ == "__main__":
    flags = {"--strict", "--run", "--slow"}
    args = [a for a in sys.argv[1:] if a not in flags]
    if "--run" in sys.argv:
        text, failed = run(args, "--slow" in sys.argv)
    else:
        if "--slow" in sys.argv: print("notebook_budget: --slow only applies with --run", file=sys.stderr); sys.exit(2)
        text, failed = (open(args[0]).read() if args else sys.stdin.read()), []
    lines, ok = check(text)
    print("\n".join(lines))
    if failed: print(f"notebook budget: {len(failed)} notebook(s) failed: {', '.join(failed)}")
    sys.exit(1 if failed or (not ok and "--strict" in sys.argv) else 0)

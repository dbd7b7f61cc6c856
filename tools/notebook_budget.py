#!/usr/bin/env python
"""Check the per-notebook times that `nbdev_test --timing` printed against the course's budget.

Budget: every notebook top to bottom in at most 180 s on 2 cores, the heaviest one in at most 600 s. Reads the
`name.ipynb: N secs` lines from a log (or stdin) and prints one table line per notebook and a verdict. Times on a
shared machine vary with its load, so an overrun is a loud WARNING, not a failure (pass --strict to fail).
    nbdev_test --timing | tee log; python tools/notebook_budget.py log
"""
import re, sys

EACH, HEAVIEST = 180, 600

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

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--strict"]
    text = open(args[0]).read() if args else sys.stdin.read()
    lines, ok = check(text)
    print("\n".join(lines))
    sys.exit(0 if ok or "--strict" not in sys.argv else 1)

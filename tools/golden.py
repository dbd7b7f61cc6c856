#!/usr/bin/env python
"""Golden curves (rlhf_nb.golden): regenerate them (--write) or compare fresh runs with the stored ones (--check).

    python tools/golden.py --write            # every run, after an intended change
    python tools/golden.py --write grpo ppo   # some of them
    python tools/golden.py --check            # exit 1 and name each drifted metric
"""
import argparse, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rlhf_nb.golden import GOLDEN_NAMES, check_golden, golden_run, save_golden

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="regenerate and store the curves")
    g.add_argument("--check", action="store_true", help="regenerate and compare with the stored curves")
    ap.add_argument("names", nargs="*", help=f"runs (default: all of {', '.join(GOLDEN_NAMES)})")
    a = ap.parse_args(argv)
    bad = []
    for name in a.names or GOLDEN_NAMES:
        t0 = time.time()
        if a.write: print(f"{name}: wrote {save_golden(name, golden_run(name))} ({time.time() - t0:.1f} s)")
        else:
            msgs = check_golden(name); bad += msgs
            print(f"{name}: {'equal within tolerance' if not msgs else 'DRIFTED'} ({time.time() - t0:.1f} s)")
            for m in msgs: print("  " + m)
    return 1 if bad else 0

if __name__ == "__main__": sys.exit(main())

"""One table over several seeds of `bash bench/rg_learning.sh`: reads each run's report.json (written by
rg_learning_report.py) and writes bench/results_rg_learning_seeds.md.
    python bench/rg_learning_seeds.py runs/rgc_s0 runs/rgc_s1 runs/rgc_s2"""
import json, sys

def row(folder):
    "One markdown table row of the run under `folder`."
    r = json.load(open(f"{folder}/report.json")); g, f, s = r["grpo"], r["sft_first"], r["sft"]
    (_, a0), (_, a1) = g["eval_accuracy"][0], g["eval_accuracy"][-1]
    mix = lambda d: sum(a * n for a, n in d.values()) / sum(n for _, n in d.values())
    st, en = r["per_task_start"], r["per_task_end"]
    sums = next(t for t in st if t != "letter_counting")
    stages = f"{f['steps']} + {s['steps']}" if f else f"{s['steps']}"
    return (f"| `{folder}` | {stages} | {a0:.3f} | {a1:.3f} | **{100 * (a1 - a0):+.1f}** | {g['steps']} in {g['seconds']} s | "
            f"{mix(st):.3f} -> {mix(en):.3f} ({100 * (mix(en) - mix(st)):+.1f}) | {st[sums][0]:.3f} -> {en[sums][0]:.3f} | "
            f"{st['letter_counting'][0]:.3f} -> {en['letter_counting'][0]:.3f} |")

if __name__ == "__main__":
    folders = sys.argv[1:]
    md = ["GRPO on the reasoning-gym mix of `configs/grpo_reasoning_gym.yaml` from an SFT start, one row per seed "
          "(`SEED=S OUT=runs/rgc_sS bash bench/rg_learning.sh`; the same data for every seed, the seed sets SFT's and "
          "GRPO's initialisation and order). SFT steps: on the sums alone, then on the mix. The change is held-out "
          "verifier accuracy on GRPO's 300 evaluation questions from its start to its end (900 s of GRPO, evaluations "
          "included); then greedy accuracy on all 764 held-out questions and per task, SFT start -> GRPO's final policy.", "",
          "| folder | SFT steps | start (300 q.) | end | change, points | GRPO steps | all 764 | sums (260) | letter counts (504) |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [row(f) for f in folders]
    open("bench/results_rg_learning_seeds.md", "w").write("\n".join(md) + "\n")
    print("\n".join(md))

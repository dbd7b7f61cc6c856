"""The report of `bash bench/rg_learning.sh`: held-out accuracy at GRPO's start and end, and per task on every held-out
question for the saved SFT start and GRPO's final policy. Reads the environment the script sets (RESULT, OUT, TASKS,
LOAD0, SFT_SECONDS, RL_SECONDS); the full-size run (RESULT=bench/results_rg_learning.json) also writes
bench/results_rg_learning.md."""
import collections, json, os, torch
from rlhf_nb.data import read_rows
from rlhf_nb.launch import final_model_folder
from rlhf_nb.models import load_causal_lm, load_tokenizer
from rlhf_nb.sft import greedy_accuracy

def per_task(folder, test):
    "{task: (greedy accuracy, n)} of the saved policy `folder` on every held-out row, grouped by task."
    tok, model = load_tokenizer(str(folder)), load_causal_lm(str(folder)).eval()
    groups = collections.defaultdict(list)
    for r in read_rows(test, "rl"): groups[r["extra_info"]["task"]].append(r)
    with torch.no_grad(): return {t: (greedy_accuracy(model, tok, rows)["accuracy"], len(rows)) for t, rows in sorted(groups.items())}

e = os.environ; s = json.load(open(e["RESULT"])); sft = json.load(open(f"{e['OUT']}/sft_summary.json"))
first_file = f"{e['OUT']}/sft_first_summary.json"                  # the first stage (the first task alone)
first = json.load(open(first_file)) if os.path.exists(first_file) else None
(s0, a0), (s1, a1) = s["eval_accuracy"][0], s["eval_accuracy"][-1]
test = f"{e['OUT']}/data/test.parquet"
start, end = per_task(f"{e['OUT']}/sft", test), per_task(final_model_folder(f"{e['OUT']}/grpo"), test)
mix = lambda d: sum(a * n for a, n in d.values()) / sum(n for _, n in d.values())
line = (f"held-out verifier accuracy: {a0:.3f} at the SFT start (step {s0}) -> {a1:.3f} after GRPO "
        f"(step {s1}, {s['seconds']} s): {100 * (a1 - a0):+.1f} points; on all {sum(n for _, n in start.values())} held-out "
        f"questions {mix(start):.3f} -> {mix(end):.3f} ({100 * (mix(end) - mix(start)):+.1f} points)")
print(line)
json.dump({"grpo": s, "sft_first": first, "sft": sft, "per_task_start": start, "per_task_end": end}, open(f"{e['OUT']}/report.json", "w"), indent=1)
if e["RESULT"] == "bench/results_rg_learning.json":              # the full-size run: its report beside the summary
    best = max(s["eval_accuracy"], key=lambda x: x[1])
    load1 = open("/proc/loadavg").read().split()[:3]
    md = [f"GRPO on the reasoning-gym mix `{e['TASKS']}` (rows prepared with `--exact_match`) from an SFT start, tiny model, CPU.", "",
          "| | value |", "|---|---|",
          (f"| SFT start, first stage | {first['steps']} padding-free SFT steps on the first task alone, stopped at held-out "
           f"accuracy {first['eval_accuracy']:.3f} on 200 of its questions |" if first else None),
          f"| SFT start{', second stage' if first else ''} | {sft['steps']} padding-free SFT steps{' on the mix' if first else ''} "
          f"(up to {e['SFT_SECONDS']} s, stops at the target accuracy), held-out accuracy {sft['eval_accuracy']:.3f} on its 200 eval questions |",
          f"| held-out verifier accuracy at GRPO's start | {a0:.3f} (step {s0}, 300 questions) |",
          f"| held-out verifier accuracy at GRPO's end | {a1:.3f} (step {s1}) |",
          f"| change | **{100 * (a1 - a0):+.1f} points** (best {best[1]:.3f} at step {best[0]}) |",
          f"| GRPO steps, seconds | {s['steps']} steps in {s['seconds']} s (bound: {e['RL_SECONDS']} s, evaluations included) |",
          "", "Accuracy every evaluation (step, accuracy): " + ", ".join(f"{k} {v:.3f}" for k, v in s["eval_accuracy"]), "",
          "Every held-out question, per task (greedy; the saved SFT start and GRPO's final policy):", "",
          "| task | questions | SFT start | after GRPO | change |", "|---|---|---|---|---|"]
    md = [l for l in md if l is not None]
    md += [f"| `{t}` | {n} | {start[t][0]:.3f} | {end[t][0]:.3f} | {100 * (end[t][0] - start[t][0]):+.1f} points |" for t, (_, n) in start.items()]
    md += [f"| all | {sum(n for _, n in start.values())} | {mix(start):.3f} | {mix(end):.3f} | {100 * (mix(end) - mix(start)):+.1f} points |", "",
           f"Load (1/5/15-minute) {e['LOAD0']} at the start, {' '.join(load1)} at the end, on 2 cores; the seconds are wall time.", "",
           "Command: `bash bench/rg_learning.sh` (data, SFT start and GRPO under runs/rg_learning/; "
           "the GRPO summary is bench/results_rg_learning.json, the per-task figures runs/rg_learning/report.json)."]
    open("bench/results_rg_learning.md", "w").write("\n".join(md) + "\n")

#!/usr/bin/env bash
# The reasoning-gym learning result: prep the mix of configs/grpo_reasoning_gym.yaml, SFT the tiny model on it,
# then GRPO from that start; prints held-out verifier accuracy at GRPO's start and end (its eval_accuracy list).
#   bash bench/rg_learning.sh                        # full size: SFT up to 600 s, GRPO 900 s (15 minutes)
#   SFT_SECONDS=60 RL_SECONDS=60 bash bench/rg_learning.sh   # a quick check of the commands
#   TASKS=chain_sum:min_terms=3:max_terms=3:max_digits=1,letter_counting:max_words=3 RESULT=runs/x.json bash bench/rg_learning.sh
# The SFT start stops at SFT_TARGET held-out accuracy (0.45: letter_counting's most common answer alone is ~0.7 of its
# questions, so the mix reaches 0.45 only once the arithmetic is partly learned) or after SFT_SECONDS.
# Writes bench/results_rg_learning.json (the GRPO summary; RESULT=... elsewhere); work files under runs/rg_learning/.
set -euo pipefail
cd "$(dirname "$0")/.."
SFT_SECONDS=${SFT_SECONDS:-600}; RL_SECONDS=${RL_SECONDS:-900}; OUT=${OUT:-runs/rg_learning}
RESULT=${RESULT:-bench/results_rg_learning.json}
TASKS=${TASKS:-"basic_arithmetic:min_terms=3:max_terms=3:max_digits=1:operators=+-:allow_parentheses=false:allow_negation=false,letter_counting:min_words=1:max_words=3"}
rm -rf "$OUT"; mkdir -p "$OUT"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
python -m rlhf_nb.launch prep reasoning_gym --task "$TASKS" --n 6000 --n_test "${N_TEST:-600}" --seed 0 --out "$OUT/data"
python -m rlhf_nb.launch sft --dataset "$OUT/data" --n_train 6000 --output_dir "$OUT/sft" --max_seconds "$SFT_SECONDS" \
    --target_accuracy "${SFT_TARGET:-0.45}" --eval_steps 50 --eval_size 200 | tee "$OUT/sft_summary.json"
python -m rlhf_nb.launch grpo --config configs/grpo_reasoning_gym.yaml --model_name_or_path "$OUT/sft" --dataset "$OUT/data" \
    --output_dir "$OUT/grpo" --max_seconds "$RL_SECONDS" | tee "$RESULT"
RESULT="$RESULT" OUT="$OUT" TASKS="$TASKS" LOAD0="$LOAD0" SFT_SECONDS="$SFT_SECONDS" RL_SECONDS="$RL_SECONDS" python - <<'PY'
import json, os
e = os.environ; s = json.load(open(e["RESULT"])); sft = json.load(open(f"{e['OUT']}/sft_summary.json"))
(s0, a0), (s1, a1) = s["eval_accuracy"][0], s["eval_accuracy"][-1]
line = (f"held-out verifier accuracy: {a0:.3f} at the SFT start (step {s0}) -> {a1:.3f} after GRPO "
        f"(step {s1}, {s['seconds']} s): {100 * (a1 - a0):+.1f} points")
print(line)
if e["RESULT"] == "bench/results_rg_learning.json":              # the full-size run: its report beside the summary
    best = max(s["eval_accuracy"], key=lambda x: x[1])
    load1 = open("/proc/loadavg").read().split()[:3]
    md = [f"GRPO on the reasoning-gym mix `{e['TASKS']}` from an SFT start, tiny model, CPU.", "",
          "| | value |", "|---|---|",
          f"| SFT start | {sft['steps']} SFT steps (up to {e['SFT_SECONDS']} s, stops at the target accuracy), "
          f"held-out accuracy {sft['eval_accuracy']:.3f} on its 200 eval questions |",
          f"| held-out verifier accuracy at GRPO's start | {a0:.3f} (step {s0}) |",
          f"| held-out verifier accuracy at GRPO's end | {a1:.3f} (step {s1}) |",
          f"| change | {100 * (a1 - a0):+.1f} points (best {best[1]:.3f} at step {best[0]}) |",
          f"| GRPO steps, seconds | {s['steps']} steps in {s['seconds']} s (bound: {e['RL_SECONDS']} s, evaluations included) |",
          "", "Accuracy every 25 steps (step, accuracy): " + ", ".join(f"{k} {v:.3f}" for k, v in s["eval_accuracy"]), "",
          "The seconds are wall time on a 2-core machine shared with several other jobs at the same time "
          f"(1/5/15-minute load {e['LOAD0']} at the start, {' '.join(load1)} at the end): the 15 minutes are a wall bound "
          "measured under that load, and an idle machine runs more steps in them.", "",
          "Command: `bash bench/rg_learning.sh` (data, SFT start and GRPO under runs/rg_learning/; "
          "the GRPO summary is bench/results_rg_learning.json)."]
    open("bench/results_rg_learning.md", "w").write("\n".join(md) + "\n")
PY

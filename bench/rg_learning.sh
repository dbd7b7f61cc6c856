#!/usr/bin/env bash
# The reasoning-gym learning result: prep the mix of configs/grpo_reasoning_gym.yaml, SFT the tiny model on it,
# then GRPO from that start; prints held-out verifier accuracy at GRPO's start and end (its eval_accuracy list).
#   bash bench/rg_learning.sh                        # full size: SFT up to 300 s, GRPO 900 s (15 minutes)
#   SFT_SECONDS=60 RL_SECONDS=60 bash bench/rg_learning.sh   # a quick check of the commands
# Writes bench/results_rg_learning.json (the GRPO summary) under runs/rg_learning/.
set -euo pipefail
cd "$(dirname "$0")/.."
SFT_SECONDS=${SFT_SECONDS:-300}; RL_SECONDS=${RL_SECONDS:-900}; OUT=${OUT:-runs/rg_learning}
TASKS="basic_arithmetic:max_terms=2:max_digits=2:operators=+-,chain_sum:max_terms=2:max_digits=2"
rm -rf "$OUT"; mkdir -p "$OUT"
python -m rlhf_nb.launch prep reasoning_gym --task "$TASKS" --n 6000 --n_test 300 --seed 0 --out "$OUT/data"
python -m rlhf_nb.launch sft --dataset "$OUT/data" --n_train 6000 --output_dir "$OUT/sft" --max_seconds "$SFT_SECONDS" \
    --target_accuracy 0.3 --eval_steps 50 --eval_size 200
python -m rlhf_nb.launch grpo --config configs/grpo_reasoning_gym.yaml --model_name_or_path "$OUT/sft" --dataset "$OUT/data" \
    --output_dir "$OUT/grpo" --max_seconds "$RL_SECONDS" | tee bench/results_rg_learning.json
python - <<'PY'
import json; s = json.load(open("bench/results_rg_learning.json"))
(s0, a0), (s1, a1) = s["eval_accuracy"][0], s["eval_accuracy"][-1]
print(f"held-out verifier accuracy: {a0:.3f} at the SFT start (step {s0}) -> {a1:.3f} after GRPO (step {s1}, {s['seconds']} s): {100 * (a1 - a0):+.1f} points")
PY

#!/usr/bin/env bash
# The reasoning-gym learning result: prep the mix of configs/grpo_reasoning_gym.yaml, SFT the tiny model on it,
# then GRPO from that start; prints held-out verifier accuracy at GRPO's start and end (its eval_accuracy list).
#   bash bench/rg_learning.sh                        # full size: SFT up to 3600 s per stage (padding-free), GRPO 900 s (15 minutes)
#   SFT_SECONDS=60 RL_SECONDS=60 bash bench/rg_learning.sh   # a quick check of the commands
#   TASKS=chain_sum:max_terms=2:max_digits=1,letter_counting:max_words=3 RESULT=runs/x.json bash bench/rg_learning.sh
#   SEED=1 OUT=runs/rg_seed1 RESULT=runs/rg_seed1.json bash bench/rg_learning.sh   # another seed of SFT and GRPO (same data)
# The SFT start (two stages, below) stops at SFT_TARGET held-out accuracy (0.55: letter_counting's most common answer
# alone is right on ~0.7 of its questions, so the mix reaches 0.55 once about a third of the held-out sums are right,
# which leaves GRPO groups with both right and wrong answers on sums it never saw) or after SFT_SECONDS. GRPO's rows ask questions that neither
# the SFT rows nor the held-out rows ask (prep --exclude). All rows are prepared with --exact_match, so RL's reward is
# 1 only for a fully correct answer (the arithmetic verifiers' partial credit for an answer containing the reference
# is exploitable).
# SFT_ONLY=1 stops after the SFT start: several seeds' starts can train side by side, then GRPO runs one at a time.
# REUSE_SFT=1 keeps OUT/sft and OUT/sft_summary.json from an earlier run of this script with the same OUT and SEED (the
# SFT rows are prepared identically) and runs the rest.
# Writes bench/results_rg_learning.json (the GRPO summary; RESULT=... elsewhere); work files under runs/rg_learning/.
set -euo pipefail
cd "$(dirname "$0")/.."
SFT_SECONDS=${SFT_SECONDS:-3600}; RL_SECONDS=${RL_SECONDS:-900}; OUT=${OUT:-runs/rg_learning}
RESULT=${RESULT:-bench/results_rg_learning.json}
TASKS=${TASKS:-"basic_arithmetic:min_terms=2:max_terms=2:max_digits=2:operators=+:allow_parentheses=false:allow_negation=false,letter_counting:min_words=1:max_words=3"}
if [ "${REUSE_SFT:-0}" = 1 ]; then test -f "$OUT/sft_summary.json"; rm -rf "$OUT/data" "$OUT/rl" "$OUT/grpo"
else rm -rf "$OUT"; fi
mkdir -p "$OUT"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
python -m rlhf_nb.launch prep reasoning_gym --task "$TASKS" --n 6000 --n_test "${N_TEST:-1200}" --seed 0 --exact_match --out "$OUT/data"
# RL's rows: questions neither the SFT rows nor the held-out ones ask (--exclude), so RL cannot lean on answers the SFT
# start learnt by heart, and what it gains on its own questions is what it must carry over to held-out ones
python -m rlhf_nb.launch prep reasoning_gym --task "$TASKS" --n 6000 --n_test 0 --seed 1 --exact_match --exclude "$OUT/data" --out "$OUT/rl"
# The SFT start in two stages. First the first task alone (the sums): prep with the same seed and its share of the
# mix's sizes draws exactly the mix's rows of that task, train and held-out, so nothing new is seen. It stops once
# FIRST_TARGET of its held-out questions are right (0.3: the sums are learnt in a jump, and stopping early in it
# leaves GRPO sums it gets right on some samples and wrong on others). Then the whole mix from there, until
# SFT_TARGET. On the mix from scratch, the sums are learnt late or not at all on some seeds (bench/results_rg_sft_form.md).
NT=$(echo "$TASKS" | tr ',' '\n' | wc -l)
if [ "${REUSE_SFT:-0}" != 1 ]; then
  python -m rlhf_nb.launch prep reasoning_gym --task "${TASKS%%,*}" --n $((6000 / NT)) --n_test $(( ${N_TEST:-1200} / NT )) \
      --seed 0 --exact_match --out "$OUT/first"
  python -m rlhf_nb.launch sft --dataset "$OUT/first" --n_train $((6000 / NT)) --output_dir "$OUT/sft_first" \
      --max_seconds "$SFT_SECONDS" --max_steps 20000 --padding_free --target_accuracy "${FIRST_TARGET:-0.3}" --eval_steps 25 \
      --eval_size 200 --seed "${SEED:-0}" | tee "$OUT/sft_first_summary.json"
  python -m rlhf_nb.launch sft --model_name_or_path "$OUT/sft_first" --dataset "$OUT/data" --n_train 6000 --output_dir "$OUT/sft" \
      --max_seconds "$SFT_SECONDS" --max_steps 20000 --padding_free --target_accuracy "${SFT_TARGET:-0.55}" --eval_steps 25 \
      --eval_size 200 --seed "${SEED:-0}" | tee "$OUT/sft_summary.json"
fi
[ "${SFT_ONLY:-0}" = 1 ] && exit 0                   # the SFT start only (then GRPO later with REUSE_SFT=1)
python -m rlhf_nb.launch grpo --config configs/grpo_reasoning_gym.yaml --model_name_or_path "$OUT/sft" --dataset "$OUT/rl" \
    --eval_dataset "$OUT/data/test.parquet" --output_dir "$OUT/grpo" --max_seconds "$RL_SECONDS" --seed "${SEED:-0}" | tee "$RESULT"
RESULT="$RESULT" OUT="$OUT" TASKS="$TASKS" LOAD0="$LOAD0" SFT_SECONDS="$SFT_SECONDS" RL_SECONDS="$RL_SECONDS" python bench/rg_learning_report.py

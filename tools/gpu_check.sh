#!/usr/bin/env bash
# One prepared check for a machine with a GPU, within about 8 minutes on one GPU:
#   1. every notebook cell flagged `#| gpu` (nbdev_test --flags gpu, notebook by notebook);
#   2. a measured bf16 matmul peak (TFLOP/s), the denominator of the FLOP utilisation below;
#   3. GRPO steps of the CLI's trainer on a random-init model of Qwen2.5-0.5B's shape in bf16, hf engine, padded rows
#      and, when the config has `padding_free`, packed rows: step time and its split (rollout / log-probs / update),
#      tokens/s, FLOP utilisation against the measured peak (bench/throughput.py's FLOP count), peak memory.
# Figures go to bench/results_gpu_check.{json,md} (--out PREFIX to change).
#   tools/gpu_check.sh                 # on the GPU machine
#   tools/gpu_check.sh --cpu --tiny    # the same code on a tiny shape on the CPU, skipping the gpu cells (a smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."
cpu=0; tiny=0; out=bench/results_gpu_check; steps=2; cells=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cpu=1 ;;
    --tiny) tiny=1 ;;
    --out) out="$2"; shift ;;
    --steps) steps="$2"; shift ;;
    --no_cells) cells=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: error: unknown option $1 (use --cpu, --tiny, --out PREFIX, --steps N, --no_cells)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$cpu" = 0 ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: error: no CUDA device here; run with --cpu --tiny for the smoke mode" >&2; exit 2
fi
export OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cells_json="$(mktemp)"; trap 'rm -f "$cells_json"' EXIT
# 1. the `#| gpu` cells, one notebook at a time (each line: notebook, status, seconds)
python - "$cells_json" "$cpu" "$cells" <<'PY'
import json, subprocess, sys, time
from pathlib import Path
out, cpu, run = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
def has_gpu_cell(p):
    cells = json.loads(p.read_text())["cells"]
    return any(c["cell_type"] == "code" and c["source"] and c["source"][0].startswith("#|")
               and "gpu" in c["source"][0][2:].split() for c in cells)
rows = []
for nb in sorted(Path("nbs").glob("*.ipynb")):
    if not has_gpu_cell(nb): continue
    if cpu or not run: rows.append({"notebook": nb.name, "status": "skipped (--cpu)" if cpu else "skipped", "seconds": 0.0}); continue
    t0 = time.perf_counter()
    r = subprocess.run(["nbdev_test", "--flags", "gpu", "--path", str(nb)], capture_output=True, text=True, timeout=240)
    rows.append({"notebook": nb.name, "status": "passed" if r.returncode == 0 else "FAILED",
                 "seconds": time.perf_counter() - t0, "tail": "" if r.returncode == 0 else (r.stdout + r.stderr)[-1500:]})
    print(f"gpu cells: {nb.name} {rows[-1]['status']} {rows[-1]['seconds']:.0f}s", flush=True)
Path(out).write_text(json.dumps(rows))
PY
# 2 and 3: the matmul peak and the GRPO steps
python - "$cells_json" "$out" "$cpu" "$tiny" "$steps" <<'PY'
import dataclasses, json, sys, time
from pathlib import Path
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import torch
from throughput import rl_throughput, QWEN25_05B_SHAPE, DRY_SHAPE
from rlhf_nb.algos import GRPOConfig
cells, out, cpu, tiny, steps = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1", int(sys.argv[5])
dev = "cpu" if cpu else "cuda"

def matmul_peak(n, reps):
    "Measured dense bf16 matmul TFLOP/s on `dev` (best of `reps` after a warm-up)."
    a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    a @ b; sync(); best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter(); a @ b; sync(); best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e12

peak = matmul_peak(256 if tiny else 8192, 3 if tiny else 20)
fields = {f.name for f in dataclasses.fields(GRPOConfig)}
arms = [("padded", {})] + ([("packed", {"padding_free": True})] if "padding_free" in fields else [])
shape = dict(DRY_SHAPE) if tiny else dict(QWEN25_05B_SHAPE)
size = dict(prompts_per_step=2, num_generations=2, max_completion_length=8) if tiny else \
       dict(prompts_per_step=16, num_generations=8, max_completion_length=128)
res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "mode": "cpu tiny" if tiny else "gpu 0.5B shape",
       "matmul_peak_tflops": peak, "gpu_cells": cells, "arms": {}}
for name, opts in arms:
    t0 = time.perf_counter()
    r = rl_throughput("grpo", shape=shape, steps=steps, warmup_steps=1, bf16=True, peak_tflops=peak, **size, **opts)
    r["wall_s"] = time.perf_counter() - t0
    res["arms"][name] = r
    print(f"{name}: step {r['step_s']:.2f}s tokens/s {r['tokens_per_s']:.0f} MFU {r['mfu']:.3f}", flush=True)
if "packed" in res["arms"]:
    res["packed_over_padded_step"] = res["arms"]["packed"]["step_s"] / res["arms"]["padded"]["step_s"]
Path(out + ".json").write_text(json.dumps(res, indent=1, default=str) + "\n")
keys = ["step_s", "rollout_s", "logprobs_s", "update_s", "tokens_per_s", "gen_tokens_per_s", "tflops", "mfu"]
md = [f"# GPU check ({res['mode']}, {res['device']})", "",
      f"Measured bf16 matmul peak: {peak:.1f} TFLOP/s (the FLOP utilisation's denominator).", "",
      "| arm | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
md += [f"| {n} | " + " | ".join(f"{r.get(k) or 0:.4g}" for k in keys) + " |" for n, r in res["arms"].items()]
md += ["", "| notebook with `#| gpu` cells | status | seconds |", "|---|---|---|"]
md += [f"| {c['notebook']} | {c['status']} | {c['seconds']:.0f} |" for c in cells] or ["| (none) | | |"]
Path(out + ".md").write_text("\n".join(md) + "\n")
print("\n".join(md))
failed = [c["notebook"] for c in cells if c["status"] == "FAILED"]
if failed: sys.exit(f"gpu_check.sh: gpu cells failed in {', '.join(failed)}")
PY

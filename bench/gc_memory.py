"""Peak memory of one training step with and without gradient checkpointing, on a 33M-parameter Qwen2 (hidden 512,
8 layers), CPU. Each setting runs in its own process; the number is the process's peak RSS during the steps minus its
RSS just before them (weights, gradients and optimiser state are allocated before, so the difference is mostly
activations).

    python bench/gc_memory.py [--batch 8 --seq 512 --steps 2] [--lora]
"""
import argparse, json, resource, subprocess, sys, time
from pathlib import Path

CHILD = r'''
import json, resource, sys, time, psutil, torch
from rlhf_nb.models import char_tokenizer, tiny_causal_lm, count_parameters, enable_gradient_checkpointing, wrap_lora
a = json.loads(sys.argv[1]); torch.manual_seed(0)
tok = char_tokenizer()
m = tiny_causal_lm(tok, hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=8, max_position_embeddings=a["seq"], tie_word_embeddings=True)
n = count_parameters(m)
if a["lora"]: m = wrap_lora(m, 16, 32)
if a["gc"]: enable_gradient_checkpointing(m)
m.train()
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
ids = torch.randint(6, len(tok), (a["batch"], a["seq"]))
m(input_ids=ids[:1, :8], labels=ids[:1, :8]).loss.backward(); opt.step(); opt.zero_grad()   # optimiser state allocated
before = psutil.Process().memory_info().rss
peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
for _ in range(a["steps"]):
    m(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
dt = (time.perf_counter() - t) / a["steps"]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"params": n, "gc": a["gc"], "lora": a["lora"], "rss_before_mb": before / 2**20,
                  "step_peak_over_before_mb": (max(peak, peak0) - before) / 2**20, "seconds_per_step": dt}))
'''

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8); p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=2); p.add_argument("--lora", action="store_true")
    a = p.parse_args(argv)
    rows = []
    for gc in (False, True):
        arg = json.dumps({"gc": gc, "lora": a.lora, "batch": a.batch, "seq": a.seq, "steps": a.steps})
        out = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1])); print(json.dumps(rows[-1]))
    off, on = rows
    print(f"{off['params'] / 1e6:.1f}M parameters, batch {a.batch} x {a.seq} tokens{' (LoRA)' if a.lora else ''}: step peak over "
          f"baseline {off['step_peak_over_before_mb']:.0f} MB without checkpointing, {on['step_peak_over_before_mb']:.0f} MB with "
          f"({on['step_peak_over_before_mb'] / off['step_peak_over_before_mb']:.2f}x); time per step "
          f"{off['seconds_per_step']:.1f}s vs {on['seconds_per_step']:.1f}s")
    Path(__file__).with_name("results_gc_memory.json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))

if __name__ == "__main__": main()

"""How often a two-rank CPU script dies with SIGABRT at exit, by how it ends (evidence for `dist.exit_process`).

    python tools/exit_loop.py [--runs 16] [--how none,end,exit]

Each run launches a small script under `accelerate launch` with 2 CPU processes (gloo): an Accelerator from
`dist.make_accelerator`, 20 all-reduces, 5 DDP steps of a linear layer, then it ends one of three ways:
`none` (falls off the end), `end` (`dist.end_distributed()` first), `exit` (`dist.exit_process(0)`).
A run counts as an abort when its output holds "terminate called" or its status is not 0."""
import argparse, os, subprocess, sys, tempfile
from pathlib import Path

SCRIPT = '''
import os, sys, torch
from rlhf_nb.options import AccelerateArgs
from rlhf_nb.dist import make_accelerator, end_distributed, exit_process
acc = make_accelerator(AccelerateArgs())
t = torch.ones(1000) * acc.process_index
for _ in range(20): acc.reduce(t)
m = torch.nn.Linear(64, 64); m, opt = acc.prepare(m, torch.optim.SGD(m.parameters(), 0.1))
for _ in range(5):
    loss = m(torch.randn(8, 64)).sum(); acc.backward(loss); opt.step(); opt.zero_grad()
how = sys.argv[1]
if how == "end": end_distributed()
if how == "exit": exit_process(0)
'''

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--how", default="none,end,exit")
    a = ap.parse_args()
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "pg_exit.py"; script.write_text(SCRIPT)
        for how in a.how.split(","):
            aborts = 0
            for i in range(a.runs):
                r = subprocess.run(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                                    "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0", str(script), how],
                                   capture_output=True, text=True, env=env, cwd=d, timeout=300)
                aborts += "terminate called" in r.stdout + r.stderr or r.returncode != 0
            print(f"{how}: {aborts} of {a.runs} runs aborted", flush=True)

if __name__ == "__main__": main()

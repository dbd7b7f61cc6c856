"""Tensor parallelism through DTensor on 2 CPU processes (gloo): see tests/_tp_worker.py."""
import os, random, subprocess, sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU layout")
def test_tensor_parallel_tiny_qwen2_on_two_processes():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(random.randint(20000, 40000)),
           str(ROOT / "tests" / "_tp_worker.py")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0 and "tp ok" in r.stdout, r.stderr[-3000:]

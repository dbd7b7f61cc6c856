"""The environment tests give the command-line worker subprocesses they start: one thread, offline, no launcher
variables inherited from the calling process, and this checkout first on the path."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker_env():
    "A copy of os.environ for a worker subprocess (see the module docstring)."
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_NB_DEBUG", "WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_CPU")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return env

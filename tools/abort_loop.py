"""Run the two-process CPU GRPO command many times and count how each run ended (evidence for the 2-process abort).

    python tools/abort_loop.py [--runs 30] [--keep DIR]

Each run is `rlhf-nb grpo --accelerate_config cpu_2proc ...` (the command of
tests/test_distributed.py::test_cli_accelerate_config_relaunch) in a fresh folder. A run "aborts" when its output
holds "terminate called" or "Aborted" or a process died of SIGABRT; the logs of failed runs are kept under --keep.
Python's faulthandler is on (PYTHONFAULTHANDLER=1), so an abort prints every Python thread's stack."""
import argparse, collections, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

CMD = ["grpo", "--accelerate_config", "cpu_2proc", "--output_dir", "out", "--per_device_train_batch_size", "2",
       "--num_generations", "2", "--max_steps", "2", "--max_completion_length", "4", "--arith_train_size", "32",
       "--eval_steps", "0", "--disable_tqdm", "true"]

def one_run(folder, env):
    "(outcome, rc, seconds, log text) of one run in `folder`."
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "rlhf_nb.launch", *CMD], capture_output=True, text=True, env=env, cwd=folder)
    log = r.stdout + r.stderr
    aborted = "terminate called" in log or "Aborted" in log or "SIGABRT" in log or "Fatal Python error" in log
    outcome = "abort" if aborted else "ok" if r.returncode == 0 and (folder / "out" / "summary.json").exists() else "fail"
    return outcome, r.returncode, time.time() - t0, log

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--keep", default="abort_loop_logs", help="where the logs of failed runs are written")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    for k in ("ACCELERATE_USE_CPU", "WORLD_SIZE", "RANK", "LOCAL_RANK", "RLHF_NB_DEBUG"): env.pop(k, None)   # as tests/test_distributed.py
    counts, keep = collections.Counter(), Path(a.keep)
    for i in range(a.runs):
        with tempfile.TemporaryDirectory() as d:
            outcome, rc, secs, log = one_run(Path(d), env)
        counts[outcome] += 1
        if outcome != "ok":
            keep.mkdir(parents=True, exist_ok=True); (keep / f"run{i}_{outcome}.log").write_text(log)
        print(f"run {i + 1}/{a.runs}: {outcome} (rc {rc}, {secs:.0f}s)", flush=True)
    print(f"runs {a.runs}: ok {counts['ok']}, abort {counts['abort']}, other failure {counts['fail']}")
    return 0 if counts["ok"] == a.runs else 1

if __name__ == "__main__": sys.exit(main())

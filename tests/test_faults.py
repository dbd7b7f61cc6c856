"""Faults that real runs meet, each ending in one clear line and a run that resumes exactly:

- SIGTERM / SIGINT (a scheduler pre-empting the job, Ctrl-C): the step in progress finishes, a checkpoint is written,
  the process exits with 128 + the signal number and says so in one line; `latest` continues as if never stopped;
- two runs into one output folder: the second refuses, naming the first's PID; a dead run's lock is taken over;
- a full disk (a real file-size limit, RLIMIT_FSIZE, on the process: the kernel refuses the write) while a checkpoint
  or a metrics line is written: one line naming the path and the space needed; the previous checkpoint and every
  metrics line written before are intact; once the limit is lifted, `latest` resumes and matches the run never stopped.

The runs are those of tests/test_resume.py (tiny, one thread each, bit-reproducible) and are compared with its
uninterrupted reference runs; `tests/_resume_worker.py --signal_at_log STEP --signal NAME` delivers a real signal
right after step STEP's metrics row is written.
"""
import json, os, resource, signal, subprocess, sys, time
from pathlib import Path

import pytest

from test_resume import ENV, ROOT, TIMEOUT, WORKER, Run, assert_same_metrics, assert_same_weights, checkpoints, cmd, leftovers, reference

LOCK = ".rlhf_nb.lock"


def worker(algo, out, *extra, opts=()):
    "The resume worker's command line for `algo` into `out`, with worker options `opts` (signals, kills)."
    c = cmd(algo, out, *extra)
    i = c.index("--")
    return c[:i] + [str(o) for o in opts] + c[i:]


def user_lines(text):
    "What a user reads on stderr: the library's warnings filtered out."
    return [l for l in text.splitlines() if l.strip() and "Warning" not in l and not l.startswith(("  warnings.warn", "  return "))
            and "Writing model shards" not in l]


def metric_rows(out):
    "Every line of metrics.jsonl parsed (fails on a half-written line)."
    return [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines()]


# --- SIGTERM / SIGINT -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo,sig", [("ppo", "TERM"), ("grpo", "INT"), ("dpo", "TERM")])
def test_signal_finishes_the_step_writes_a_checkpoint_then_resume_matches(algo, sig, tmp_path, tmp_path_factory):
    ref, out = reference(algo, tmp_path_factory), tmp_path / "run"
    victim = Run(worker(algo, out, "--save_steps", 0, opts=["--signal_at_log", 3, "--signal", sig]), out)   # no checkpoints but the stop's
    rc, signum = victim.wait(), getattr(signal, f"SIG{sig}")
    assert rc == 128 + signum, f"exit status {rc}, expected {128 + signum}:\n{victim.tail()}"
    last = user_lines(victim.log.read_text())[-1]
    assert last == (f"rlhf-nb {algo}: stopped by SIG{sig} after step 3; checkpoint written to {out}/checkpoint-3: "
                    "resume with --resume_from_checkpoint latest"), last
    assert [p.name for p in checkpoints(out)] == ["checkpoint-3"] and not (out / LOCK).exists() and not leftovers(out)
    assert [r["step"] for r in metric_rows(out)][-1] == 3
    Run(cmd(algo, out, "--save_total_limit", 2, "--resume_from_checkpoint", "latest"), out).ok()
    ref.ok()
    assert_same_metrics(ref.out, out)
    assert_same_weights(ref.out, out)


# --- two runs, one folder -------------------------------------------------------------------------------------------

def cli_proc(out, *extra, **kw):
    args = ["grpo", "--output_dir", out, "--per_device_train_batch_size", 2, "--num_generations", 2, "--max_completion_length", 2,
            "--arith_train_size", 8, "--eval_steps", 0, "--disable_tqdm", "true", *extra]
    return subprocess.Popen([sys.executable, "-m", "rlhf_nb.launch", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT, **kw)


def test_second_run_into_a_busy_folder_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    first = cli_proc(out, "--max_steps", 100000)
    t0 = time.time()
    while not (out / LOCK).exists():
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.time() - t0 < TIMEOUT; time.sleep(0.1)
    second = cli_proc(out, "--max_steps", 2)
    _, err = second.communicate(timeout=TIMEOUT)
    assert second.returncode == 2 and user_lines(err) == [
        f"rlhf-nb grpo: error: --output_dir {out} is in use by another run (PID {first.pid}, started "
        f"{json.loads((out / LOCK).read_text())['started']}): wait for it to end, or choose another --output_dir"], err
    first.kill(); first.communicate()                                        # dies without releasing its lock
    assert json.loads((out / LOCK).read_text())["pid"] == first.pid
    third = cli_proc(out, "--max_steps", 2)
    _, err = third.communicate(timeout=TIMEOUT)
    assert third.returncode == 0, err[-3000:]
    assert f"--output_dir {out}: taking over the lock of run PID {first.pid}" in err and "no longer running" in err
    assert [r["step"] for r in metric_rows(out)] == [1, 2] and not (out / LOCK).exists()


# --- a full disk ----------------------------------------------------------------------------------------------------

def run_limited(argv, limit):
    "Run `argv` with the file-size limit RLIMIT_FSIZE = `limit` bytes (output through pipes, which it does not cover)."
    set_limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=TIMEOUT, preexec_fn=set_limit)


@pytest.mark.parametrize("algo,where", [("grpo", "checkpoint"), ("ppo", "metrics"), ("dpo", "checkpoint")])
def test_disk_full_stops_with_one_line_keeps_what_was_written_and_resume_matches(algo, where, tmp_path, tmp_path_factory):
    ref, out = reference(algo, tmp_path_factory), tmp_path / "run"
    first = Run(worker(algo, out, "--save_total_limit", 100, opts=["--signal_at_log", 2, "--signal", "TERM"]), out)
    assert first.wait() == 128 + signal.SIGTERM, first.tail()
    before = (out / "metrics.jsonl").read_text()
    size = len(before.encode()) + 20 if where == "metrics" else 256 * 1024  # the next row / any weights file does not fit
    r = run_limited(worker(algo, out, "--save_total_limit", 100, "--resume_from_checkpoint", "latest"), size)
    path = out / "metrics.jsonl" if where == "metrics" else out / "checkpoint-3"
    lines = [l for l in r.stderr.splitlines() if l.startswith("rlhf-nb")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"rlhf-nb {algo}: error: disk full writing {path} (a file reached the size limit (ulimit -f)): "
                               "it needs about "), lines[0]
    assert "free now; what was written before it is intact" in lines[0]
    assert [p.name for p in checkpoints(out)] == ["checkpoint-1", "checkpoint-2"] and not leftovers(out)
    rows = metric_rows(out)                                                  # every line whole
    assert (out / "metrics.jsonl").read_text().startswith(before) and [r["step"] for r in rows][-1] == (2 if where == "metrics" else 3)
    assert not (out / LOCK).exists()
    Run(cmd(algo, out, "--save_total_limit", 100, "--resume_from_checkpoint", "latest"), out).ok()   # space freed
    ref.ok()
    assert_same_metrics(ref.out, out)
    assert_same_weights(ref.out, out)


# --- the fault-injection harness ------------------------------------------------------------------------------------

def test_fault_injection_harness_resume_equals_never_stopped():
    "SIGKILL at random moments across seeds (bounded: at most 12 faults, 90 s of faults), each resumed and compared."
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_fault_harness.py"), "--faults", "12", "--budget", "90"],
                       capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=TIMEOUT)
    report = [l for l in r.stdout.splitlines() if l.startswith(("fault ", "injected faults"))]
    print("\n".join(report))                                                  # shown with pytest -s / on failure
    assert r.returncode == 0 and report and report[-1].startswith("injected faults: "), r.stdout[-3000:] + r.stderr[-3000:]
    injected, survived = (int(report[-1].split(", ")[k].split(": ")[1]) for k in (0, 1))
    assert injected >= 1 and survived == injected, report[-1]

"""Faults that real runs meet, each ending in one clear line and a run that resumes exactly:

- SIGTERM / SIGINT (a scheduler pre-empting the job, Ctrl-C): the step in progress finishes, a checkpoint is written,
  the process exits with 128 + the signal number and says so in one line; `latest` continues as if never stopped;
- two runs into one output folder: the second refuses, naming the first's PID; a dead run's lock is taken over;
- a full disk (a real file-size limit, RLIMIT_FSIZE, on the process: the kernel refuses the write) while a checkpoint,
  a metrics line or the step's rollouts (samples.jsonl) are written: one line naming the path and the space needed; the previous checkpoint and every
  metrics line written before are intact; once the limit is lifted, `latest` resumes and matches the run never stopped.

The runs are those of tests/test_resume.py (tiny, one thread each, bit-reproducible) and are compared with its
uninterrupted reference runs; `tests/_resume_worker.py --signal_at_log STEP --signal NAME` delivers a real signal
right after step STEP's metrics row is written.
"""
import json, resource, signal, subprocess, sys, time
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
    third = cli_proc(out, "--max_steps", 2, "--overwrite_output_dir", "true")      # the dead run left its metrics behind
    _, err = third.communicate(timeout=TIMEOUT)
    assert third.returncode == 0, err[-3000:]
    assert f"--output_dir {out}: taking over the lock of run PID {first.pid}" in err and "no longer running" in err
    assert [r["step"] for r in metric_rows(out)] == [1, 2] and not (out / LOCK).exists()


# --- a full disk ----------------------------------------------------------------------------------------------------

def run_limited(argv, limit):
    "Run `argv` with the file-size limit RLIMIT_FSIZE = `limit` bytes (output through pipes, which it does not cover)."
    set_limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=TIMEOUT, preexec_fn=set_limit)


# The samples case uses the metrics case's limit (metrics.jsonl's size + 20 bytes). It stops the run at samples.jsonl
# only when two steps of samples lie between two thirds of that limit and the limit, so that step 3's rollouts do not
# fit (asserted below). GRPO's files do; PPO's metric rows also carry the critic's metrics (about 1,170 bytes a row
# against 735 bytes of samples a step), so its step 3 samples fit and the limit hits metrics.jsonl instead. Both
# trainers write samples through the same RLTrainer.record_samples, which the GRPO case exercises.
@pytest.mark.parametrize("algo,where", [("grpo", "checkpoint"), ("dpo", "metrics"), ("dpo", "checkpoint"), ("grpo", "samples")])
def test_disk_full_stops_with_one_line_keeps_what_was_written_and_resume_matches(algo, where, tmp_path, tmp_path_factory):
    ref, out = reference(algo, tmp_path_factory), tmp_path / "run"
    first = Run(worker(algo, out, "--save_total_limit", 100, opts=["--signal_at_log", 2, "--signal", "TERM"]), out)
    assert first.wait() == 128 + signal.SIGTERM, first.tail()
    before = (out / "metrics.jsonl").read_text()
    size = len(before.encode()) + 20 if where in ("metrics", "samples") else 256 * 1024  # the next row / any weights file does not fit
    samples = (out / "samples.jsonl").read_text() if algo != "dpo" else ""
    assert where != "samples" or len(samples.encode()) < size < len(samples.encode()) * 3 // 2  # step 3's rollouts do not fit
    r = run_limited(worker(algo, out, "--save_total_limit", 100, "--resume_from_checkpoint", "latest"), size)
    path = out / {"metrics": "metrics.jsonl", "samples": "samples.jsonl"}.get(where, "checkpoint-3")
    lines = [l for l in r.stderr.splitlines() if l.startswith("rlhf-nb")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"rlhf-nb {algo}: error: disk full writing {path} (a file reached the size limit (ulimit -f)): "
                               "it needs about "), lines[0]
    assert "free now; what was written before it is intact" in lines[0]
    assert [p.name for p in checkpoints(out)] == ["checkpoint-1", "checkpoint-2"] and not leftovers(out)
    rows = metric_rows(out)                                                  # every line whole
    assert (out / "metrics.jsonl").read_text().startswith(before) and [r["step"] for r in rows][-1] == (3 if where == "checkpoint" else 2)
    if where == "samples": assert (out / "samples.jsonl").read_text() == samples           # step 3's lines cut back, none half
    assert not (out / LOCK).exists()
    Run(cmd(algo, out, "--save_total_limit", 100, "--resume_from_checkpoint", "latest"), out).ok()   # space freed
    ref.ok()
    assert_same_metrics(ref.out, out)
    assert_same_weights(ref.out, out)


# --- the fault-injection harness ------------------------------------------------------------------------------------

def test_fault_injection_harness_resume_equals_never_stopped():
    "SIGKILL at random moments across seeds (bounded: at most 8 faults, 45 s of faults), each resumed and compared."
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_fault_harness.py"), "--faults", "8", "--budget", "45"],
                       capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=TIMEOUT)
    report = [l for l in r.stdout.splitlines() if l.startswith(("fault ", "injected faults"))]
    print("\n".join(report))                                                  # shown with pytest -s / on failure
    assert r.returncode == 0 and report and report[-1].startswith("injected faults: "), r.stdout[-3000:] + r.stderr[-3000:]
    injected, survived = (int(report[-1].split(", ")[k].split(": ")[1]) for k in (0, 1))
    assert injected >= 1 and survived == injected, report[-1]


# --- SFT: signals and kills anywhere, then resume ------------------------------------------------------------------

SFT = ["sft", "--max_steps", 6, "--n_train", 64, "--eval_size", 8, "--eval_steps", 3, "--per_device_train_batch_size", 8,
       "--warmup_steps", 2, "--lr_scheduler_type", "cosine", "--seed", 3]


def sft_worker(out, *extra, opts=()):
    return [sys.executable, str(WORKER), *map(str, opts), "--", *map(str, SFT), "--output_dir", str(out), *map(str, extra)]


def sft_rows(out):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in metric_rows(out)]


_SFT_REF = {}

def sft_reference(tmp_path_factory):
    if "ref" not in _SFT_REF:
        out = tmp_path_factory.mktemp("ref-sft") / "run"
        _SFT_REF["ref"] = Run(sft_worker(out), out)
    return _SFT_REF["ref"]


@pytest.mark.parametrize("sig,at,save_steps,resumes_from", [("TERM", 3, 0, "checkpoint-3"), ("KILL", 4, 2, "checkpoint-2")],
                         ids=["sigterm", "sigkill-between-checkpoints"])
def test_sft_stopped_anywhere_resumes_to_the_uninterrupted_run(sig, at, save_steps, resumes_from, tmp_path, tmp_path_factory):
    from safetensors.torch import load_file
    ref, out = sft_reference(tmp_path_factory), tmp_path / "run"
    victim = Run(sft_worker(out, "--save_steps", save_steps, opts=["--signal_at_log", at, "--signal", sig]), out)
    rc = victim.wait()
    assert rc == (128 + signal.SIGTERM if sig == "TERM" else -signal.SIGKILL), victim.tail()
    if sig == "TERM": assert f"rlhf-nb sft: stopped by SIGTERM after step 3; checkpoint written to {out}/checkpoint-3" in victim.log.read_text()
    assert checkpoints(out)[-1].name == resumes_from and [r["step"] for r in metric_rows(out)][-1] == at
    Run(sft_worker(out, "--resume_from_checkpoint", "latest"), out).ok()
    ref.ok()
    assert sft_rows(out) == sft_rows(ref.out)                                 # every step's loss, lr and evaluation
    a, b = load_file(str(ref.out / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a), "weights differ after resuming"


def test_reward_model_training_stopped_by_sigterm_resumes_to_the_uninterrupted_run(tmp_path):
    from safetensors.torch import load_file
    rm = ["rm", "--max_steps", 6, "--n_train", 32, "--eval_size", 8, "--eval_steps", 3, "--per_device_train_batch_size", 8,
          "--max_length", 32, "--seed", 3]
    argv = lambda out, *extra, opts=(): [sys.executable, str(WORKER), *map(str, opts), "--", *map(str, rm), "--output_dir", str(out), *map(str, extra)]
    ref, out = Run(argv(tmp_path / "ref"), tmp_path / "ref"), tmp_path / "run"
    victim = Run(argv(out, opts=["--signal_at_log", 4, "--signal", "TERM"]), out)
    assert victim.wait() == 128 + signal.SIGTERM, victim.tail()
    assert [p.name for p in checkpoints(out)] == ["checkpoint-4"]
    Run(argv(out, "--resume_from_checkpoint", "latest"), out).ok(); ref.ok()
    assert sft_rows(out) == sft_rows(ref.out)
    a, b = load_file(str(ref.out / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a), "weights differ after resuming"

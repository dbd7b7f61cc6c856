"""Faults of a two-process run (2 CPU ranks under `accelerate launch`, DDP and FSDP2), each ending promptly with one line
and a run that resumes exactly:

- a full disk (a real file-size limit, RLIMIT_FSIZE, set on the launcher and inherited by both ranks) while rank 0
  writes a metrics line or a checkpoint: EVERY rank stops within seconds (not after the process group's timeout) with
  the same line naming the path and the space needed; what was written before is intact; resume then matches;
- the same through the CLI's own relaunch (`rlhf-nb grpo --accelerate_config cpu_2proc`): the ranks' line ends the
  output (no launcher traceback after it) and the exit status is theirs;
- a rank killed with SIGKILL in the middle of training, launched the way `rlhf-nb ppo --accelerate_config` launches
  (`rlhf_nb.launch.run_launcher`): the run stops within seconds, a line names the dead rank and its PID -- rank 0's,
  or the launcher's when the launcher's SIGTERM ended rank 0 before it could print -- and
  `--resume_from_checkpoint latest` reproduces the uninterrupted run's metrics.

Every wait is on an event (a file appearing, a process ending); the time bounds only catch a hang.

The rank PIDs come from the run folder's lock file (`ranks`), which the run writes itself. Runs are those of
tests/test_fsdp.py (4 tiny PPO steps, checkpoints at 2 and 4)."""
import json, os, resource, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from test_fsdp import ARGS, DDP, ENV, FSDP, ROOT, WORKER, metrics

LOCK = ".rlhf_nb.lock"
BOUND = 60                        # seconds: a stop must come long before the process group's timeout (1800 s)
HANG = 600                        # seconds: a run that has not reached its checkpoint by then hangs (it takes ~30 s)
RESUME = "resume with --resume_from_checkpoint latest"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU two-process layout")
PLACEMENTS = {"ddp": (DDP, []), "fsdp": (FSDP, ["--placement", "accelerate"])}


def argv(placement, out, *extra, worker_opts=()):
    config, opts = PLACEMENTS[placement]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(WORKER), *map(str, worker_opts), "--",
            *map(str, ARGS), *opts, "--disable_tqdm", "true", "--output_dir", str(out), *map(str, extra)]


def run(cmd, limit=None):
    "Run `cmd` (optionally under the file-size limit `limit` bytes); -> (completed process, seconds)."
    pre = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))) if limit else None
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT, preexec_fn=pre)
    return r, time.time() - t0


def ours(err): return [l for l in err.splitlines() if "rlhf-nb ppo:" in l]


def as_cli(cmd):
    "`cmd` (an `accelerate launch` argv) run the way `rlhf-nb ppo --accelerate_config` runs it: `rlhf_nb.launch.run_launcher`."
    code = ("import os, sys; from rlhf_nb.launch import run_launcher; "
            "sys.exit(run_launcher(sys.argv[1:], {**os.environ, 'ACCELERATE_USE_CPU': '1'}, 'ppo'))")
    return [sys.executable, "-c", code, *cmd]


def start(cmd, log):
    "Popen `cmd` with its output to the file `log` (a pipe nobody reads while the test waits would stall the run when full)."
    with open(log, "w") as f: return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT)


def until_exists(path, proc, log):
    "Wait for `path` while `proc` runs; a run that ends first, or has not written it after HANG seconds, fails the test."
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None or time.monotonic() - t0 > HANG:
            proc.kill(); proc.wait()
            pytest.fail(f"no {path} (exit status {proc.returncode}, {time.monotonic() - t0:.0f} s):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def ended(proc, log, bound=BOUND):
    "Wait for `proc` to end (at most `bound` s) -> (its output, seconds waited)."
    t0 = time.monotonic()
    try: proc.wait(timeout=bound)
    except subprocess.TimeoutExpired: proc.kill(); proc.wait()
    return log.read_text(errors="replace"), time.monotonic() - t0


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    "Uninterrupted runs, one per placement."
    d = tmp_path_factory.mktemp("ref")
    for p in PLACEMENTS:
        r, _ = run(argv(p, d / p))
        assert r.returncode == 0, r.stderr[-3000:]
    return d


@pytest.fixture(scope="module")
def stopped_at_2(tmp_path_factory):
    "A DDP run stopped by SIGTERM after step 2 (both ranks): checkpoint-2 and metrics rows 1, 2."
    out = tmp_path_factory.mktemp("stopped") / "run"
    r, _ = run(argv("ddp", out, worker_opts=("--signal_at_log", 2, "--signal", "TERM")))
    assert r.returncode != 0 and (out / "checkpoint-2/trainer_state.json").exists(), r.stderr[-3000:]
    return out


@pytest.mark.parametrize("where", ["samples", "checkpoint"])
def test_disk_full_on_rank_0_stops_every_rank_with_one_line(where, stopped_at_2, refs, tmp_path):
    import shutil
    out = tmp_path / "run"; shutil.copytree(stopped_at_2, out)
    before = (out / "metrics.jsonl").read_text()
    limit = len(before.encode()) + 20 if where == "samples" else 256 * 1024   # step 3's samples (written before its row) / any weights file do not fit
    r, seconds = run(argv("ddp", out, "--resume_from_checkpoint", "latest"), limit)
    path = out / ("samples.jsonl" if where == "samples" else "checkpoint-4")
    lines = ours(r.stderr)
    assert r.returncode != 0 and seconds < BOUND, (seconds, r.stderr[-3000:])
    assert sorted(l.split("] ", 1)[0] for l in lines) == ["[rank 0", "[rank 1"], lines     # every rank says it
    assert len({l.split("] ", 1)[1] for l in lines}) == 1, lines                          # the same line
    assert lines[0].split("] ", 1)[1].startswith(f"rlhf-nb ppo: error: disk full writing {path} (a file reached the size limit"), lines
    assert "it needs about " in lines[0] and "what was written before it is intact" in lines[0]
    assert (out / "metrics.jsonl").read_text().startswith(before)
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == ([1, 2] if where == "samples" else [1, 2, 3, 4])
    assert sorted(p.name for p in out.glob("*checkpoint-*")) == ["checkpoint-2"] and not (out / LOCK).exists()
    r, _ = run(argv("ddp", out, "--resume_from_checkpoint", "latest"))                # space freed
    assert r.returncode == 0, r.stderr[-3000:]
    assert metrics(out) == metrics(refs / "ddp")


def test_cli_relaunch_stopped_by_a_full_disk_prints_only_the_ranks_line_and_their_status(tmp_path):
    "`rlhf-nb grpo --accelerate_config cpu_2proc`: samples.jsonl of step 1 does not fit; no launcher traceback after the ranks' line."
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlhf_nb.launch", "grpo", "--accelerate_config", "cpu_2proc", "--num_processes", 2, "--main_process_port", 0,
           "--output_dir", out, "--max_steps", 2, "--per_device_train_batch_size", 4, "--num_generations", 2,
           "--max_completion_length", 4, "--arith_train_size", 8, "--eval_steps", 0, "--disable_tqdm", "true"]
    r, seconds = run(list(map(str, cmd)), limit=200)                        # step 1's rollouts (~360 B) do not fit
    lines = [l for l in r.stderr.splitlines() if "rlhf-nb grpo: error:" in l]
    assert r.returncode == 2 and seconds < BOUND, (r.returncode, seconds, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "CalledProcessError" not in r.stderr and "ChildFailedError" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] in lines, r.stderr[-3000:]     # our line ends the output
    # each rank that gets to speak says the same line (the launcher may stop the slower rank before it prints)
    assert lines and set(l.split("] ", 1)[0] for l in lines) <= {"[rank 0", "[rank 1"} and len({l.split("] ", 1)[1] for l in lines}) == 1, lines
    assert lines[0].split("] ", 1)[1].startswith(f"rlhf-nb grpo: error: disk full writing {out / 'samples.jsonl'} (a file reached"), lines
    assert (out / "samples.jsonl").read_text() == "" and not (out / LOCK).exists()   # cut back: no half line


@pytest.mark.parametrize("placement", ["ddp", "fsdp"])
def test_rank_killed_mid_step_stops_the_run_names_it_and_resume_matches(placement, refs, tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = start(as_cli(argv(placement, out, worker_opts=("--step_sleep", 1))), log)   # a second after each step: the kill lands in step 3
    until_exists(out / "checkpoint-2/trainer_state.json", proc, log)
    (pid0, _), (pid1, _) = json.loads((out / LOCK).read_text())["ranks"]
    os.kill(pid1, signal.SIGKILL)
    err, seconds = ended(proc, log)
    assert proc.returncode == 2 and seconds < BOUND, (proc.returncode, seconds, err[-3000:])
    # Rank 0 names rank 1 (rank_lost waits for the killed peer to show as dead) and exits 2; the launcher's SIGTERM,
    # sent as soon as it sees rank 1 gone, is ignored once the collective failed (RunGuard), so it cannot cut the line
    # short, and the launcher adds nothing because a rank spoke.
    rank0 = f"[rank 0] rlhf-nb ppo: error: rank 1 (PID {pid1}) died; this rank (PID {pid0}) stopped too: {RESUME}"
    assert ours(err) == [rank0], err[-3000:]
    assert err.strip().splitlines()[-1] == rank0, err[-3000:]                  # nothing after it (no launcher traceback)
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps in ([1, 2], [1, 2, 3]), steps                                  # whole rows up to the kill, which lands after row 2
    r, _ = run(argv(placement, out, "--resume_from_checkpoint", "latest"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert metrics(out) == metrics(refs / placement)


def test_a_rank_that_hangs_stops_the_run_after_ddp_timeout(tmp_path):
    "SIGSTOP rank 1 (alive, silent: the launcher sees nothing wrong); rank 0 gives up after --ddp_timeout 5 with one line."
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = start(argv("ddp", out, "--ddp_timeout", 5, worker_opts=("--step_sleep", 1)), log)
    until_exists(out / "checkpoint-2/trainer_state.json", proc, log)
    (pid0, _), (pid1, _) = json.loads((out / LOCK).read_text())["ranks"]
    os.kill(pid1, signal.SIGSTOP); stopped = time.monotonic()
    try:
        while running(pid0): assert time.monotonic() - stopped < BOUND; time.sleep(0.1)
        seconds = time.monotonic() - stopped
    finally: os.kill(pid1, signal.SIGKILL)                              # the launcher would wait ~30 s to kill it itself
    err, _ = ended(proc, log)
    assert 5 <= seconds < BOUND, (seconds, err[-3000:])                 # after --ddp_timeout, long before the default 1800 s
    assert ours(err) == [f"[rank 0] rlhf-nb ppo: error: another rank did not answer within the process group's timeout "
                         f"(--ddp_timeout): it hangs or is stopped; this rank (PID {pid0}) stopped too: {RESUME}"], err[-3000:]


def running(pid):
    "Whether `pid` still runs (not a zombie)."
    try: return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError: return False

"""Hostile inputs a user can be handed (a configuration file, option values, a checkpoint folder, an output folder) and
the advice of every one-line fault message, followed to the letter.

Each hostile input ends in ONE line `rlhf-nb CMD: error: ...` with exit status 2, before anything is written, within a
second: a non-finite float option, a YAML file with aliases (billion laughs), one over the size limit or a named pipe;
a checkpoint whose files are named pipes, devices or links out of its folder, or whose trainer_state.json has steps or
types out of range; `--output_dir /`, the home folder, a folder this user cannot write.

Each fault of a run (a full disk before and after the first checkpoint, a lost rank before and after it, SIGTERM) ends
in a line that advises `--resume_from_checkpoint latest`; the test runs exactly that from the state left on disk and
checks that the run finishes with the metrics of a run that was never stopped.

Runs go through the CLI's `rlhf_nb.launch.main` in this process (tiny GRPO runs, a fraction of a second each); only
the unwritable folder is checked through a subprocess, which runs as an unprivileged user when the tests run as root.
"""
import json, os, shutil, signal, subprocess, sys, threading
from pathlib import Path

import pytest

from rlhf_nb import launch
from rlhf_nb.engine import RunLoop
from rlhf_nb.files import LOCK_NAME, file_size_limit
from test_resume import metrics

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--max_steps", 3, "--per_device_train_batch_size", 2, "--num_generations", 2, "--max_completion_length", 2,
        "--eval_steps", 0, "--arith_train_size", 8, "--disable_tqdm", "true", "--seed", 0, "--save_total_limit", 10]
LATEST = ["--resume_from_checkpoint", "latest"]
RESUME = "resume with --resume_from_checkpoint latest"


@pytest.fixture
def run(capsys, monkeypatch):
    "`rlhf_nb.launch.main(args)` in this process: -> (exit status, the stderr lines that start with 'rlhf-nb')."
    monkeypatch.setenv("TQDM_DISABLE", "1"); monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
    def _run(*args):
        capsys.readouterr()
        rc = launch.main([str(a) for a in args])
        err = capsys.readouterr().err
        assert "Traceback" not in err, err[-3000:]
        return rc, [l for l in err.splitlines() if l.startswith("rlhf-nb")]
    return _run


def refused(rc, lines, *needles):
    "Exit status 2 and exactly one error line containing every needle; -> the line."
    assert rc == 2 and len(lines) == 1 and ": error: " in lines[0], (rc, lines)
    for n in needles: assert n in lines[0], (n, lines[0])
    return lines[0]


class Fifo:
    "A named pipe at `path` whose writer thread never blocks the test: `close()` releases it whether or not it was read."
    def __init__(self, path, data=b"x: 1\n"):
        self.path = Path(path); os.mkfifo(self.path)
        self.thread = threading.Thread(target=self._write, args=(data,), daemon=True); self.thread.start()
    def _write(self, data):
        with open(self.path, "wb") as f: f.write(data)                       # blocks until a reader opens it
    def close(self):
        if self.thread.is_alive():                                             # nobody read it: open it ourselves
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self.thread.join(5); os.close(fd)
        assert not self.thread.is_alive()


# === option values and configuration files ===========================================================================

@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999"])
def test_non_finite_float_option_is_one_line(run, tmp_path, value):
    shown = {"1e999": "inf"}.get(value, value)
    line = refused(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--learning_rate", value))
    assert line == f"rlhf-nb ppo: error: --learning_rate must be a finite number, got {shown}", line
    assert not (tmp_path / "o").exists()


def test_every_float_option_is_checked_for_finiteness(run, tmp_path):
    "An option without a range (vllm_server_timeout) and a YAML value (.nan) are checked the same way."
    refused(*run("grpo", "--output_dir", tmp_path / "o", *TINY, "--vllm_server_timeout", "inf"),
            "--vllm_server_timeout must be a finite number, got inf")
    (tmp_path / "run.yaml").write_text("kl_coef: .nan\n")
    refused(*run("grpo", "--config", tmp_path / "run.yaml", "--output_dir", tmp_path / "o", *TINY),
            f"{tmp_path / 'run.yaml'}: kl_coef must be a finite number, got nan")
    assert not (tmp_path / "o").exists()


def test_yaml_billion_laughs_is_refused_before_anything_expands(run, tmp_path):
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{k}: &{k} [{', '.join(['*' + p] * 9)}]" for p, k in zip("abcdefgh", "bcdefghi")]   # 9**9 strings
    (tmp_path / "laughs.yaml").write_text("\n".join(lines) + "\n")
    refused(*run("grpo", "--config", tmp_path / "laughs.yaml", "--output_dir", tmp_path / "o"),
            f"{tmp_path / 'laughs.yaml'}: YAML alias *a on line 2 refused")
    (tmp_path / "merge.yaml").write_text("base: &b {seed: 1}\nother:\n  <<: *b\n")                # merge keys are aliases too
    refused(*run("grpo", "--config", tmp_path / "merge.yaml", "--output_dir", tmp_path / "o"), "YAML alias *b on line 3")
    assert not (tmp_path / "o").exists()


def test_yaml_over_the_size_limit_or_not_a_file(run, tmp_path):
    from rlhf_nb.config import CONFIG_MAX_BYTES
    (tmp_path / "big.yaml").write_text("seed: 1\n" + "#" * CONFIG_MAX_BYTES)
    refused(*run("grpo", "--config", tmp_path / "big.yaml", "--output_dir", tmp_path / "o"),
            f"is over the {CONFIG_MAX_BYTES} bytes a configuration file may have")
    pipe = Fifo(tmp_path / "pipe.yaml")
    try: refused(*run("grpo", "--config", pipe.path, "--output_dir", tmp_path / "o"), "pipe.yaml: not a regular file")
    finally: pipe.close()
    (tmp_path / "deep.yaml").write_text("seed: " + "[" * 3000 + "]" * 3000 + "\n")
    refused(*run("grpo", "--config", tmp_path / "deep.yaml", "--output_dir", tmp_path / "o"), "nested too deeply")
    assert not (tmp_path / "o").exists()


# === output folders ==================================================================================================

@pytest.mark.parametrize("where", ["/", "~", "HOME", "/usr"])
def test_output_dir_that_is_a_root_or_the_home_folder_is_refused(run, tmp_path, monkeypatch, where):
    monkeypatch.setenv("HOME", str(tmp_path / "home")); (tmp_path / "home").mkdir()
    out = str(tmp_path / "home") if where == "HOME" else where
    for cmd, extra in (("grpo", TINY), ("sft", ["--max_steps", 1])):
        refused(*run(cmd, "--output_dir", out, *extra), f"--output_dir {out} is ", "give it a folder of its own")
    assert list((tmp_path / "home").iterdir()) == []


def test_unwritable_output_dir_is_one_line(tmp_path):
    "A forked copy of this process runs the command as an unprivileged user (root may write anywhere; nobody = 65534)."
    import select, tempfile
    base = Path(tempfile.mkdtemp(prefix="rlhf-nb-ro-")); os.chmod(base, 0o755); (base / "ro").mkdir(mode=0o555)
    try:
        argv = ["grpo", "--output_dir", str(base / "ro" / "run"), "--max_steps", "1"]
        launch.parse_train_args("grpo", ["--output_dir", str(tmp_path / "w"), "--max_steps", "1"])   # imports done here
        r, w = os.pipe(); pid = os.fork()
        if pid == 0:                                                          # the child: one command, then _exit
            code = 3
            try:
                os.close(r); sys.stderr = os.fdopen(w, "w", buffering=1)
                if os.geteuid() == 0: os.setgroups([]); os.setgid(65534); os.setuid(65534)
                code = launch.main(argv)
            finally: os._exit(code)
        os.close(w); err = b""
        while select.select([r], [], [], 60)[0] and (chunk := os.read(r, 65536)): err += chunk     # until the child ends
        os.close(r); _, status = os.waitpid(pid, 0)
        lines = [l for l in err.decode().splitlines() if l.strip()]
        assert os.WEXITSTATUS(status) == 2 and len(lines) == 1, (status, lines)
        assert lines[0] == (f"rlhf-nb grpo: error: --output_dir {base / 'ro' / 'run'} cannot be written: {base / 'ro'} is not "
                            "writable by this user; choose another --output_dir"), lines[0]
        assert list((base / "ro").iterdir()) == []
    finally: shutil.rmtree(base)


# === checkpoint folders ==============================================================================================

@pytest.fixture(scope="module")
def done(tmp_path_factory):
    "A finished 3-step GRPO run with checkpoints 1, 2 and 3 (written in this process)."
    out = tmp_path_factory.mktemp("hostile") / "run"
    assert launch.main([str(a) for a in ["grpo", "--output_dir", out, *TINY, "--save_steps", 1]]) == 0
    return out


def tampered(done, tmp_path, how):
    "A copy of checkpoint-2 of `done`, damaged by `how`: -> its folder."
    d = tmp_path / "checkpoint-2"; shutil.copytree(done / "checkpoint-2", d)
    state = lambda obj: (d / "trainer_state.json").write_text(obj if isinstance(obj, str) else json.dumps(obj))
    real = json.loads((d / "trainer_state.json").read_text())
    if how == "device-rng": (d / "rng_state_0.pt").unlink(); os.symlink("/dev/zero", d / "rng_state_0.pt")
    elif how == "weights-link-out":
        w, away = d / "policy" / "model.safetensors", tmp_path / "elsewhere.safetensors"
        shutil.move(w, away); os.symlink(away, w)
    elif how == "negative-step": state({**real, "global_step": -5})
    elif how == "absurd-step": state({**real, "global_step": 10**15})
    elif how == "string-step": state({**real, "global_step": "2"})
    elif how == "other-step": state({**real, "global_step": 7})
    elif how == "list-state": state([real])
    elif how == "bad-sampler": state({**real, "sampler_state": {"epoch": "0", "offset": -1}})
    elif how == "nan-kl": state(json.dumps({**real, "kl_ctl": {"value": 1}}).replace('"value": 1', '"value": NaN'))
    return d


@pytest.mark.parametrize("how,needle", [
    ("fifo-optimizer", "optimizer.pt is a named pipe (FIFO), not a regular file: refused"),
    ("device-rng", "rng_state_0.pt leads outside the checkpoint folder (to /dev/zero): refused"),
    ("weights-link-out", "policy/model.safetensors leads outside the checkpoint folder"),
    ("negative-step", "trainer_state.json: global_step must be an integer from 0 to 1000000000, got -5 (int)"),
    ("absurd-step", "global_step must be an integer from 0 to 1000000000, got 1000000000000000"),
    ("string-step", 'global_step must be an integer from 0 to 1000000000, got "2" (str)'),
    ("other-step", "its step 7 is not the folder's step 2"),
    ("list-state", "trainer_state.json is not a JSON object but list"),
    ("bad-sampler", "sampler_state must be {epoch, offset}: integers >= 0"),
    ("nan-kl", "kl_ctl must be a mapping of finite numbers"),
])
def test_tampered_checkpoint_is_one_line(run, done, tmp_path, how, needle):
    d = tampered(done, tmp_path, how)
    if how == "fifo-optimizer": (d / "optimizer.pt").unlink(); pipe = Fifo(d / "optimizer.pt")   # a read would wait forever
    try: refused(*run("grpo", "--output_dir", tmp_path / "o", *TINY, "--resume_from_checkpoint", d), f"checkpoint {d}", needle)
    finally:
        if how == "fifo-optimizer": pipe.close()
    assert not (tmp_path / "o").exists()


def test_latest_refuses_a_checkpoint_link_leading_out_of_the_folder(run, done, tmp_path):
    out = tmp_path / "o"; shutil.copytree(done, out)
    os.symlink(tampered(done, tmp_path, "none"), out / "checkpoint-9")                  # planted, newest by its name
    before = (out / "metrics.jsonl").read_text()
    refused(*run("grpo", "--output_dir", out, *TINY, *LATEST), f"{out / 'checkpoint-9'} is a link to ", "outside")
    assert (out / "metrics.jsonl").read_text() == before and not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("cmd", ["dpo", "sft"])
def test_other_trainers_check_the_trainer_state_too(run, monkeypatch, tmp_path, cmd):
    args = {"dpo": ["--max_steps", 2, "--per_device_train_batch_size", 2, "--num_pairs", 4, "--num_eval_pairs", 0,
                    "--num_eval_prompts", 0, "--rejected_from_policy", "false", "--max_length", 32, "--eval_steps", 100],
            "sft": ["--max_steps", 2, "--n_train", 16, "--eval_size", 4, "--per_device_train_batch_size", 4]}[cmd]
    first = tmp_path / "first"
    fault_at(monkeypatch, 1, lambda: os.kill(os.getpid(), signal.SIGTERM))       # stopped: checkpoint-1 stays
    assert run(cmd, "--output_dir", first, *args)[0] == 128 + signal.SIGTERM
    monkeypatch.undo()
    cp = tmp_path / "checkpoint-1"; shutil.copytree(first / "checkpoint-1", cp)
    state = json.loads((cp / "trainer_state.json").read_text())
    key = "global_step" if "global_step" in state else "step"
    (cp / "trainer_state.json").write_text(json.dumps({**state, key: -1}))
    refused(*run(cmd, "--output_dir", tmp_path / "o", *args, "--resume_from_checkpoint", cp),
            f"trainer_state.json: {key} must be an integer from 0 to 1000000000, got -1 (int)")


# === advice that works ===============================================================================================

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    "The 3-step GRPO run, never stopped."
    out = tmp_path_factory.mktemp("reference") / "run"
    assert launch.main([str(a) for a in ["grpo", "--output_dir", out, *TINY]]) == 0
    return out


def fault_at(monkeypatch, step, fault):
    "Make `fault()` happen right after step `step` of the run loop (its row logged, its checkpoint not yet written)."
    real = RunLoop._advance
    def advance(self, n):
        out = real(self, n)
        if n == step: fault()
        return out
    monkeypatch.setattr(RunLoop, "_advance", advance)


def follow_the_advice(run, monkeypatch, recwarn, out, line, reference):
    "The line says `--resume_from_checkpoint latest`: run exactly that, with the faulty step undone; it finishes as if never stopped."
    assert RESUME in line, line
    monkeypatch.undo()
    monkeypatch.setenv("TQDM_DISABLE", "1"); monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
    rc, lines = run("grpo", "--output_dir", out, *TINY, *LATEST)
    assert rc == 0 and not [l for l in lines if ": error: " in l], lines
    assert metrics(out) == metrics(reference)                                # every step's metrics, timings aside
    assert not (out / LOCK_NAME).exists() and not [p for p in out.iterdir() if "tmp" in p.name]
    return [str(w.message) for w in recwarn]


def lose_a_rank():
    "What rank 0 raises when the other rank of a two-process run died in a collective (dist.rank_lost's own line)."
    from rlhf_nb.dist import rank_lost
    gone = subprocess.Popen(["true"]); gone.wait()                           # a PID that no longer runs
    raise rank_lost(RuntimeError("Connection closed by peer"), [os.getpid(), gone.pid])


def test_disk_full_before_the_first_checkpoint_then_latest_starts_over(run, monkeypatch, recwarn, tmp_path, reference):
    out = tmp_path / "o"
    with file_size_limit(200_000): rc, lines = run("grpo", "--output_dir", out, *TINY, "--save_steps", 1)
    line = refused(rc, lines, f"disk full writing {out / 'checkpoint-1'}", "free space, then " + RESUME)
    assert not list(out.glob("checkpoint-*")) and (out / "metrics.jsonl").exists()
    said = follow_the_advice(run, monkeypatch, recwarn, out, line, reference)
    assert any(f"no checkpoint-* folder in {out} yet, so the run starts from step 0" in w for w in said), said


def test_disk_full_after_a_checkpoint_then_latest_continues(run, monkeypatch, recwarn, tmp_path, reference):
    import resource
    out, old = tmp_path / "o", resource.getrlimit(resource.RLIMIT_FSIZE)
    fault_at(monkeypatch, 2, lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, old[1])))   # checkpoint-2 does not fit
    try: rc, lines = run("grpo", "--output_dir", out, *TINY, "--save_steps", 1)
    finally: resource.setrlimit(resource.RLIMIT_FSIZE, old)                        # space freed
    line = refused(rc, lines, f"disk full writing {out / 'checkpoint-2'}")
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-1"]
    follow_the_advice(run, monkeypatch, recwarn, out, line, reference)


@pytest.mark.parametrize("at,save_steps,left", [(1, 2, []), (2, 1, ["checkpoint-1"])], ids=["before-a-checkpoint", "after-one"])
def test_lost_rank_then_latest(run, monkeypatch, recwarn, tmp_path, reference, at, save_steps, left):
    out = tmp_path / "o"
    fault_at(monkeypatch, at, lose_a_rank)
    line = refused(*run("grpo", "--output_dir", out, *TINY, "--save_steps", save_steps), "rank 1 (PID ", "died; this rank")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == left and not (out / LOCK_NAME).exists()
    follow_the_advice(run, monkeypatch, recwarn, out, line, reference)


def test_sigterm_then_latest(run, monkeypatch, recwarn, tmp_path, reference):
    out = tmp_path / "o"
    fault_at(monkeypatch, 1, lambda: os.kill(os.getpid(), signal.SIGTERM))    # a scheduler pre-empts the job
    rc, lines = run("grpo", "--output_dir", out, *TINY)
    assert rc == 128 + signal.SIGTERM and lines[0].startswith("rlhf-nb: SIGTERM received: finishing this step"), (rc, lines)
    assert lines[1:] == [f"rlhf-nb grpo: stopped by SIGTERM after step 1; checkpoint written to {out / 'checkpoint-1'}: {RESUME}"]
    follow_the_advice(run, monkeypatch, recwarn, out, lines[1], reference)


def test_latest_on_a_finished_run_without_checkpoints_is_refused(run, tmp_path):
    "Starting over would replace a result: only --overwrite_output_dir may do that."
    out = tmp_path / "o"
    assert run("grpo", "--output_dir", out, *TINY, "--save_final", "false")[0] == 0 and not list(out.glob("checkpoint-*"))
    refused(*run("grpo", "--output_dir", out, *TINY, *LATEST), f"{out} holds a finished run (summary.json)",
            "pass --overwrite_output_dir true to train it again")

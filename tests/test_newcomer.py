"""A newcomer's first hour: the README's commands as a new user types them, and the mistakes a new user makes.

Every command runs the real console script (`rlhf-nb ...` in a subprocess, offline, the repository first on PYTHONPATH)
in a fresh temporary folder. Each mistake must cost exactly one line on stderr, exit status 2, and nothing written:
the output folder is absent, or unchanged when it existed. Most cases fail while the options are parsed; those run through
the same `rlhf_nb.launch.main` in this process (one interpreter start-up instead of twenty), the rest through the
console script, so the whole file stays fast. The runs that train use the tiny model for one step.
"""
import json, os, resource, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k not in ("RLHF_NB_DEBUG", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
ENV.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", TQDM_DISABLE="1")
ONE_STEP = ["--max_steps", 1, "--per_device_train_batch_size", 2, "--num_generations", 2, "--max_completion_length", 2,
            "--eval_steps", 0, "--arith_train_size", 4, "--disable_tqdm", "true"]


def rlhf_nb(*args, cwd, limit=None, timeout=300):
    "The console script in a subprocess: -> CompletedProcess. `limit`: a file-size limit (RLIMIT_FSIZE) in bytes."
    exe = shutil.which("rlhf-nb")
    cmd = ([exe] if exe else [sys.executable, "-m", "rlhf_nb.launch"]) + [str(a) for a in args]
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)                     # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=timeout, preexec_fn=pre if limit else None)


def error_line(r, *needles):
    "Exit status 2, exactly one stderr line starting with 'rlhf-nb', no traceback, every needle in it: -> the line."
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    errs = [l for l in lines if l.startswith("rlhf-nb")]
    assert r.returncode == 2, f"status {r.returncode}; stderr: {r.stderr[-2000:]}"
    assert len(errs) == 1 and "Traceback" not in r.stderr, f"not one error line: {lines[-20:]}"
    for n in needles: assert n in errs[0], f"{n!r} not in {errs[0]!r}"
    return errs[0]


def snapshot(folder):
    "{relative path: (size, mtime)} of every file under `folder` ({} when it does not exist)."
    folder = Path(folder)
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


# --- the first commands: help, fast --------------------------------------------------------------------------------

def test_help_lists_subcommands_quickly(tmp_path):
    t0 = time.time(); r = rlhf_nb("--help", cwd=tmp_path); took = time.time() - t0
    assert r.returncode == 0 and "grpo" in r.stdout and "sft" in r.stdout
    assert took < 5, f"rlhf-nb --help took {took:.1f}s"                      # bench/cli_startup.py measures it properly


def test_grpo_help_is_grouped_and_for_grpo(tmp_path):
    t0 = time.time(); r = rlhf_nb("grpo", "--help", cwd=tmp_path); took = time.time() - t0
    assert took < 5, f"rlhf-nb grpo --help took {took:.1f}s"                 # no torch on this path; bench/cli_startup.py times it
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    for group in ("ModelDataArgs:", "BatchArgs:", "ObjectiveArgs:", "LoopArgs:", "LaunchArgs:"): assert group in out, group
    for ppo_only in ("--lam ", "--vf_coef", "--critic_learning_rate", "--loss_agg_mode"): assert ppo_only not in out, ppo_only
    assert "(default: None)" not in out and "this notebook" not in out
    assert "terms:" in out and "k3 = exp(-d) + d - 1" in out and "FSDP2:" in out and "verl rows:" in out
    assert "--max_steps INT" in out and ">= 1" in out                          # types and ranges shown


def test_readme_one_step_run_then_second_run_is_refused(tmp_path):
    out = tmp_path / "run"
    r = rlhf_nb("grpo", "--output_dir", out, *ONE_STEP, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    before = snapshot(out)
    assert "metrics.jsonl" in before
    r = rlhf_nb("grpo", "--output_dir", out, *ONE_STEP, cwd=tmp_path)
    error_line(r, f"--output_dir {out} already holds a run", "--overwrite_output_dir", "--resume_from_checkpoint")
    assert snapshot(out) == before                                             # nothing replaced


def test_overwrite_replaces_the_previous_run(tmp_path):
    out = tmp_path / "run"
    steps = ["--max_steps", 2, "--save_steps", 1] + ONE_STEP[2:]
    r = rlhf_nb("grpo", "--output_dir", out, *steps, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert {"checkpoint-1", "checkpoint-2"} <= {p.name for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")
    r = rlhf_nb("grpo", "--output_dir", out, *ONE_STEP, "--overwrite_output_dir", "true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "removed the previous run's checkpoint-1, checkpoint-2" in r.stderr
    names = {p.name for p in out.iterdir()}
    assert "checkpoint-2" not in names and "checkpoint-1" in names and (out / "notes.txt").read_text() == "mine"
    assert max(json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()) <= 1   # the new run's rows only


# --- mistakes: one line, status 2, nothing written -------------------------------------------------------------------

BAD = {
    "typo in a subcommand": (["grpoo"], ["unknown subcommand 'grpoo'", "did you mean 'grpo'?"]),
    "typo in an option": (["grpo", "--lerning_rate", "1e-3"], ["unknown option --lerning_rate; did you mean --learning_rate?"]),
    "option of no command": (["sft", "--frobnicate", "1"], ["unknown option --frobnicate"]),
    "max_steps -1": (["grpo", "--max_steps", "-1"], ["--max_steps -1 is out of range: it must be >= 1"]),
    "max_steps 0": (["ppo", "--max_steps", "0"], ["--max_steps 0 is out of range"]),
    "batch size 0": (["grpo", "--per_device_train_batch_size", "0"], ["--per_device_train_batch_size 0 is out of range"]),
    "one generation per group... negative": (["grpo", "--num_generations", "-2"], ["--num_generations -2 is out of range"]),
    "learning rate 0": (["ppo", "--learning_rate", "0"], ["--learning_rate 0.0 is out of range: it must be > 0"]),
    "top_p above 1": (["grpo", "--top_p", "1.5"], ["--top_p 1.5 is out of range: it must be > 0 and <= 1"]),
    "gamma above 1": (["ppo", "--gamma", "2"], ["--gamma 2.0 is out of range"]),
    "negative KL coefficient": (["grpo", "--beta", "-0.1"], ["--beta -0.1 is out of range"]),
    "temperature 0": (["grpo", "--temperature", "0"], ["--temperature 0.0 is out of range"]),
    "lora dropout 1": (["ppo", "--lora_dropout", "1"], ["--lora_dropout 1.0 is out of range"]),
    "dpo beta 0": (["dpo", "--beta", "0"], ["--beta 0.0 is out of range"]),
    "sft max_steps 0": (["sft", "--max_steps", "0"], ["--max_steps 0 is out of range"]),
    "rm batch size 0": (["rm", "--per_device_train_batch_size", "0"], ["--per_device_train_batch_size 0 is out of range"]),
    "eval size 0": (["eval", "--model_name_or_path", "tiny", "--eval_size", "0"], ["--eval_size 0 is out of range"]),
    "demo max_steps -5": (["demo", "--max_steps", "-5"], ["--max_steps -5 is out of range"]),
    "not a number": (["grpo", "--max_steps", "ten"], ["invalid int value: 'ten'"]),
    "not a bool": (["grpo", "--use_peft", "maybe"], ["expected true or false, got 'maybe'"]),
    "model path is a text file": (["grpo", "--model_name_or_path", "notamodel.txt"], ["notamodel.txt is a file, not a model folder"]),
    "model path is an empty folder": (["sft", "--model_name_or_path", "empty"], ["empty has no config.json"]),
    "output_dir is a file": (["grpo", "--output_dir", "notamodel.txt"], ["exists and is not a folder"]),
    "missing config file": (["grpo", "--config", "no_such.yaml"], ["config file not found: no_such.yaml"]),
}


SUBPROCESS = {"typo in a subcommand", "typo in an option", "model path is a text file", "model path is an empty folder"}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line(case, tmp_path, capsys, monkeypatch):
    args, needles = BAD[case]
    (tmp_path / "notamodel.txt").write_text("not a model\n"); (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    extra = [] if "--output_dir" in args or args[0] in ("grpoo", "eval") else ["--output_dir", out]
    if case in SUBPROCESS: r = rlhf_nb(*args, *extra, cwd=tmp_path)
    else:
        monkeypatch.chdir(tmp_path); monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
        from rlhf_nb import launch
        capsys.readouterr()
        r = subprocess.CompletedProcess(args, launch.main([str(a) for a in args + extra]), "", capsys.readouterr().err)
    error_line(r, *needles)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notamodel.txt"]


@pytest.mark.parametrize("text,needles", [
    ("max_steps: many\n", ["run.yaml: max_steps: invalid int value: 'many'"]),
    ("max_steps: -1\n", ["run.yaml: max_steps -1 is out of range: it must be >= 1"]),
    ("use_peft: maybe\n", ["run.yaml: use_peft: expected true or false"]),
    ("lerning_rate: 0.1\n", ["run.yaml: unknown option lerning_rate; did you mean learning_rate?"]),
])
def test_bad_yaml_names_the_file_and_key(text, needles, tmp_path):
    (tmp_path / "run.yaml").write_text(text)
    error_line(rlhf_nb("grpo", "--config", "run.yaml", "--output_dir", tmp_path / "out", cwd=tmp_path), *needles)
    assert not (tmp_path / "out").exists()


# --- a full disk: the one DiskFull line, no half-written folder ------------------------------------------------------

def test_full_disk_while_preparing_data(tmp_path):
    r = rlhf_nb("prep", "arith", "--out", tmp_path / "data", "--n_train", 20000, "--n_test", 100, cwd=tmp_path, limit=16 * 1024)
    error_line(r, "disk full writing", "a file reached the size limit")
    assert not (tmp_path / "data").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".data")]


def test_full_disk_while_saving_sft_model(tmp_path):
    out = tmp_path / "sft"
    r = rlhf_nb("sft", "--output_dir", out, "--max_steps", 1, "--n_train", 16, "--eval_size", 4, "--eval_steps", 0,
                cwd=tmp_path, limit=64 * 1024)
    error_line(r, "disk full writing", "a file reached the size limit")
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not {"config.json", "model.safetensors", "tokenizer.json"} & set(left), left     # no half-saved model
    assert not [p for p in [*tmp_path.iterdir(), *out.glob("*")] if ".tmp" in p.name]       # no temporary folder left


def test_safetensors_full_disk_anywhere_is_the_diskfull_line(capsys, monkeypatch, tmp_path):
    "safetensors' own words for a full disk (no errno), raised by any stage, end as the one DiskFull line."
    from rlhf_nb import launch
    monkeypatch.delenv("RLHF_NB_DEBUG", raising=False); monkeypatch.chdir(tmp_path)
    class SafetensorError(Exception): pass
    for text in ("Error while serializing: I/O error: File too large (os error 27)", "I/O error: No space left on device (os error 28)"):
        def stage(argv): raise SafetensorError(text)
        launch.register_subcommand("_full", stage)
        try:
            capsys.readouterr(); rc = launch.main(["_full"])
        finally: del launch.SUBCOMMANDS["_full"]
        error_line(subprocess.CompletedProcess([], rc, "", capsys.readouterr().err), "rlhf-nb _full: error: disk full writing")

"""Hostile inputs at the readers the first hardening pass left: every YAML file the CLI reads, the line a fresh start
prints, and dataset rows that name code in a trainer's start-up.

- Every YAML reader goes through `config.read_yaml_config` (a regular file of at most 1 MiB, no aliases): the
  accelerate config (`--accelerate_config`), `prep --config`, `trl NAME --config`, and the configs `stage_hint` scans
  for its advice. A billion-laughs file, an oversize one or a named pipe is one line with exit status 2; a scanned
  one is skipped and the advice still comes.
- `--resume_from_checkpoint latest` with no checkpoint yet starts over, and the line that says what was removed names
  that option, not `--overwrite_output_dir`, which the user never gave.
- A train or held-out row whose `extra_info.environment` the run did not register is refused while the trainer loads
  its data: one line naming the dataset and the row, exit status 2, before any step, the output folder left as any
  run refused at its start leaves it, and nothing the row names imported.

Every run goes through the CLI's `rlhf_nb.launch.main` in this process (tiny GRPO runs, one step).
"""
import sys
from pathlib import Path

import pytest

from rlhf_nb.arith import make_calc
from rlhf_nb.config import CONFIG_MAX_BYTES
from rlhf_nb.data import write_parquet
from test_hostile_inputs import LATEST, TINY, Fifo, refused, run   # run: the in-process CLI fixture

ONE_STEP = [*TINY, "--max_steps", 1]


def bomb_text(levels=9, width=10):
    "A billion-laughs YAML file: each level lists the previous one `width` times (width**levels leaves)."
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


HOSTILE = {"bomb": "YAML alias *l0 on line 2 refused",
           "oversize": f"bytes is over the {CONFIG_MAX_BYTES} bytes a configuration file may have",
           "fifo": "not a regular file"}


@pytest.fixture
def hostile(tmp_path):
    "-> make(kind, name): a hostile YAML file of `kind` at tmp_path/name; named pipes are released at teardown."
    pipes = []
    def make(kind, name="hostile.yaml", folder=tmp_path):
        p = Path(folder) / name
        if kind == "bomb": p.write_text(bomb_text())
        elif kind == "oversize": p.write_text("# " + "x" * CONFIG_MAX_BYTES + "\nmax_steps: 1\n")
        else: pipes.append(Fifo(p))
        return p
    yield make
    for f in pipes: f.close()


# === every YAML reader ==============================================================================================

READERS = {"accelerate": lambda f, out: ("grpo", "--output_dir", out, *ONE_STEP, "--accelerate_config", f),
           "prep": lambda f, out: ("prep", "--config", f),
           "trl sft": lambda f, out: ("trl", "sft", "--config", f),
           "trl ppo": lambda f, out: ("trl", "ppo", "--config", f, "--output_dir", out)}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_yaml_reader_refuses_a_hostile_file_in_one_line(run, hostile, tmp_path, reader, kind):
    f, had_trl = hostile(kind), "trl" in sys.modules
    args = READERS[reader](f, tmp_path / "o")
    line = refused(*run(*args), str(f), HOSTILE[kind])
    assert line.startswith(f"rlhf-nb {args[0]}: error: {f}: "), line
    assert not (tmp_path / "o").exists() and (had_trl or "trl" not in sys.modules)   # refused before TRL or a run starts


def test_stage_hint_skips_hostile_configs_and_still_advises(run, hostile, tmp_path, monkeypatch):
    "The configs a missing input folder is looked up in: a pipe, a bomb and an oversize file are passed over."
    monkeypatch.chdir(tmp_path); (tmp_path / "configs").mkdir()
    for kind, name in (("bomb", "a_bomb.yaml"), ("oversize", "b_big.yaml"), ("fifo", "c_pipe.yaml")):
        hostile(kind, name, tmp_path / "configs")
    (tmp_path / "configs" / "sft_x.yaml").write_text("output_dir: runs/sft_x\n")
    refused(*run("grpo", "--model_name_or_path", "runs/sft_x", "--output_dir", "o", *ONE_STEP),
            "--model_name_or_path runs/sft_x does not exist yet: run `rlhf-nb sft --config configs/sft_x.yaml` first")


# === the line of a fresh start =======================================================================================

def removal_lines(lines): return [l for l in lines if "removed the previous run's" in l]


@pytest.mark.parametrize("how", ["flag", "config"])
def test_latest_with_no_checkpoint_says_it_starts_over(run, tmp_path, how):
    out = tmp_path / "o"; out.mkdir(); (out / "metrics.jsonl").write_text('{"step": 1}\n')   # an earlier run, no checkpoint
    if how == "flag": args = ("grpo", "--output_dir", out, *ONE_STEP, *LATEST)
    else:
        (tmp_path / "run.yaml").write_text(f"output_dir: {out}\nresume_from_checkpoint: latest\n")
        args = ("grpo", "--config", tmp_path / "run.yaml", *ONE_STEP)
    rc, lines = run(*args)
    assert rc == 0 and removal_lines(lines) == [
        f"rlhf-nb grpo: --resume_from_checkpoint latest found no checkpoint-* folder in {out}, so the run starts over: "
        "removed the previous run's metrics.jsonl"], lines
    assert not any("--overwrite_output_dir" in l for l in lines), lines
    assert (out / "summary.json").exists()


def test_overwrite_still_names_overwrite(run, tmp_path):
    out = tmp_path / "o"; out.mkdir(); (out / "metrics.jsonl").write_text('{"step": 1}\n')
    rc, lines = run("grpo", "--output_dir", out, *ONE_STEP, "--overwrite_output_dir", "true")
    assert rc == 0 and removal_lines(lines) == [
        f"rlhf-nb grpo: --overwrite_output_dir: starting over in {out}: removed the previous run's metrics.jsonl"], lines


# === dataset rows that name code =====================================================================================

def calc_data(folder, where=None, name=None, row=2):
    "calc train/test parquet files in `folder`; row `row` of split `where` names environment `name`."
    splits = {"train": make_calc(8, "train"), "test": make_calc(4, "test")}
    if where:
        r = splits[where][row]; splits[where][row] = dict(r, extra_info={**r["extra_info"], "environment": name})
    for split, rows in splits.items(): write_parquet(rows, Path(folder) / f"{split}.parquet")
    return folder


AGENT = ["--environment", "calculator", "--max_tool_calling_iterations", 1, "--eval_steps", 1, "--eval_size", 4]


@pytest.mark.parametrize("where,name", [("train", "os:getpid"), ("test", "this:s"), ("train", "builtins:input")])
def test_a_row_naming_code_is_refused_at_start(run, tmp_path, where, name):
    assert "this" not in sys.modules
    data = calc_data(tmp_path / "data", where, name)
    line = refused(*run("grpo", "--output_dir", tmp_path / "o", *ONE_STEP, *AGENT, "--dataset", data))
    which = {"train": "train", "test": "eval"}[where]
    assert line == (f"rlhf-nb grpo: error: {which} dataset: row 2 (extra_info.index 2): extra_info.environment {name!r} "
                    "is not an environment of this run; a row may name calculator (the configuration's environment "
                    "option adds one)"), line
    assert "this" not in sys.modules                                       # nothing the row names was imported
    # the output folder as a run refused at the same point leaves it (here: too few prompts for one step)
    few = calc_data(tmp_path / "few"); write_parquet(make_calc(1, "train"), few / "train.parquet")
    refused(*run("grpo", "--output_dir", tmp_path / "o2", *ONE_STEP, *AGENT, "--dataset", few), "fewer than one step needs")
    listing = lambda p: sorted(q.name for q in p.iterdir()) if p.exists() else None
    assert listing(tmp_path / "o") == listing(tmp_path / "o2") and not (tmp_path / "o").exists()


def test_registered_rows_still_train(run, tmp_path):
    "The same tiny agent run with every row naming a registered environment (or none) trains its step."
    rc, lines = run("grpo", "--output_dir", tmp_path / "o", *ONE_STEP, *AGENT, "--dataset", calc_data(tmp_path / "data"))
    assert rc == 0 and not any(": error: " in l for l in lines), lines
    assert (tmp_path / "o" / "summary.json").exists()

"""`rlhf-nb prep` end to end: outputs, bad input (one stderr line, nothing half-written), the hub code path,
two processes preparing once, and the real-data counts from ../shared/data (skipped when absent)."""
import gzip, json, os, re, shutil, subprocess, sys, textwrap, socket
from pathlib import Path

import pytest
import pyarrow.parquet as pq

from rlhf_nb import arith, data, prep

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_shared = lambda sub: pytest.mark.skipif(not (SHARED / sub).exists(), reason=f"real data {SHARED / sub} is absent")
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def cli(*args, timeout=300):
    "Run the real console script (`python -m rlhf_nb.launch` if it is not on PATH)."
    exe = shutil.which("rlhf-nb")
    cmd = ([exe] if exe else [sys.executable, "-m", "rlhf_nb.launch"]) + ["prep", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=OFFLINE, cwd=ROOT)


def prep_inproc(capsys, *args):
    "Call `prep_main` in this process: (exit status, stdout, stderr)."
    rc = prep.prep_main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def write_jsonl(path, recs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def no_temp_left(folder):
    return [p.name for p in Path(folder).iterdir() if ".tmp" in p.name]


def rows_of(path): return pq.read_table(path).to_pylist()


# --- the happy path through the real console script ------------------------------------------------------------

def test_arith_cli_writes_train_and_test(tmp_path):
    out = tmp_path / "arith"
    r = cli("arith", "--out", out, "--n_train", 300, "--n_test", 40, "--seed", 1)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["prep.json", "test.parquet", "train.parquet"]
    train, test = rows_of(out / "train.parquet"), rows_of(out / "test.parquet")
    assert (len(train), len(test)) == (300, 40)
    for row in train + test:
        q = row["prompt"][0]["content"]
        m = re.fullmatch(r"Q: (\d\d)\+(\d\d)=", q)
        assert m and row["prompt"][0]["role"] == "user", q
        ans = int(m.group(1)) + int(m.group(2))
        assert row["completion"] == f"{ans} #### {ans}" and row["reward_model"] == {"style": "rule", "ground_truth": str(ans)}
    # train/test disjoint, and the files are what the library function returns
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    assert data.read_rows(out / "train.parquet", kind="sft") == arith.prep_arith(300, 40, seed=1)["train"]
    assert json.loads((out / "prep.json").read_text())["rows"] == {"train": 300, "test": 40}
    assert "300 rows" in r.stdout and no_temp_left(tmp_path) == []


def test_arith_disjoint_across_seeds_and_forms():
    key = lambda r: r["extra_info"]["expression"]
    for kw in [dict(), dict(ops="+-*", steps=2), dict(digits=1), dict(ops="+*", steps=3, word_problems=0.5)]:
        train = {key(r) for s in (0, 1, 2) for r in arith.make_arith(2000, "train", seed=s, **kw)}
        test = {key(r) for s in (0, 1, 2) for r in arith.make_arith(200, "test", seed=s, **kw)}
        assert train and test and not train & test, kw


def test_hh_variants_and_rows_roundtrip(tmp_path, capsys):
    src = tmp_path / "hh" / "harmless-base-test.jsonl.gz"
    src.parent.mkdir()
    pairs = [("\n\nHuman: hi\n\nAssistant: hello\n\nHuman: help?\n\nAssistant: sure", "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: help?\n\nAssistant: no"),
             ("\n\nHuman: q\n\nAssistant: ", "\n\nHuman: q\n\nAssistant: a")]
    with gzip.open(src, "wt") as f: f.write("".join(json.dumps({"chosen": c, "rejected": r}) + "\n" for c, r in pairs))
    for variant, extra in [("rm", {"chosen", "rejected"}), ("sft", {"completion"}), ("rl", set())]:
        rc, out, err = prep_inproc(capsys, "hh-rlhf", "--source", src.parent, "--variant", variant, "--out", tmp_path / variant)
        assert rc == 0, err
        assert not (tmp_path / variant / "train.parquet").exists()  # the source has only a test split
        rows = rows_of(tmp_path / variant / "test.parquet")
        assert extra <= set(rows[0]) and not ({"chosen", "rejected", "completion"} - extra) & set(rows[0])
        assert rows[0]["prompt"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                                     {"role": "user", "content": "help?"}]
        assert len(rows) == (1 if variant == "sft" else 2)      # sft leaves out the empty chosen answer ...
        assert ("empty" in err) and err.startswith("note:")   # ... and says so, as rm/rl say they kept it
    # `rows` re-validates prepared files of any format
    rc, _, err = prep_inproc(capsys, "rows", "--kind", "pref", "--source", tmp_path / "rm" / "test.parquet", "--out", tmp_path / "again")
    assert rc == 0, err
    assert rows_of(tmp_path / "again" / "test.parquet") == rows_of(tmp_path / "rm" / "test.parquet")


# --- bad input: exit 1, one clear line on stderr, nothing half-written -----------------------------------------

GOOD = {"question": "1+1?", "answer": "1+1=2\n#### 2"}
BAD_CASES = {
    # name: (files to write under src/, extra argv, substrings the one stderr line must contain)
    "missing question column": ({"train.jsonl": [GOOD, {"q": "2+2?", "answer": "#### 4"}]}, ["gsm8k"],
                                ["train.jsonl", "row 1", "missing column 'question'"]),
    "empty prompt (question)": ({"train.jsonl": [GOOD, GOOD, {"question": "  ", "answer": "#### 4"}]}, ["gsm8k"],
                                ["train.jsonl", "row 2", "column 'question' is empty"]),
    "non-string answer": ({"test.jsonl": [{"question": "2+2?", "answer": 4}]}, ["gsm8k"],
                          ["test.jsonl", "row 0", "column 'answer' must be a string, got int"]),
    "missing prompt column (rows)": ({"train.jsonl": [{"data_source": "x", "ability": "math",
                                                        "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {}}]},
                                     ["rows"], ["train.jsonl", "row 0", "column 'prompt' is missing"]),
    "empty prompt (rows)": ({"train.jsonl": [{"data_source": "x", "prompt": [], "ability": "math",
                                               "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {}}]},
                            ["rows"], ["train.jsonl", "row 0", "column 'prompt' is empty"]),
    "missing problem column (math)": ({"train.jsonl": [{"question": "x", "solution": "\\boxed{1}"}]}, ["math"],
                                      ["train.jsonl", "row 0", "missing column 'problem'"]),
    "missing chosen column (hh)": ({"test.jsonl": [{"rejected": "\n\nHuman: a\n\nAssistant: b"}]}, ["hh-rlhf"],
                                   ["test.jsonl", "row 0", "missing column 'chosen'"]),
    "invalid json": ({"train.jsonl": "{\"question\": 1\n"}, ["gsm8k"], ["train.jsonl", "line 1", "not valid JSON"]),
    "corrupt gzip": ({"train.jsonl.gz": b"not gzip at all"}, ["gsm8k"], ["train.jsonl.gz", "could not read"]),
    "no data files in dir": ({"notes.txt": "hello"}, ["gsm8k"], ["no train/test data files"]),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_one_line_nothing_written(tmp_path, capsys, case):
    files, argv, expect = BAD_CASES[case]
    src = tmp_path / "src"; src.mkdir()
    for name, content in files.items():
        if isinstance(content, list): write_jsonl(src / name, content)
        elif isinstance(content, bytes): (src / name).write_bytes(content)
        else: (src / name).write_text(content)
    # `out` already holds a good earlier run: a failed prep must leave it exactly as it was
    out = tmp_path / "out"
    assert prep.prep_main(["arith", "--out", str(out), "--n_train", "20", "--n_test", "5"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    rc, stdout, err = prep_inproc(capsys, *argv, "--source", src, "--out", out)
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlhf-nb prep: error: "), err
    for s in expect: assert s in lines[0], (s, lines[0])
    assert "Traceback" not in err and stdout == ""
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert no_temp_left(tmp_path) == []


def test_bad_input_through_console_script(tmp_path):
    "The same one-line errors from the real `rlhf-nb prep` process, for an unknown NAME and an unreadable path."
    for argv, expect in [(["nope", "--out", tmp_path / "o"], "unknown dataset 'nope'; choose one of: gsm8k, math, hh-rlhf, arith"),
                         (["gsm8k", "--source", tmp_path / "missing" / "gsm8k.jsonl", "--out", tmp_path / "o"],
                          "missing/gsm8k.jsonl: no such file or directory")]:
        r = cli(*argv)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and expect in lines[0], r.stderr
        assert not (tmp_path / "o").exists() and no_temp_left(tmp_path) == []


@pytest.mark.parametrize("argv,expect", [
    (["arith", "--variant", "rm"], "option --variant does not apply to arith"),
    (["arith", "--source", "x"], "arith is generated: it takes no --source"),
    (["hh-rlhf", "--variant", "ppo"], "argument --variant: invalid choice"),
    (["arith", "--n_train", "ten"], "argument --n_train"),
    (["arith", "--ops", "/"], "ops must be made of"),
    (["gsm8k"], "the following arguments are required: --out"),
])
def test_bad_options_one_line(tmp_path, capsys, argv, expect):
    args = argv + ([] if "gsm8k" in argv else ["--out", str(tmp_path / "o")])
    rc, _, err = prep_inproc(capsys, *args)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and expect in err, err
    assert not (tmp_path / "o").exists()


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch, capsys):
    "A crash after train.parquet was written (disk full, killed...) leaves neither it nor the temp dir."
    real = data.write_parquet
    def flaky(rows, path, kind="rl"):
        if Path(path).name == "test.parquet": raise OSError("No space left on device")
        return real(rows, path, kind)
    monkeypatch.setattr(prep, "write_parquet", flaky)
    rc, _, err = prep_inproc(capsys, "arith", "--out", tmp_path / "o", "--n_train", "10", "--n_test", "5")
    assert rc == 1 and "No space left on device" in err
    assert not (tmp_path / "o").exists() and no_temp_left(tmp_path) == []


# --- the hub code path (no network: load_dataset is replaced by a recorder) ------------------------------------

def test_hub_names_used_without_source(monkeypatch):
    import datasets
    calls = []
    def fake_load(path, **kw):
        name = path
        calls.append((name, kw))
        if name == "openai/gsm8k": return datasets.DatasetDict(train=datasets.Dataset.from_list([GOOD]))
        if name == "EleutherAI/hendrycks_math":
            return datasets.DatasetDict(test=datasets.Dataset.from_list([{"problem": "p", "solution": "\\boxed{3}", "level": "Level 1", "type": kw["name"]}]))
        if name == "Anthropic/hh-rlhf":
            return datasets.DatasetDict(test=datasets.Dataset.from_list([{"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: a\n\nAssistant: c"}]))
        raise ConnectionError("offline")
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    assert data.prep_gsm8k()["train"][0]["reward_model"]["ground_truth"] == "2"
    assert calls[-1] == ("openai/gsm8k", {"name": "main"})
    m = data.prep_math()
    assert [r["extra_info"]["type"] for r in m["test"]] == list(data.MATH_SUBJECTS)
    assert [c[1]["name"] for c in calls[-7:]] == list(data.MATH_SUBJECTS)
    assert data.prep_hh()["test"][0]["chosen"] == "b" and calls[-1] == ("Anthropic/hh-rlhf", {"data_dir": "harmless-base"})
    with pytest.raises(data.DataError, match="could not load 'nobody/nothing' from the Hugging Face hub .*pass --source"):
        data.prep_gsm8k(hub="nobody/nothing")


# --- many processes, one prep ---------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def test_two_processes_prepare_once(tmp_path):
    "Under `accelerate launch` with 2 CPU processes, `load_or_prep` runs the preprocessor once; both ranks read the same rows."
    if not shutil.which("accelerate"): pytest.skip("accelerate CLI not on PATH")
    script = tmp_path / "two.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        from accelerate import PartialState
        from rlhf_nb import arith, prep
        def counted(**kw):
            with open({str(tmp_path / "calls.log")!r}, "a") as f: f.write(str(os.getpid()) + "\\n")
            return arith.prep_arith(**kw)
        prep.register_preprocessor("counted", counted)
        sp = prep.load_or_prep("counted", {str(tmp_path / "out")!r}, n_train=64, n_test=8)
        st = PartialState()
        with open({str(tmp_path / "ranks.log")!r}, "a") as f:
            f.write(json.dumps([st.process_index, st.num_processes, len(sp["train"]), sp["train"][5]["prompt"][0]["content"]]) + "\\n")
    """))
    env = {**OFFLINE, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(_free_port()), str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = sorted(json.loads(l) for l in (tmp_path / "ranks.log").read_text().splitlines())
    assert [x[:3] for x in ranks] == [[0, 2, 64], [1, 2, 64]] and ranks[0][3] == ranks[1][3]
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1


# --- real data (../shared/data) --------------------------------------------------------------------------------

@needs_shared("gsm8k")
def test_gsm8k_real(tmp_path):
    r = cli("gsm8k", "--source", SHARED / "gsm8k", "--out", tmp_path / "g")
    assert r.returncode == 0, r.stderr
    for split, n in (("train", 7473), ("test", 1319)):
        rows = rows_of(tmp_path / "g" / f"{split}.parquet")
        raw = [json.loads(l) for l in (SHARED / "gsm8k" / f"{split}.jsonl").read_text().splitlines() if l.strip()]
        assert len(rows) == len(raw) == n
        for row, rec in zip(rows, raw):
            after = rec["answer"].rsplit("####", 1)[1].strip().replace(",", "")
            assert row["reward_model"]["ground_truth"] == after and row["extra_info"]["question"] == rec["question"]
            assert row["data_source"] == "openai/gsm8k" and rec["question"].strip() in row["prompt"][0]["content"]


@needs_shared("math")
def test_math_real(tmp_path, capsys):
    rc, out, err = prep_inproc(capsys, "math", "--source", SHARED / "math", "--out", tmp_path / "m")
    assert rc == 0, err
    rows = rows_of(tmp_path / "m" / "train.parquet") + rows_of(tmp_path / "m" / "test.parquet")
    assert all(r["reward_model"]["ground_truth"].strip() for r in rows)
    assert len(rows) / 12500 >= 0.995
    # the rest is reported (count and examples), not silently dropped
    notes = json.loads((tmp_path / "m" / "prep.json").read_text())["notes"]
    m = re.search(r"(\d+) of (\d+) rows have no parsable", " ".join(notes))
    assert m and int(m.group(2)) == 12500 and int(m.group(1)) == 12500 - len(rows) and "row " in notes[0]
    assert "no parsable" in err
    levels = {r["extra_info"]["level"] for r in rows}
    assert {"Level 1", "Level 5"} <= levels and {r["extra_info"]["type"] for r in rows} >= {"Algebra", "Geometry"}


@needs_shared("hh-rlhf")
def test_hh_real_shared_prompt(tmp_path):
    r = cli("hh-rlhf", "--source", SHARED / "hh-rlhf", "--variant", "rm", "--out", tmp_path / "h")
    assert r.returncode == 0, r.stderr
    rows = rows_of(tmp_path / "h" / "test.parquet")
    raw = [json.loads(l) for l in gzip.open(SHARED / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt")]
    assert len(rows) == len(raw) == 2312
    # independent check: the prompt, written back as HH text, is a prefix of BOTH raw dialogues, each continuing
    # with an assistant turn whose text is that side's answer
    def hh_text(msgs): return "".join(f"\n\n{'Human' if m['role'] == 'user' else 'Assistant'}: {m['content']}" for m in msgs)
    norm = lambda s: re.sub(r"\s+", " ", s).strip()
    for row, rec in zip(rows, raw):
        head = norm(hh_text(row["prompt"]) + "\n\nAssistant:")
        for side in ("chosen", "rejected"):
            assert norm(rec[side]).startswith(head), row["extra_info"]
            assert norm(rec[side])[len(head):].strip() == norm(row[side])
        assert row["prompt"][-1]["role"] == "user"

"""The evaluation harness (rlhf_nb.evaluate): pass@k against hand values and math.comb, maj@k on hand cases with ties,
`rlhf-nb eval --n_samples` in-process with its output file, its one-line refusals, the pass@k plot, val/pass@k in RL."""
import json, math, random
from pathlib import Path
import pytest
from rlhf_nb import launch
from rlhf_nb.evaluate import pass_at_k, maj_at_k, default_ks, summarize


def test_pass_at_k_hand_values():
    assert [pass_at_k(4, 1, k) for k in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    assert [pass_at_k(4, 0, k) for k in (1, 2, 4)] == [0.0, 0.0, 0.0]                # c = 0: never
    assert [pass_at_k(4, 4, k) for k in (1, 2, 4)] == [1.0, 1.0, 1.0]                # c = n: always
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3) and pass_at_k(10, 3, 8) == 1.0  # fewer than k wrong: 1


def test_pass_at_k_equals_the_combinatorial_formula():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 100); c, k = rng.randint(0, n), rng.randint(1, n)
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12), (n, c, k)
    assert 0 < pass_at_k(1000, 1, 1) == pytest.approx(1e-3)                        # large n: no overflow


@pytest.mark.parametrize("args", [(4, 5, 1), (4, 1, 0), (3, 1, 4), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(args):
    with pytest.raises(ValueError, match="pass_at_k needs"): pass_at_k(*args)


def test_maj_at_k_hand_cases_and_the_tie_rule():
    "Ties share the credit: t answers tied for most votes score the mean of their scores (a random tie-break)."
    assert maj_at_k([7, 7, 3, 3], [1, 1, 0, 0], 1) == 0.5
    assert maj_at_k([7, 7, 3, 3], [1, 1, 0, 0], 2) == pytest.approx(0.5)        # (1 + 0 + 4 ties * 1/2) / 6
    assert maj_at_k([7, 7, 3, 3], [1, 1, 0, 0], 4) == 0.5                       # a 2-2 tie: half credit
    assert maj_at_k([7, 7, 3, 5], [1, 1, 0, 0], 3) == pytest.approx(2 / 3)      # (1 + 1 + 1/3 + 1/3) / 4
    assert maj_at_k([7, 7, 7, 3], [1, 1, 1, 0], 4) == 1.0
    assert maj_at_k([3, 3, 3, 7], [0, 0, 0, 1], 4) == 0.0                       # the majority is wrong
    assert maj_at_k([None, None, 7], [0, 0, 1], 2) == pytest.approx(2 / 3)      # no answer abstains
    assert maj_at_k([None, None], [0, 0], 2) == 0.0                             # nobody votes: 0
    with pytest.raises(ValueError, match="1 <= k <= n"): maj_at_k([1, 2], [1, 0], 3)


def test_summary_carries_per_source_metrics_and_intervals():
    recs = [{"data_source": ds, "n": 4, "n_correct": c, "answers": ["1"] * 4, "scores": [1.0] * c + [0.0] * (4 - c)}
            for ds, c in (("arith", 1), ("arith", 0), ("gsm8k", 4))]
    tab = summarize(recs, default_ks(4))
    assert sorted(tab) == ["all", "arith", "gsm8k"] and tab["arith"]["n_prompts"] == 2
    assert tab["arith"]["pass@1"] == pytest.approx(0.125) and tab["arith"]["pass@4"] == pytest.approx(0.5)
    assert tab["gsm8k"]["pass@1_ci95"] is None                                  # one prompt: no interval
    lo, hi = tab["all"]["pass@4_ci95"]; m = tab["all"]["pass@4"]
    assert 0 <= lo < m < hi <= 1 and tab["all"]["mean@4"] == pytest.approx(5 / 12)


@pytest.fixture
def in_process(capsys, monkeypatch):
    def _run(*args, cwd):
        monkeypatch.chdir(cwd); capsys.readouterr()
        rc = launch.main([str(a) for a in args])
        out = capsys.readouterr()
        return rc, out.out, out.err
    return _run


def test_cli_eval_n_samples_writes_per_prompt_counts_and_plots(tmp_path, in_process):
    rc, out, err = in_process("eval", "--model_name_or_path", "tiny", "--eval_size", "5", "--n_samples", "4",
                              "--temperature", "1.0", "--max_new_tokens", "6", "--output_file", "e.json", cwd=tmp_path)
    assert rc == 0, err
    line = json.loads(out.strip().splitlines()[-1])
    assert line["n"] == 5 and line["n_samples"] == 4 and line["ks"] == [1, 2, 4] and "prompts" not in line
    saved = json.loads((tmp_path / "e.json").read_text())
    assert len(saved["prompts"]) == 5 and saved["ci"].startswith("95% normal approximation")
    for p in saved["prompts"]:
        assert p["n"] == 4 and 0 <= p["n_correct"] <= 4 and len(p["answers"]) == len(p["scores"]) == 4
    for k in (1, 2, 4):                                                      # any reader recomputes pass@k
        assert saved["metrics"]["all"][f"pass@{k}"] == pytest.approx(
            sum(pass_at_k(p["n"], p["n_correct"], k) for p in saved["prompts"]) / 5)
        assert {f"maj@{k}", f"pass@{k}_ci95"} <= set(saved["metrics"]["arith"])
    assert saved["accuracy"] == saved["metrics"]["all"]["pass@1"]
    (tmp_path / "g.json").write_text(json.dumps({"accuracy": 0.2}))
    rc, out, err = in_process("plot", "--runs", "e.json", "g.json", "--output", "passk.png", cwd=tmp_path)
    assert rc == 0, err
    assert (tmp_path / "passk.png").stat().st_size > 10_000


@pytest.mark.parametrize("args,says", [
    (["--n_samples", "0"], "--n_samples 0 is out of range"),
    (["--temperature", "-1"], "--temperature -1.0 is out of range"),
    (["--n_samples", "4"], "--n_samples 4 with --temperature 0"),
    (["--n_samples", "4", "--temperature", "1", "--k", "1", "8"], "--k 8 needs 1 <= k <= --n_samples (4)"),
])
def test_cli_eval_refusals_are_one_line(tmp_path, in_process, args, says):
    rc, out, err = in_process("eval", "--model_name_or_path", "tiny", *args, cwd=tmp_path)
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("rlhf-nb eval: error:") and says in lines[0], err
    assert list(tmp_path.iterdir()) == []


def test_rl_training_logs_val_pass_at_k(tmp_path, in_process):
    rc, out, err = in_process("grpo", "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
                              "--max_completion_length", "6", "--arith_train_size", "16", "--eval_size", "3",
                              "--eval_steps", "1", "--val_n_samples", "2", "--disable_tqdm", "true",
                              "--save_final", "false", "--output_dir", "g", cwd=tmp_path)
    assert rc == 0, err
    rows = [json.loads(l) for l in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and all({"val/pass@1", "val/pass@2", "val/maj@2", "val/mean@2", "val/arith/pass@2"} <= set(r)
                                   for r in evals)
    assert all(r["val/pass@1"] <= r["val/pass@2"] <= 1 for r in evals)

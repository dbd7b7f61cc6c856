"""A learned reward model from the command line: mixed rule/model batches in `ppo` and `grpo`, evaluation on model
rows, the HH pipeline's stage chaining, and the data behind it (HH in both layouts, `--hh_subset`, HellaSwag)."""
import gzip, json
from pathlib import Path

import pytest

from rlhf_nb import launch, prep
from rlhf_nb.data import gsm8k_row, hh_row, read_rows, write_parquet
from rlhf_nb.tracking import read_metrics
from rlhf_nb.models import char_tokenizer, tiny_value_model
from rlhf_nb.rewards import compute_score

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--per_device_train_batch_size", "8", "--mini_batch_size", "8", "--max_completion_length", "6", "--max_steps", "1",
        "--eval_steps", "1", "--disable_tqdm", "true", "--eval_batch_size", "8"]


def _gsm(i): return gsm8k_row({"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i}+2={i+2}\n#### {i+2}"}, i, "train", "hand")
def _hh(i): return hh_row({"chosen": f"\n\nHuman: Tell me about {i}.\n\nAssistant: {i} is a number.",
                           "rejected": f"\n\nHuman: Tell me about {i}.\n\nAssistant: No."}, i, "train", "hand", variant="rl")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    "GSM8K rule rows and HH model rows in one dataset folder, and a tiny reward model folder with the policy's tokenizer."
    d = tmp_path_factory.mktemp("mixed")
    (d / "data").mkdir()
    write_parquet([_gsm(i) if i % 2 else _hh(i) for i in range(16)], d / "data" / "train.parquet")
    write_parquet([_gsm(i) if i % 2 else _hh(i) for i in range(16, 22)], d / "data" / "test.parquet")
    tok = char_tokenizer(); tiny_value_model(tok, seed=3, head_std=0.1).save_pretrained(d / "rm"); tok.save_pretrained(d / "rm")
    return d


@pytest.mark.parametrize("algo,extra", [("ppo", []), ("grpo", ["--num_generations", "2", "--per_device_train_batch_size", "4"])])
def test_mixed_batch_trains_one_step_with_per_source_metrics(mixed, tmp_path, algo, extra):
    out = tmp_path / algo
    rc = launch.main([algo, "--dataset", str(mixed / "data"), "--reward_model_path", str(mixed / "rm"), "--output_dir", str(out), *TINY, *extra])
    assert rc == 0
    rows = read_metrics(out)
    last = rows[-1]
    assert last["step"] == 1 and last["reward/Anthropic/hh-rlhf/count"] > 0 and last["reward/openai/gsm8k/count"] > 0
    for k in ("eval/accuracy", "eval/openai/gsm8k/accuracy", "eval/rm_score", "eval/Anthropic/hh-rlhf/rm_score", "eval/win_rate", "kl/mean"):
        assert k in last, k
    assert rows[0]["eval/win_rate"] == 0.5                           # before any update the policy is the reference
    summary = json.loads((out / "summary.json").read_text())
    assert [s for s, *_ in summary["eval_rm_score_win_rate"]] == [0, 1]


def test_hh_pipeline_stage_missing_is_one_line(tmp_path, capsys, monkeypatch):
    "From a clone with no runs/: each later stage names the command that builds its input."
    monkeypatch.chdir(tmp_path); (tmp_path / "configs").mkdir()
    for f in ("prep_hh", "sft_hh", "rm_hh", "ppo_hh"): (tmp_path / "configs" / f"{f}.yaml").write_text((ROOT / "configs" / f"{f}.yaml").read_text())
    for stage, want in (("ppo", "--model_name_or_path runs/sft_hh does not exist yet: run `rlhf-nb sft --config configs/sft_hh.yaml` first"),
                        ("rm", "--model_name_or_path runs/sft_hh does not exist yet"),
                        ("sft", "--dataset runs/data/hh does not exist yet: run `rlhf-nb prep --config configs/prep_hh.yaml` first")):
        assert launch.main([stage, "--config", f"configs/{stage}_hh.yaml"]) == 2
        err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("rlhf-nb")]
        assert len(err) == 1 and want in err[0], err


def test_hh_both_layouts_and_subset_through_the_cli(tmp_path, capsys):
    anth = {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Pick a lock?\n\nAssistant: I can't help.",
            "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Pick a lock?\n\nAssistant: Use a wrench."}
    dahoas = {"prompt": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Pick a lock?\n\nAssistant:", "response": " I can't help.",
              "chosen": " I can't help.", "rejected": " Use a wrench."}
    src = tmp_path / "hh"; src.mkdir()
    with gzip.open(src / "harmless-base-train.jsonl.gz", "wt") as f: f.write(json.dumps(anth) + "\n")
    (src / "helpful-base-train.jsonl").write_text(json.dumps(dahoas) + "\n" + json.dumps(dahoas) + "\n")
    for subset, n in (("harmless-base", 1), ("helpful-base", 2)):
        assert prep.prep_main(["hh-rlhf", "--source", str(src), "--hh_subset", subset, "--variant", "rm", "--out", str(tmp_path / subset)]) == 0
        rows = read_rows(tmp_path / subset / "train.parquet", "pref")
        assert len(rows) == n and {(r["chosen"], r["rejected"]) for r in rows} == {("I can't help.", "Use a wrench.")}
    a, b = (read_rows(tmp_path / s / "train.parquet", "pref")[0] for s in ("harmless-base", "helpful-base"))
    assert a["prompt"] == b["prompt"]                                  # the two layouts give the same row
    capsys.readouterr()
    assert prep.prep_main(["hh-rlhf", "--source", str(src), "--hh_subset", "helpful-online", "--out", str(tmp_path / "x")]) == 1
    assert "no file of that subset" in capsys.readouterr().err


def _hs(ind, split, label):
    return {"ind": ind, "activity_label": "Baking cookies", "ctx_a": "A woman mixes dough in a bowl.", "ctx_b": "she",
            "ctx": "A woman mixes dough in a bowl. she", "endings": ["puts the dough on a tray.", "drives a car.", "swims.", "sings loudly."],
            "source_id": f"activitynet~v_{ind}", "split": split, "split_type": "indomain", "label": label}


def test_hellaswag_prep_and_reward_through_the_cli(tmp_path):
    f = tmp_path / "hellaswag_val.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in [_hs(0, "train", 0), _hs(1, "train", 2), _hs(2, "val", 0), _hs(3, "test", "")]))
    assert prep.prep_main(["hellaswag", "--source", str(f), "--out", str(tmp_path / "hs")]) == 0
    train, test = (read_rows(tmp_path / "hs" / f"{s}.parquet", "sft") for s in ("train", "test"))
    assert (len(train), len(test)) == (2, 1)
    r = train[1]
    assert r["reward_model"] == {"style": "rule", "ground_truth": "C"} and "C. swims." in r["prompt"][0]["content"]
    for answer, want in (("C", 1.0), ("(C) swims.", 1.0), ("She swims.", 1.0), ("A", 0.0), ("drives a car.", 0.0)):
        assert compute_score(r["data_source"], answer, r["reward_model"]["ground_truth"], r["extra_info"]) == want, answer

"""The bad-input corpus: every way a user can hand rlhf-nb something wrong, and the message they get.

Each case asserts the message. The rule (CONTRACT.md, issue 8): a clear error naming what is wrong (option, file,
row, column), or a documented, logged skip; never a deep traceback, never a half-written output. Where a user meets
a case on the command line it is run through the CLI: a few through the real console script in a subprocess
(exit status != 0 and ONE stderr line), the rest through the same `rlhf_nb.launch.main` in this process (cheaper:
one interpreter start-up instead of thirty). Cases that the owning notebook does not handle yet are strict xfails
whose reason names the owner and the fix (listed again in the issue-8 report); the last section enforces the safe
defaults (no eval/exec of config values, `yaml.safe_load`, `torch.load(weights_only=True)`, no remote code).
"""
import ast, dataclasses, inspect, json, logging, math, os, shutil, subprocess, sys
from pathlib import Path

import pytest
import torch

from rlhf_nb import data, dataset, launch, prep
from rlhf_nb.data import DataError, write_parquet
from rlhf_nb.arith import make_arith
from rlhf_nb.dataset import RLHFDataset
from rlhf_nb.models import DEFAULT_CHAT_TEMPLATE, char_tokenizer, ensure_chat_ready, tiny_value_model
from _rewards import ParityReward

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rlhf_nb"
ENV = {k: v for k, v in os.environ.items() if k not in ("RLHF_NB_DEBUG", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
ENV.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
           OMP_NUM_THREADS="1", TQDM_DISABLE="1")
TINY = ["--max_steps", 1, "--per_device_train_batch_size", 2, "--max_completion_length", 2, "--eval_steps", 0,
        "--arith_train_size", 4, "--disable_tqdm", "true", "--seed", 0]
TINY_DPO = ["--max_steps", 2, "--per_device_train_batch_size", 2, "--num_pairs", 4, "--num_eval_pairs", 0,
            "--num_eval_prompts", 0, "--rejected_from_policy", "false", "--max_length", 32, "--eval_steps", 100]


def cli(*args, cwd):
    "The real console script in a subprocess: (exit status, stdout, stderr)."
    exe = shutil.which("rlhf-nb")
    cmd = ([exe] if exe else [sys.executable, "-m", "rlhf_nb.launch"]) + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=cwd)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def run(capsys, monkeypatch):
    "`rlhf_nb.launch.main(args)` in this process: -> (exit status, the stderr lines a user reads)."
    monkeypatch.setenv("TQDM_DISABLE", "1"); monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
    def _run(*args):
        capsys.readouterr()
        rc = launch.main([str(a) for a in args])
        return rc, [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    return _run


def one_line(rc, lines, *needles, prog="rlhf-nb"):
    "Status != 0 and exactly one error line, from the CLI, containing every needle."
    errs = [l for l in lines if l.startswith(prog)]
    assert rc != 0, f"expected a failure, got status {rc}; stderr: {lines}"
    assert len(errs) == 1 and not any("Traceback" in l for l in lines), f"not one error line: {lines}"
    for n in needles: assert n in errs[0], f"{n!r} not in {errs[0]!r}"
    return errs[0]


def rows_file(tmp_path, rows, name="rows.jsonl"):
    "Rows written as JSON lines, bypassing validation (write_parquet would refuse bad rows)."
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


# === configuration (YAML and command line) ===========================================================================

def test_yaml_unknown_key(run, tmp_path):
    "(test_cli.py runs the same case through the console script.)"
    (tmp_path / "run.yaml").write_text("learning_rate: 1.0e-5\nkl_coeff: 0.1\n")
    line = one_line(*run("ppo", "--config", tmp_path / "run.yaml", "--output_dir", tmp_path / "out"),
                    f"rlhf-nb ppo: error: {tmp_path / 'run.yaml'}: unknown option kl_coeff; did you mean kl_coef?")
    assert "kl_coef" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("yaml_text,needles", [
    ("learning_rate: abc\n", ["run.yaml: learning_rate: invalid float value: 'abc'"]),
    ("per_device_train_batch_size: 2.5\n", ["run.yaml: per_device_train_batch_size: invalid int value: '2.5'"]),
    ("use_peft: maybe\n", ["run.yaml: use_peft: expected true or false, got 'maybe'"]),
    ("- learning_rate\n- 0.1\n", ["run.yaml: expected a mapping of option: value, got list"]),
    ("learning_rate: [1, 2\n", ["run.yaml: not valid YAML"]),
], ids=["float", "int", "bool", "not-a-mapping", "broken-yaml"])
def test_yaml_wrong_types(run, tmp_path, yaml_text, needles):
    (tmp_path / "run.yaml").write_text(yaml_text)
    one_line(*run("ppo", "--config", tmp_path / "run.yaml", "--output_dir", tmp_path / "out"), *needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("opt,value,needle", [
    ("per_device_train_batch_size", 0, "--per_device_train_batch_size 0 is out of range: it must be >= 1"),
    ("per_device_train_batch_size", -2, "--per_device_train_batch_size -2 is out of range: it must be >= 1"),
    ("mini_batch_size", -4, ("mini_batch_size", "-4")),
    ("mini_batch_size", 3, "must be a multiple of mini_batch_size (3)"),
    ("mini_batch_size", 0, "--mini_batch_size 0 is out of range: it must be >= 1"),
    ("num_ppo_epochs", 0, "--num_ppo_epochs 0 is out of range: it must be >= 1"),
    ("ddp_timeout", 0, "--ddp_timeout 0 is out of range: it must be >= 1"),
], ids=["batch-0", "batch-negative", "mini-batch-negative", "mini-batch-not-dividing", "mini-batch-0", "epochs-0", "ddp-timeout-0"])
def test_batch_sizes(run, tmp_path, opt, value, needle):
    one_line(*run("ppo", "--output_dir", tmp_path / "out", *TINY, f"--{opt}", value), *([needle] if isinstance(needle, str) else needle))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("opt,value,needle", [
    ("per_device_train_batch_size", 0, "--per_device_train_batch_size 0 is out of range: it must be >= 1"),
    ("ddp_timeout", 0, "--ddp_timeout 0 is out of range: it must be >= 1"),
], ids=["batch-0", "ddp-timeout-0"])
def test_dpo_bad_option(run, tmp_path, opt, value, needle):
    one_line(*run("dpo", "--output_dir", tmp_path / "out", *TINY_DPO, f"--{opt}", value), needle)
    assert not (tmp_path / "out").exists()


def test_unknown_policy_loss_lists_the_registered_ones(run, tmp_path):
    one_line(*run("grpo", "--policy_loss", "gpso", "--output_dir", tmp_path / "out", *TINY),
             "unknown policy loss 'gpso'", "cispo, dual_clip, gspo, importance_sampling, vanilla")
    assert not (tmp_path / "out").exists()


def test_health_of_a_folder_without_metrics(run, tmp_path):
    one_line(*run("health", tmp_path / "nothing"), "rlhf-nb health: error:", "no metrics file at")
    assert not (tmp_path / "nothing" / "health.png").exists()


def test_grpo_needs_a_group(run, tmp_path):
    one_line(*run("grpo", "--output_dir", tmp_path / "out", *TINY, "--num_generations", 1),
             "adv_estimator 'grpo' compares completions of one prompt: num_generations must be >= 2")


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_size_not_dividing_the_batch(name):
    from rlhf_nb.core import get_adv_estimator
    from rlhf_nb.core import group_advantages
    with pytest.raises(ValueError, match=r"6 scores are not a whole number of groups of group_size=4"):
        get_adv_estimator(name)(torch.ones(6, 3), torch.ones(6, 3), group_size=4)
    with pytest.raises(ValueError, match=r"not a whole number of groups of group_size=4"): group_advantages(torch.ones(6), 4)


@pytest.mark.parametrize("algo", ["ppo", "dpo"])
def test_output_dir_is_a_file(run, tmp_path, algo):
    f = tmp_path / "out"; f.write_text("my notes")
    args = TINY if algo == "ppo" else TINY_DPO
    one_line(*run(algo, "--output_dir", f, *args), f"--output_dir {f} exists and is not a folder")
    assert f.read_text() == "my notes"


def test_missing_model_and_unknown_estimator(run, tmp_path):
    one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--model_name_or_path", tmp_path / "nope"),
             f"--model_name_or_path: no such model folder '{tmp_path / 'nope'}'")
    one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--adv_estimator", "ppo2"),
             "unknown advantage estimator 'ppo2'; registered:", "gae")
    assert not (tmp_path / "o").exists()



def test_bad_load_options(run, tmp_path):
    one_line(*run("grpo", "--output_dir", tmp_path / "o", *TINY, "--num_generations", 2, "--torch_dtype", "float17"),
             "unknown dtype 'float17' (torch_dtype: float32, bfloat16, float16 or auto)")
    one_line(*run("sft", "--output_dir", tmp_path / "s", "--max_steps", 1, "--model_revision", "v2"),
             "--model_revision v2: revisions apply to hub names, and model_name_or_path tiny is local")
    from rlhf_nb.models import custom_code_folder
    src = custom_code_folder(tmp_path / "custom")
    one_line(*run("dpo", "--output_dir", tmp_path / "d", *TINY_DPO, "--model_name_or_path", src),
             f"model_name_or_path {src}: model_type 'tinyremote' comes from its auto_map code; pass --trust_remote_code")
    assert not any((tmp_path / d).exists() for d in ("o", "d")) and not (tmp_path / "s" / "model.safetensors").exists()

# === data ===========================================================================================================

def test_missing_column_console_script(tmp_path):
    rows = make_arith(6); del rows[2]["reward_model"]
    f = rows_file(tmp_path, rows)
    rc, out, err = cli("ppo", "--dataset", f, "--output_dir", "out", *TINY, cwd=tmp_path)
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2 and lines == [f"rlhf-nb ppo: error: {f}: row 2: column 'reward_model' is missing"], err
    assert not (tmp_path / "out").exists()


def bad_rows(kind):
    rows = make_arith(6)
    r = rows[3]
    if kind == "renamed": r["messages"] = r.pop("prompt")
    elif kind == "empty-text": r["prompt"][0]["content"] = "   "
    elif kind == "no-messages": r["prompt"] = []
    elif kind == "gt-int": r["reward_model"]["ground_truth"] = 81
    elif kind == "gt-none": r["reward_model"]["ground_truth"] = None
    elif kind == "gt-empty": r["reward_model"]["ground_truth"] = ""
    elif kind == "bad-role": r["prompt"][0]["role"] = "human"
    return rows

ROW_CASES = {
    "renamed": "row 3: column 'prompt' is missing",
    "empty-text": "row 3: column 'prompt' is empty (no text)",
    "no-messages": "row 3: column 'prompt' is empty (no messages)",
    "gt-int": "row 3: column 'reward_model' ground_truth must be str, got int",
    "gt-none": "row 3: column 'reward_model' ground_truth must be str, got NoneType",
    "gt-empty": "row 3: column 'reward_model' ground_truth is empty (a rule reward needs it)",
    "bad-role": "row 3: column 'prompt' message 0 has unknown role 'human'",
}

@pytest.mark.parametrize("kind", list(ROW_CASES))
def test_bad_rows(run, tmp_path, kind):
    f = rows_file(tmp_path, bad_rows(kind))
    one_line(*run("ppo", "--dataset", f, "--output_dir", tmp_path / "out", *TINY), f"{f}: {ROW_CASES[kind]}")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match=ROW_CASES[kind].replace("(", r"\(").replace(")", r"\)")):
        RLHFDataset(bad_rows(kind), char_tokenizer())                      # the library says the same


def pref_rows(n=6):
    "Preference rows of the row contract: arith prompts, the right answer chosen, a wrong one rejected."
    return [{**{k: v for k, v in r.items() if k != "completion"}, "chosen": r["completion"], "rejected": "0 #### 0"}
            for r in make_arith(n)]


def test_dpo_missing_preference_column(run, tmp_path):
    "A preference row without `rejected`: one line naming file, row and column (CLI); a DataError, not a KeyError (library)."
    rows = pref_rows(); del rows[2]["rejected"]
    f = rows_file(tmp_path, rows)
    one_line(*run("dpo", "--dataset", f, "--output_dir", tmp_path / "out", *TINY_DPO), f"{f}: row 2: column 'rejected' is missing")
    assert not (tmp_path / "out").exists()
    from rlhf_nb.dpo import DPOConfig, DPOTrainer
    from rlhf_nb.models import tiny_causal_lm
    tok = char_tokenizer()
    with pytest.raises(DataError, match=r"train_rows: row 2: column 'rejected' is missing") as e:
        DPOTrainer(DPOConfig(output_dir=str(tmp_path / "lib")), tiny_causal_lm(tok), tok, rows)
    assert not isinstance(e.value, KeyError)


def test_renamed_column_in_a_raw_dataset(tmp_path, capsys):
    src = tmp_path / "gsm"; src.mkdir()
    (src / "train.jsonl").write_text(json.dumps({"query": "1+1?", "answer": "2 #### 2"}) + "\n")
    rc = prep.prep_main(["gsm8k", "--source", str(src), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err == [f"rlhf-nb prep: error: {src / 'train.jsonl'}: row 0: missing column 'question' "
                               "(columns: query, answer)"], err
    assert not (tmp_path / "out").exists()


def test_all_prompts_over_max_prompt_length(run, tmp_path):
    f = tmp_path / "rows.parquet"; write_parquet(make_arith(6), f)
    one_line(*run("ppo", "--dataset", f, "--output_dir", tmp_path / "out", *TINY, "--max_prompt_length", 3),
             "all 6 prompts are longer than max_prompt_length=3 tokens", "raise max_prompt_length")
    assert not (tmp_path / "out").exists()


def test_some_prompts_over_max_prompt_length_are_dropped_with_a_warning():
    rows = make_arith(4) + make_arith(2, word_problems=True)         # 2 long word problems
    with pytest.warns(UserWarning, match=r"dropped 2 of 6 prompts longer than max_prompt_length=40 tokens"):
        ds = RLHFDataset(rows, char_tokenizer(), max_prompt_length=40)
    assert (len(ds), ds.n_dropped) == (4, 2)


def test_dataset_smaller_than_one_batch(run, tmp_path):
    one_line(*run("ppo", "--output_dir", tmp_path / "out", *TINY, "--arith_train_size", 1),
             "train dataset has 1 prompts, fewer than one step needs (2 x 1 processes)")


def test_corrupt_and_malformed_files(run, tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    one_line(*run("ppo", "--dataset", tmp_path / "bad.parquet", "--output_dir", tmp_path / "o", *TINY),
             f"{tmp_path / 'bad.parquet'}: could not read (ArrowInvalid")
    (tmp_path / "bad.jsonl").write_text(json.dumps(make_arith(1)[0]) + "\n{not json\n")
    one_line(*run("ppo", "--dataset", tmp_path / "bad.jsonl", "--output_dir", tmp_path / "o", *TINY),
             f"{tmp_path / 'bad.jsonl'}: line 2: not valid JSON")
    assert not (tmp_path / "o").exists()


# === rewards ========================================================================================================

def reward_batch(tok, texts, source="arith", truths=None):
    enc = tok([t + "<|end|>" for t in texts], add_special_tokens=False, padding=True, return_tensors="pt")
    n = len(texts)
    return {"responses": enc["input_ids"], "response_mask": enc["attention_mask"], "data_source": [source] * n,
            "reward_model": [{"style": "rule", "ground_truth": g} for g in (truths or ["12"] * n)],
            "extra_info": [{} for _ in range(n)]}


def boom(ds, s, gt, extra):
    if s.startswith("7"): raise ZeroDivisionError("bad luck")
    return 1.0

@pytest.mark.parametrize("fn,needle", [
    (boom, "reward failed for row 1 (data_source='arith'): ZeroDivisionError: bad luck; scored -1.0"),
    (lambda ds, s, gt, e: float("nan") if s.startswith("7") else 1.0, "reward failed for row 1 (data_source='arith'): "
                                                                      "ValueError: reward function returned nan; scored -1.0"),
    (lambda ds, s, gt, e: None if s.startswith("7") else 1.0, "reward failed for row 1 (data_source='arith'): "
                                                               "ValueError: reward function returned None; scored -1.0"),
], ids=["raises", "nan", "none"])
def test_reward_function_failures_are_logged_and_scored_fail_score(caplog, fn, needle):
    from rlhf_nb.rewards import RewardManager
    tok = char_tokenizer()
    with caplog.at_level(logging.WARNING, logger="rlhf_nb.rewards"):
        scores, m = RewardManager(tok, compute_score=fn, fail_score=-1.0)(reward_batch(tok, ["12 #### 12", "7", "12"]))
    assert scores.sum(-1).tolist() == [1.0, -1.0, 1.0] and m["reward/failures"] == 1
    assert needle in caplog.text


def test_trl_reward_func_failures_are_logged(caplog):
    from rlhf_nb.rewards import trl_reward_func
    f = trl_reward_func(compute_score=boom, data_source="arith", fail_score=0.0)
    with caplog.at_level(logging.WARNING, logger="rlhf_nb.rewards"):
        out = f(prompts=["a", "b"], completions=["1", "7"], ground_truth=["1", "7"])
    assert out == [1.0, 0.0] and "sample 1 (data_source='arith') failed: ZeroDivisionError: bad luck" in caplog.text


def tiny_trainer(tmp_path, reward_manager=None, **kw):
    from rlhf_nb.ppo import PPOConfig, RLTrainer
    cfg = PPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, mini_batch_size=4, max_completion_length=4,
                    arith_train_size=8, eval_steps=0, disable_tqdm=True, save_final=False, seed=0, **kw)
    return RLTrainer(cfg, reward_manager=reward_manager or ParityReward()).init_workers()


def test_reward_function_that_raises_inside_training_costs_the_score_not_the_run(tmp_path, caplog):
    from rlhf_nb.rewards import RewardManager
    tok = char_tokenizer()
    rm = RewardManager(tok, compute_score=lambda *a: 1 / 0)
    from rlhf_nb.ppo import PPOConfig, RLTrainer
    cfg = PPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, mini_batch_size=4, max_completion_length=4,
                    arith_train_size=8, eval_steps=0, disable_tqdm=True, save_final=False, max_steps=1)
    with caplog.at_level(logging.WARNING, logger="rlhf_nb.rewards"):
        hist = RLTrainer(cfg, tokenizer=tok, reward_manager=rm).fit()
    assert hist[-1]["reward/failures"] == 4 and "ZeroDivisionError" in caplog.text


def test_reward_manager_returning_the_wrong_length(tmp_path):
    tr = tiny_trainer(tmp_path, reward_manager=lambda batch: (torch.zeros(3, 4), {}))
    data_ = {"responses": torch.ones(4, 4, dtype=torch.long), "response_mask": torch.ones(4, 4),
             "has_eos": torch.ones(4, dtype=torch.bool)}
    with pytest.raises(ValueError) as e: tr.compute_scores(data_)
    assert "(3, 4)" in str(e.value) and "(4, 4)" in str(e.value)


# === tokenizers =====================================================================================================

def test_tokenizer_without_pad_token():
    tok = char_tokenizer(); tok.pad_token = None
    with pytest.raises(ValueError, match=r"tokenizer has no pad token: set tokenizer.pad_token, or call "
                                         r"rlhf_nb.models.ensure_chat_ready\(tokenizer\)"):
        RLHFDataset(make_arith(2), tok)
    with pytest.raises(ValueError, match="collate_fn needs a pad_token_id"): dataset.collate_fn([{"input_ids": [1]}], None)


def test_tokenizer_without_chat_template():
    tok = char_tokenizer(); tok.chat_template = None
    with pytest.raises(ValueError, match=r"has no chat template: set tokenizer.chat_template, or call "
                                         r"rlhf_nb.models.ensure_chat_ready\(tokenizer\)"):
        RLHFDataset(make_arith(2), tok)


def test_ensure_chat_ready_says_what_it_fixed_and_refuses_what_it_cannot(capsys):
    tok = char_tokenizer(); tok.pad_token = None; tok.chat_template = None
    ensure_chat_ready(tok)
    assert capsys.readouterr().out.strip() == ("ensure_chat_ready set pad_token = eos_token '<|end|>'; "
                                               "chat_template = rlhf_nb.models.DEFAULT_CHAT_TEMPLATE")
    assert tok.pad_token == "<|end|>" and tok.chat_template == DEFAULT_CHAT_TEMPLATE
    tok.pad_token = None; tok.eos_token = None
    with pytest.raises(ValueError, match="has neither a pad nor an eos token; set one"): ensure_chat_ready(tok)


def reward_inputs():
    prompts = [[{"role": "user", "content": "Q: 6+6="}], [{"role": "user", "content": "Q: 3+4="}]]
    return prompts, ["12 #### 12", "7"]


def test_policy_and_reward_tokenizers_that_differ_are_bridged_by_text():
    "A reward model with its own tokenizer (other ids for every character) scores the decoded text, re-encoded."
    from rlhf_nb.models import _default_chars
    from rlhf_nb.rewards import ModelReward, RewardManager
    tok, rtok = char_tokenizer(), char_tokenizer(chars=_default_chars()[::-1])
    assert tok.convert_tokens_to_ids("a") != rtok.convert_tokens_to_ids("a")
    rm = tiny_value_model(rtok, head_std=0.5)
    prompts, texts = reward_inputs()
    b = reward_batch(tok, texts)
    b.update(reward_model=[{"style": "model", "ground_truth": ""}] * 2, raw_prompt=prompts)
    scores, _ = RewardManager(tok, reward_model=rm, reward_tokenizer=rtok)(b)
    torch.testing.assert_close(scores.sum(-1), ModelReward(rm, rtok)(prompts, texts)[0])


def test_reward_model_given_the_policy_tokenizer_by_mistake():
    from rlhf_nb.rewards import RewardManager
    tok, small = char_tokenizer(), char_tokenizer(chars="0123456789")
    rm = tiny_value_model(small)                                        # 16-token vocabulary
    prompts, texts = reward_inputs()
    b = reward_batch(tok, texts)
    b.update(reward_model=[{"style": "model", "ground_truth": ""}] * 2, raw_prompt=prompts)
    with pytest.raises(ValueError, match="reward_tokenizer"): RewardManager(tok, reward_model=rm)(b)


# === checkpoints ====================================================================================================

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    "A one-step PPO and a one-step GRPO run, each with its final checkpoint-1 (written in this process)."
    base = tmp_path_factory.mktemp("ckpts")
    for algo, extra in (("ppo", []), ("grpo", ["--num_generations", 2])):
        assert launch.main([str(a) for a in ["ppo" if algo == "ppo" else "grpo", "--output_dir", base / algo, *TINY,
                                             *extra]]) == 0
        assert (base / algo / "checkpoint-1" / "trainer_state.json").exists()
    return base


def damaged(ckpts, tmp_path, how):
    d = tmp_path / f"ckpt-{how}"
    shutil.copytree(ckpts / "ppo" / "checkpoint-1", d)
    cut = lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    if how == "garbage-weights": (d / "policy" / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    elif how == "truncated-weights": cut(d / "policy" / "model.safetensors")
    elif how == "truncated-optimizer": cut(d / "optimizer.pt")
    elif how == "truncated-state": cut(d / "trainer_state.json")
    elif how == "truncated-rng": cut(d / "rng_state_0.pt")
    elif how == "no-optimizer": (d / "optimizer.pt").unlink()
    return d



@pytest.mark.parametrize("how,needle", [
    ("truncated-weights", "policy/model.safetensors"),
    ("truncated-optimizer", "optimizer.pt"),
    ("truncated-state", "trainer_state.json"),
    ("truncated-rng", "rng_state_0.pt"),
    ("no-optimizer", "optimizer.pt"),
])
def test_corrupt_or_truncated_checkpoint(run, ckpts, tmp_path, how, needle):
    d = damaged(ckpts, tmp_path, how)
    one_line(*run("ppo", "--output_dir", tmp_path / "out", *TINY, "--max_steps", 2, "--resume_from_checkpoint", d),
             str(d), needle)
    assert not (tmp_path / "out").exists()


def test_corrupt_checkpoint_console_script(ckpts, tmp_path):
    d = damaged(ckpts, tmp_path, "garbage-weights")
    rc, out, err = cli("ppo", "--output_dir", "out", *TINY, "--max_steps", 2, "--resume_from_checkpoint", d, cwd=tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and str(d) in lines[0] and "model.safetensors" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_resume_from_something_that_is_not_a_checkpoint(run, ckpts, tmp_path, recwarn):
    one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--resume_from_checkpoint", ckpts / "ppo" / "checkpoint-1" / "policy"),
             f"{ckpts / 'ppo' / 'checkpoint-1' / 'policy'} is not a checkpoint (no trainer_state.json)")
    rc, lines = run("ppo", "--output_dir", tmp_path / "o", *TINY, "--resume_from_checkpoint", "latest")   # nothing yet: step 0
    assert rc == 0 and (tmp_path / "o" / "checkpoint-1").is_dir(), lines
    assert any(f"no checkpoint-* folder in {tmp_path / 'o'} yet, so the run starts from step 0" in str(w.message) for w in recwarn)



@pytest.mark.parametrize("algo,source", [("grpo", "ppo"), ("ppo", "grpo")])
def test_checkpoint_from_another_algorithm(run, ckpts, tmp_path, algo, source):
    extra = ["--num_generations", 2] if algo == "grpo" else []
    line = one_line(*run(algo, "--output_dir", tmp_path / "o", *TINY, *extra, "--max_steps", 2,
                         "--resume_from_checkpoint", ckpts / source / "checkpoint-1"), str(ckpts / source / "checkpoint-1"))
    assert "gae" in line and "grpo" in line, line


def test_dpo_resume_from_an_rl_checkpoint(run, ckpts, tmp_path):
    from rlhf_nb.dpo import DPOConfig
    assert "resume_from_checkpoint" in {f.name for f in dataclasses.fields(DPOConfig)}, "DPO cannot resume yet"
    one_line(*run("dpo", "--output_dir", tmp_path / "o", *TINY_DPO, "--resume_from_checkpoint", ckpts / "ppo" / "checkpoint-1"),
             str(ckpts / "ppo" / "checkpoint-1"))
    assert not (tmp_path / "o" / "final").exists()


def test_checkpoint_with_a_pickle_payload_is_refused(run, ckpts, tmp_path):
    d = damaged(ckpts, tmp_path, "payload")
    marker = tmp_path / "PWNED"
    class Payload:
        def __reduce__(self): return (open, (str(marker), "w"))
    opt = torch.load(d / "optimizer.pt", weights_only=False)           # our own file, from the fixture
    opt["extra"] = Payload()
    torch.save(opt, d / "optimizer.pt")
    rc, lines = run("ppo", "--output_dir", tmp_path / "o", *TINY, "--max_steps", 2, "--resume_from_checkpoint", d)
    assert not marker.exists(), "loading the checkpoint ran code from it"
    one_line(rc, lines, "optimizer.pt")


# === NaN losses =====================================================================================================


def nan_policy_loss(monkeypatch, when):
    "Make the registered `vanilla` policy loss (what the trainer's `actor_loss` looks up) NaN when `when()`."
    import rlhf_nb.core as core
    real = core.POLICY_LOSSES["vanilla"]
    def patched(*a, **kw):
        loss, st = real(*a, **kw)
        return (loss * float("nan"), st) if when() else (loss, st)
    monkeypatch.setitem(core.POLICY_LOSSES, "vanilla", patched)


def test_nan_loss_once_is_skipped_and_logged(tmp_path, monkeypatch, caplog, recwarn):
    tr = tiny_trainer(tmp_path, max_steps=3)
    nan_policy_loss(monkeypatch, lambda: tr.global_step == 1)           # the second step's update only
    with caplog.at_level(logging.WARNING):
        hist = tr.fit()
    assert [h["step"] for h in hist] == [1, 2, 3]
    assert all(torch.isfinite(p).all() for p in tr.unwrapped_policy.parameters()), "a NaN update reached the weights"
    flagged = [h["step"] for h in hist if any(("nan" in k or "nonfinite" in k) and v for k, v in h.items())]
    assert flagged == [2], hist
    said = caplog.text + " ".join(str(w.message) for w in recwarn)
    assert "nan" in said.lower() or "non-finite" in said.lower()


def test_nan_loss_k_steps_in_a_row_stops_with_one_line(run, tmp_path, monkeypatch):
    from rlhf_nb.ppo import PPOConfig
    nan_policy_loss(monkeypatch, lambda: True)
    k = PPOConfig().max_nan_steps
    line = one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--max_steps", k + 3, "--save_steps", 1), "NaN", str(k))
    rows = [json.loads(l) for l in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == k and not list((tmp_path / "o").glob("checkpoint-*")), (line, rows)


def test_dpo_nan_loss_stops_with_one_line(run, tmp_path, monkeypatch):
    import rlhf_nb.dpo as dg
    real = dg.dpo_loss
    monkeypatch.setattr(dg, "dpo_loss", lambda *a, **kw: tuple(x * float("nan") for x in real(*a, **kw)))
    k = dg.DPOConfig().max_nan_steps
    one_line(*run("dpo", "--output_dir", tmp_path / "o", *TINY_DPO, "--max_steps", k + 3), "NaN", str(k))
    assert not (tmp_path / "o" / "final").exists()


# === safe defaults ==================================================================================================

MODULES = sorted(p.name for p in PKG.glob("*.py") if p.name != "_modidx.py")

def tree(name): return ast.parse((PKG / name).read_text(), filename=name)

def calls(t, dotted):
    "Calls in tree `t` whose function is spelled `dotted` (e.g. 'torch.load', 'eval')."
    out = []
    for n in ast.walk(t):
        if isinstance(n, ast.Call):
            f = ast.unparse(n.func)
            if f == dotted: out.append(n)
    return out

def kw(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


@pytest.mark.parametrize("mod", MODULES)
def test_no_eval_or_exec(mod):
    t = tree(mod)
    bad = [f"line {c.lineno}: {f}(...)" for f in ("eval", "exec") for c in calls(t, f)]
    bad += [f"line {c.lineno}: {ast.unparse(c.func)}" for f in ("os.system", "os.popen") for c in calls(t, f)]
    bad += [f"line {c.lineno}: shell=True" for n in ("subprocess.run", "subprocess.Popen", "subprocess.call",
            "subprocess.check_output", "subprocess.check_call") for c in calls(t, n)
            if isinstance(kw(c, "shell"), ast.Constant) and kw(c, "shell").value]
    assert not bad, f"{mod}: {bad}"


@pytest.mark.parametrize("mod", MODULES)
def test_yaml_is_safe_loaded_and_pickle_only_between_our_own_processes(mod):
    t = tree(mod)
    safe = {n.name for n in ast.walk(t) if isinstance(n, ast.ClassDef)             # yaml.load(..., Loader=a SafeLoader subclass)
            and any(ast.unparse(b) in ("yaml.SafeLoader", "yaml.CSafeLoader") for b in n.bases)}
    safe_load = lambda c: isinstance(kw(c, "Loader"), ast.Name) and kw(c, "Loader").id in safe
    bad = [f"line {c.lineno}: {ast.unparse(c.func)}" for f in ("yaml.load", "yaml.unsafe_load", "yaml.full_load",
           "yaml.load_all", "yaml.unsafe_load_all", "pickle.load", "dill.load", "dill.loads") for c in calls(t, f)
           if not (f == "yaml.load" and safe_load(c))]
    # pickle.loads: only the math-verify worker protocol (parent <-> its own child over a pipe) in equivalence.py
    bad += [f"line {c.lineno}: pickle.loads" for c in calls(t, "pickle.loads") if mod != "equivalence.py"]
    assert not bad, f"{mod}: {bad}"


TORCH_LOAD_XFAIL = {}

@pytest.mark.parametrize("mod", [pytest.param(m, marks=TORCH_LOAD_XFAIL.get(m, ())) for m in MODULES])
def test_torch_load_says_weights_only_true(mod):
    t = tree(mod)
    bad = [f"line {c.lineno}: {ast.unparse(c)[:80]}" for c in calls(t, "torch.load")
           if not (isinstance(kw(c, "weights_only"), ast.Constant) and kw(c, "weights_only").value is True)]
    assert not bad, f"{mod}: torch.load without weights_only=True: {bad}"


@pytest.mark.parametrize("mod", MODULES)
def test_trust_remote_code_is_never_on_by_default(mod):
    t = tree(mod)
    bad = []
    for n in ast.walk(t):
        if isinstance(n, ast.keyword) and n.arg == "trust_remote_code" and isinstance(n.value, ast.Constant) and n.value.value:
            bad.append(f"line {n.value.lineno}: trust_remote_code=True")
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            for arg, d in list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults)):
                if arg.arg == "trust_remote_code" and not (isinstance(d, ast.Constant) and d.value is False):
                    bad.append(f"line {n.lineno}: {n.name}(trust_remote_code={ast.unparse(d) if d else '<required>'})")
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "trust_remote_code":
            if "True" in ast.unparse(n.value or ast.Constant(None)).split("metadata")[0]:
                bad.append(f"line {n.lineno}: field trust_remote_code defaults to True")
    assert not bad, f"{mod}: {bad}"


def test_loaders_default_to_no_remote_code():
    from rlhf_nb import models
    from rlhf_nb.reward_model import load_reward_model
    for fn in (models.load_tokenizer, models.load_causal_lm, models.load_value_model, models.load_config, load_reward_model):
        assert inspect.signature(fn).parameters["trust_remote_code"].default is False, fn.__name__
    assert models.LoadArgs().trust_remote_code is False


def test_yaml_config_cannot_run_code(run, tmp_path):
    marker = tmp_path / "PWNED"
    (tmp_path / "evil.yaml").write_text(f'learning_rate: !!python/object/apply:os.system ["touch {marker}"]\n')
    one_line(*run("ppo", "--config", tmp_path / "evil.yaml", "--output_dir", tmp_path / "o"), "evil.yaml: not valid YAML")
    assert not marker.exists() and not (tmp_path / "o").exists()


# === a learned reward model in the RL trainers ========================================================



def _hh_rows(n):
    "HH dialogue rows (scored by a reward model), as `rlhf-nb prep hh-rlhf --variant rl` writes them."
    return [data.hh_row({"chosen": f"\n\nHuman: Tell me about {i}.\n\nAssistant: {i} is a number.",
                         "rejected": f"\n\nHuman: Tell me about {i}.\n\nAssistant: No."}, i, "train", "hand", variant="rl")
            for i in range(n)]


@pytest.fixture(scope="module")
def rm_case(tmp_path_factory):
    "A dataset folder of HH rows and four model folders: a good reward model and three that cannot be one."
    from transformers import Qwen2ForSequenceClassification
    from rlhf_nb.models import tiny_config
    d, tok = tmp_path_factory.mktemp("rm_case"), char_tokenizer()
    (d / "hh").mkdir(); write_parquet(_hh_rows(8), d / "hh" / "train.parquet"); write_parquet(_hh_rows(4), d / "hh" / "test.parquet")
    for name, model in {"rm": tiny_value_model(tok, head_std=0.1), "two": Qwen2ForSequenceClassification(tiny_config(tok, num_labels=2)),
                        "small": tiny_value_model(char_tokenizer(chars="0123456789"))}.items():
        model.save_pretrained(d / name); tok.save_pretrained(d / name)
    return d


@pytest.mark.parametrize("extra,needles", [
    ([], ["data_source 'Anthropic/hh-rlhf' are scored by a reward model", "pass --reward_model_path"]),
    (["--reward_model_path", "two"], ["reward model", "has num_labels=2: a reward model gives one score per sequence"]),
    (["--reward_model_path", "small"], ["its tokenizer has 102 tokens but its embedding has only 16 rows"]),
    (["--reward_model_path", "rm", "--value_model_path", "small"], ["value model", "has an embedding of 16 rows but the policy's tokenizer has 102"]),
    (["--reward_model_path", "rm", "--value_model_path", "two"], ["value model", "has num_labels=2: the critic gives one value per token"]),
])
def test_reward_and_value_models_that_cannot_serve(run, rm_case, tmp_path, extra, needles):
    "Each refused in one line before any step trains (no metrics written)."
    extra = [str(rm_case / a) if a in ("two", "small", "rm") else a for a in extra]
    one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--dataset", rm_case / "hh", *extra), *needles)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
@pytest.mark.parametrize("stage,flags,needle", [
    ("sft", ["--load_in_4bit", "true", "--use_peft", "true"], "load_in_4bit needs a CUDA GPU (bitsandbytes' kernels); this machine has none"),
    ("rm", ["--load_in_8bit", "true", "--use_peft", "true"], "load_in_8bit needs a CUDA GPU"),
])
def test_quantized_loading_on_a_cpu_is_one_line(run, tmp_path, stage, flags, needle):
    one_line(*run(stage, "--output_dir", tmp_path / "o", "--max_steps", 1, *flags), needle)
# --- TRL pipelines on the command line, shipped configs ----------------------------------------------

@pytest.mark.parametrize("args,needles", [
    (["trl", "dpo", "--beta", "x"], ["rlhf-nb trl", "argument --beta", "invalid float value: 'x'"]),
    (["trl", "grpo", "--no_such_option", "1"], ["unknown option(s) for the GRPO pipeline", "--no_such_option"]),
    (["trl", "nope"], ["unknown TRL pipeline 'nope'", "sft, dpo, grpo, rloo, reward, ppo"]),
    (["trl", "ppo", "--stop_token", "period"], ["stop_token='period'", "eos only"]),
    (["trl", "ppo", "--response_lenght", "8"], ["unknown option --response_lenght; did you mean --response_length?"]),
    (["config", "grpo_aritj"], ["config file not found: grpo_aritj", "shipped configs:", "grpo_arith"]),
    (["grpo", "--config", "no_such.yaml"], ["config file not found: no_such.yaml", "shipped configs:"]),
])
def test_trl_and_config_bad_input_is_one_line(run, tmp_path, monkeypatch, args, needles):
    monkeypatch.chdir(tmp_path)
    rc, lines = run(*args)
    one_line(rc, lines, *needles)
    assert list(tmp_path.iterdir()) == []

# === placement (roles on resource pools) =============================================================================

RAY = ["--placement", "ray"]
PLACEMENT_CASES = [
    ("ppo", RAY + ["--resource_pools", "a=1", "--role_pools", "Critc=a"], "unknown role 'Critc' in role_pools; roles: ActorRollout"),
    ("ppo", RAY + ["--resource_pools", "a=1", "--role_pools", "ActorRolloutRef=b"], "role ActorRolloutRef is placed on unknown pool 'b'"),
    ("ppo", RAY + ["--resource_pools", "a=1", "--role_pools", "ActorRolloutRef=a,RefPolicy=a"], "role RefPolicy is placed twice"),
    ("ppo", RAY + ["--resource_pools", "a=0", "--role_pools", "ActorRollout=a"], "pool 'a' has 0 workers"),
    ("ppo", RAY + ["--resource_pools", "a=2,c=1", "--role_pools", "ActorRolloutRef=a,Critic=c"], "pool too small for its roles"),
    ("grpo", RAY + ["--num_generations", 2, "--resource_pools", "a=1,c=1", "--role_pools", "ActorRolloutRef=a,Critic=c"],
     "places Critic on 'c' but this run has no Critic"),
    ("ppo", ["--resource_pools", "a=1,c=1", "--role_pools", "ActorRolloutRef=a,Critic=c"], "needs placement: ray"),
    ("ppo", RAY + ["--fsdp", "on"], "fsdp: on needs placement: accelerate"),
    ("ppo", RAY + ["--resource_pools", "actor_pool"], "resource_pools: expected a mapping"),
]
@pytest.mark.parametrize("algo,args,needle", PLACEMENT_CASES)
def test_bad_placement(run, tmp_path, algo, args, needle):
    one_line(*run(algo, "--output_dir", tmp_path / "o", *TINY, *args), needle)
    assert not (tmp_path / "o").exists()                                # refused before anything started


def test_placement_ray_without_ray(run, tmp_path, monkeypatch):
    import importlib.util
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find(name, *a))
    one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--placement", "ray"), "pip install 'rlhf-nb[ray]'")


# === faults: damaged run folders, misbehaving rewards, a busy folder, a full disk ==========================

def test_checkpoint_from_a_model_of_another_shape(run, ckpts, tmp_path):
    from rlhf_nb.models import tiny_causal_lm
    tok = char_tokenizer()
    wide = tmp_path / "wide"; tiny_causal_lm(tok, hidden_size=96).save_pretrained(wide); tok.save_pretrained(wide)
    cp = ckpts / "ppo" / "checkpoint-1"
    one_line(*run("ppo", "--output_dir", tmp_path / "o", *TINY, "--max_steps", 2, "--model_name_or_path", wide,
                  "--resume_from_checkpoint", cp), f"checkpoint {cp / 'policy'} is from a model of another shape: ",
             "there,", "here", "resume with the model it was written by")


def test_latest_when_every_checkpoint_lacks_its_trainer_state(run, ckpts, tmp_path):
    out = tmp_path / "o"; out.mkdir()
    shutil.copytree(ckpts / "ppo" / "checkpoint-1", out / "checkpoint-1")
    (out / "checkpoint-1" / "trainer_state.json").unlink()
    one_line(*run("ppo", "--output_dir", out, *TINY, "--max_steps", 2, "--resume_from_checkpoint", "latest"),
             f"resume_from_checkpoint='latest' but every checkpoint-* folder in {out} is incomplete")


def test_truncated_last_metrics_line_is_repaired_on_resume(run, ckpts, tmp_path, recwarn):
    out = tmp_path / "o"; shutil.copytree(ckpts / "ppo", out)
    with open(out / "metrics.jsonl", "a") as f: f.write('{"step": 2, "score/me')          # a run killed mid-append
    rc, lines = run("ppo", "--output_dir", out, *TINY, "--max_steps", 2, "--resume_from_checkpoint", "latest")
    assert rc == 0, lines
    assert any("dropped a half-written last line" in str(w.message) for w in recwarn), [str(w.message) for w in recwarn]
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_metrics_line_broken_in_the_middle_is_named(tmp_path):
    from rlhf_nb.tracking import read_metrics
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not JSON"): read_metrics(tmp_path)


def hangs(ds, s, gt, extra):
    if s.startswith("7"):
        import time; time.sleep(30)
    return 1.0

@pytest.mark.parametrize("fn,needle", [
    (hangs, "reward failed for row 1 (data_source='arith'): RewardTimeout: took longer than 0.3s; scored -1.0"),
    (lambda ds, s, gt, e: "1.0" if s.startswith("7") else 1.0,
     "reward failed for row 1 (data_source='arith'): TypeError: reward function returned a str ('1.0'), not a number; scored -1.0"),
], ids=["hangs", "string"])
def test_reward_function_that_hangs_or_returns_a_string(caplog, fn, needle):
    from rlhf_nb.rewards import RewardManager
    tok = char_tokenizer()
    rm = RewardManager(tok, compute_score=fn, fail_score=-1.0, score_timeout=0.3)
    with caplog.at_level(logging.WARNING, logger="rlhf_nb.rewards"):
        scores, m = rm(reward_batch(tok, ["12 #### 12", "7", "12"]))
    assert scores.sum(-1).tolist() == [1.0, -1.0, 1.0] and m["reward/failures"] == 1
    assert m["reward/timeouts"] == (1 if fn is hangs else 0)
    assert needle in caplog.text


def test_reward_model_that_outputs_nan(caplog):
    from rlhf_nb.rewards import RewardManager
    tok = char_tokenizer()
    rmodel = tiny_value_model(tok)
    with torch.no_grad(): rmodel.score.weight.fill_(float("nan"))
    b = reward_batch(tok, ["12", "7"]); b["reward_model"] = [{"style": "model", "ground_truth": ""}] * 2
    b["raw_prompt"] = [[{"role": "user", "content": "1+1="}]] * 2
    with caplog.at_level(logging.WARNING, logger="rlhf_nb.rewards"):
        scores, m = RewardManager(tok, reward_model=rmodel, fail_score=-1.0)(b)
    assert scores.sum(-1).tolist() == [-1.0, -1.0] and m["reward/failures"] == 2
    assert "reward failed for row 0 (data_source='arith'): reward model returned nan; scored -1.0" in caplog.text


def test_output_folder_held_by_a_live_run(run, tmp_path):
    import socket
    holder = subprocess.Popen(["sleep", "60"])
    try:
        out = tmp_path / "o"; out.mkdir()
        (out / ".rlhf_nb.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": "earlier"}))
        one_line(*run("grpo", "--output_dir", out, *TINY, "--num_generations", 2),
                 f"--output_dir {out} is in use by another run (PID {holder.pid}, started earlier)")
        one_line(*run("dpo", "--output_dir", out, *TINY_DPO), f"is in use by another run (PID {holder.pid}")
        assert sorted(p.name for p in out.iterdir()) == [".rlhf_nb.lock"]                 # nothing written
    finally: holder.kill(); holder.wait()


def test_disk_full_during_the_first_checkpoint(run, tmp_path):
    from rlhf_nb.files import file_size_limit
    out = tmp_path / "o"
    with file_size_limit(200_000): rc, lines = run("grpo", "--output_dir", out, *TINY, "--num_generations", 2)
    one_line(rc, lines, f"disk full writing {out / 'checkpoint-1'} (a file reached the size limit (ulimit -f)): it needs about")
    assert [p.name for p in out.iterdir() if "checkpoint" in p.name] == [] and (out / "metrics.jsonl").exists()

"""`rlhf-nb trl NAME` end to end, in subprocesses and offline: TRL's GRPO, DPO, reward and SFT trainers run 2 steps on
the built-in tiny model and arith data; `trl ppo` maps TRL's PPO option names onto the native PPO and runs 2 steps;
one TRL pipeline runs under a 2-process `accelerate launch -m rlhf_nb.trl_pipelines`."""
import json, os, random, subprocess, sys
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
ENV.pop("RLHF_NB_DEBUG", None)
SMALL = ["--num_train_rows", "32", "--num_eval_rows", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
         "--save_strategy", "no"]


def run(args, cwd, timeout=600):
    cmd = [sys.executable, "-m", "rlhf_nb.launch", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


def summary(r):
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,extra", [
    ("grpo", ["--num_generations", "4", "--max_completion_length", "8"]),
    ("dpo", []),
    ("reward", []),
    ("sft", []),
])
def test_trl_pipeline_cli_two_steps(tmp_path, name, extra):
    r = run(["trl", name, "--model_name_or_path", "tiny", "--dataset_name", "arith", "--max_steps", "2",
             "--output_dir", "D", *SMALL, *extra], tmp_path)
    s = summary(r)
    assert (s["pipeline"], s["steps"], s["world_size"]) == (name, 2, 1)
    state = json.loads((tmp_path / "D" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and any("loss" in h for h in state["log_history"])
    assert (tmp_path / "D" / "model.safetensors").exists() and (tmp_path / "D" / "tokenizer_config.json").exists()


def test_trl_grpo_issue_example_with_yaml(tmp_path):
    "The exact line of the docs, with a YAML file of TRL options under it (the flags win)."
    (tmp_path / "g.yaml").write_text("num_generations: 2\nmax_completion_length: 6\nmax_steps: 5\nlearning_rate: 1.0e-4\n")
    r = run(["trl", "grpo", "--config", "g.yaml", "--model_name_or_path", "tiny", "--dataset_name", "arith",
             "--max_steps", "2", "--output_dir", "D", "--per_device_train_batch_size", "2"], tmp_path)
    s = summary(r)
    assert s["steps"] == 2
    args = json.loads((tmp_path / "D" / "trainer_state.json").read_text())
    assert args["global_step"] == 2


def test_trl_bad_option_is_one_line(tmp_path):
    r = run(["trl", "dpo", "--beta", "x"], tmp_path)
    lines = [l for l in r.stderr.strip().splitlines() if "Warning" not in l and not l.startswith("  warnings.warn")]
    assert r.returncode == 2 and lines == ["rlhf-nb trl: error: argument --beta: invalid float value: 'x'"], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_trl_ppo_with_trl_names_runs_two_steps(tmp_path):
    from rlhf_nb.models import char_tokenizer, tiny_value_model
    tok = char_tokenizer(); tiny_value_model(tok, head_std=0.02).save_pretrained(tmp_path / "rm"); tok.save_pretrained(tmp_path / "rm")
    r = run(["trl", "ppo", "--sft_model_path", "tiny", "--reward_model_path", "rm", "--dataset_name", "arith",
             "--kl_coef", "0.05", "--cliprange", "0.2", "--vf_coef", "0.1", "--num_ppo_epochs", "1", "--response_length", "8",
             "--total_episodes", "16", "--per_device_train_batch_size", "4", "--num_mini_batches", "2",
             "--missing_eos_penalty", "1.0", "--stop_token", "eos", "--output_dir", "P",
             "--arith_train_size", "64", "--eval_steps", "0", "--disable_tqdm", "true"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    notes = [l for l in r.stderr.splitlines() if l.startswith("rlhf-nb trl ppo: ")]
    for expect in ("sft_model_path -> model_name_or_path = tiny", "reward_model_path -> reward_model_path (same name)",
                   "response_length -> max_completion_length = 8", "total_episodes -> max_steps = 2",
                   "-> mini_batch_size = 4", "-> per_device_train_batch_size = 8", "kl_coef -> kl_coef (same name)",
                   "missing_eos_penalty -> missing_eos_penalty (same name)", "dataset_name -> dataset = arith"):
        assert any(expect in n for n in notes), (expect, notes)
    s = json.loads((tmp_path / "P" / "summary.json").read_text())
    assert (s["algo"], s["steps"]) == ("gae", 2) and "critic/vf_loss" in s["final"]
    rows = [json.loads(l) for l in (tmp_path / "P" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2


def test_trl_pipeline_two_process_accelerate_launch(tmp_path):
    port = str(random.randint(20000, 40000))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", port,
           "-m", "rlhf_nb.trl_pipelines", "dpo", "--max_steps", "2", "--output_dir", "D", *SMALL]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**ENV, "ACCELERATE_USE_CPU": "1"}, cwd=tmp_path)
    out = [l for l in r.stdout.strip().splitlines() if l.startswith('{"')]
    assert r.returncode == 0 and len(out) == 1, r.stderr[-3000:]                  # one summary: rank 0 prints it
    s = json.loads(out[0])
    assert (s["pipeline"], s["steps"], s["world_size"]) == ("dpo", 2, 2)


def test_trl_cli_relaunches_itself_under_accelerate_with_two_processes(tmp_path):
    "`rlhf-nb trl dpo ... --accelerate_config cpu_2proc --num_processes 2`: checked here, then run by `accelerate launch`."
    r = run(["trl", "dpo", "--max_steps", "2", "--output_dir", "D", *SMALL, "--accelerate_config", "cpu_2proc",
             "--num_processes", "2"], tmp_path)
    assert "-m accelerate.commands.launch --config_file" in r.stderr and "-m rlhf_nb.launch trl dpo" in r.stderr, r.stderr[-3000:]
    out = [l for l in r.stdout.strip().splitlines() if l.startswith('{"')]
    assert r.returncode == 0 and len(out) == 1, r.stderr[-3000:]                  # one summary: rank 0 prints it
    assert (json.loads(out[0])["steps"], json.loads(out[0])["world_size"]) == (2, 2)
    r = run(["trl", "dpo", "--betta", "1", "--accelerate_config", "cpu_2proc"], tmp_path)
    assert r.returncode == 2 and "--betta" in r.stderr and "accelerate.commands.launch" not in r.stderr

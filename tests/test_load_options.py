"""ModelConfig's load options on the native command line: a checkpoint with its own model code loads only with
--trust_remote_code, and --torch_dtype / --attn_implementation reach the model that is trained and saved."""
import json, os, subprocess, sys
from pathlib import Path

from rlhf_nb.models import custom_code_folder

ENV = {k: v for k, v in os.environ.items() if k not in ("RLHF_NB_DEBUG", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
ENV.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
           OMP_WAIT_POLICY="PASSIVE", TQDM_DISABLE="1", HF_MODULES_CACHE="")
SFT = ["--max_steps", "1", "--eval_steps", "1", "--eval_size", "2", "--n_train", "8", "--per_device_train_batch_size", "4"]


def rlhf_nb(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "rlhf_nb.launch", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def test_sft_of_a_custom_code_checkpoint_with_trust_remote_code_dtype_and_attention(tmp_path):
    src = custom_code_folder(tmp_path / "custom")
    env = {**ENV, "HF_MODULES_CACHE": str(tmp_path / "modules")}                  # the folder's code is copied here
    r = rlhf_nb("sft", "--model_name_or_path", src, *SFT, "--output_dir", "no", cwd=tmp_path, env=env)
    lines = [l for l in r.stderr.splitlines() if l.startswith("rlhf-nb")]
    assert r.returncode == 2 and len(lines) == 1 and "pass --trust_remote_code" in lines[0], r.stderr[-2000:]
    assert not (tmp_path / "no" / "model.safetensors").exists()
    r = rlhf_nb("sft", "--model_name_or_path", src, "--trust_remote_code", "--torch_dtype", "bfloat16",
                "--attn_implementation", "eager", *SFT, "--output_dir", "yes", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    cfg, summary = (json.loads((tmp_path / "yes" / f).read_text()) for f in ("config.json", "summary.json"))
    assert cfg["architectures"] == ["TinyRemoteForCausalLM"] and cfg["dtype"] == "bfloat16"    # the folder's class, in bf16
    assert summary["attn_implementation"] == "eager" and summary["args"]["trust_remote_code"] is True


def test_ppo_policy_reference_critic_and_reward_model_load_with_the_options(tmp_path, monkeypatch):
    "One PPOConfig's attn_implementation and torch_dtype reach every model the RL trainer loads from a folder."
    import torch
    from rlhf_nb.models import char_tokenizer, tiny_causal_lm, tiny_value_model
    from rlhf_nb.ppo import PPOConfig, RLTrainer
    monkeypatch.setenv("TQDM_DISABLE", "1")
    tok = char_tokenizer()
    for name, model in (("policy", tiny_causal_lm(tok)), ("rm", tiny_value_model(tok, head_std=0.1))):
        model.save_pretrained(tmp_path / name); tok.save_pretrained(tmp_path / name)
    cfg = PPOConfig(model_name_or_path=str(tmp_path / "policy"), reward_model_path=str(tmp_path / "rm"), attn_implementation="eager",
                    torch_dtype="bfloat16", per_device_train_batch_size=2, max_steps=1, arith_train_size=8, eval_steps=0,
                    output_dir=str(tmp_path / "out"), disable_tqdm=True)
    t = RLTrainer(cfg).init_workers()
    roles = {r.name: w for r, w in t.workers.items()}
    models = {"policy": t.policy, "reference": roles["RefPolicy"].reference.model, "critic": roles["Critic"].value_model,
              "reward model": t.reward_manager.model_reward.model}
    for what, m in models.items():
        assert m.config._attn_implementation == "eager", what
        assert {p.dtype for p in m.parameters()} == {torch.bfloat16}, what
    assert type(models["critic"]).__name__ == "Qwen2ForSequenceClassification"        # started from the reward model's folder

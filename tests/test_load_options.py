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

"""--push_to_hub of the native trainers, end to end in this process, with the upload pointed at a local folder that
stands in for the Hub (HfApi's create_repo / upload_folder, the two calls push_to_hub makes): the final model, its
tokenizer and a model card with the config and final metrics arrive; a private repo is created private."""
import json, shutil
from pathlib import Path

import pytest
import yaml

from rlhf_nb import launch, tracking

TINY = ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8",
        "--arith_train_size", "64", "--eval_steps", "0", "--disable_tqdm", "true", "--max_steps", "2"]


class LocalFolderHub:
    "HfApi's create_repo / upload_folder, writing to a local folder instead of the network."
    def __init__(self, root): self.root, self.repos = Path(root), {}
    def create_repo(self, repo_id, private=False, exist_ok=True, repo_type="model"): self.repos[repo_id] = {"private": private}
    def upload_folder(self, folder_path, repo_id, repo_type="model", commit_message=""):
        assert repo_id in self.repos, "upload before create_repo"
        shutil.copytree(folder_path, self.root / repo_id, dirs_exist_ok=True)
        return str(self.root / repo_id)


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    hub = LocalFolderHub(tmp_path / "hub")
    monkeypatch.setattr(tracking, "hub_api", lambda: hub)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    return hub


@pytest.mark.parametrize("algo", ["grpo", "dpo"])
def test_push_to_hub_uploads_to_a_local_folder_standing_in_for_the_hub(tmp_path, local_hub, monkeypatch, algo):
    monkeypatch.chdir(tmp_path)
    args = TINY if algo == "grpo" else ["--max_steps", "2", "--per_device_train_batch_size", "2", "--num_pairs", "4",
                                        "--num_eval_pairs", "0", "--num_eval_prompts", "0", "--rejected_from_policy", "false",
                                        "--max_length", "32", "--eval_steps", "100"]
    rc = launch.main([algo, *args, "--output_dir", "run", "--push_to_hub", "true", "--hub_model_id", f"me/tiny-{algo}",
                      "--hub_private_repo", "true"])
    assert rc == 0
    repo = tmp_path / "hub" / "me" / f"tiny-{algo}"
    assert local_hub.repos == {f"me/tiny-{algo}": {"private": True}}
    names = {p.name for p in repo.iterdir()}
    assert {"README.md", "config.json", "model.safetensors", "tokenizer_config.json"} <= names, names
    card = (repo / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert algo in front["tags"] and "rlhf-nb" in front["tags"]
    config = yaml.safe_load(card.split("```yaml\n")[1].split("```")[0])
    assert config["output_dir"] == "run" and config["max_steps"] == 2
    final = json.loads((tmp_path / "run" / "summary.json").read_text())["final"]
    key = "score/mean" if algo == "grpo" else "loss"
    assert f"| `{key}` | {final[key]:.6g} |" in card

"""The rollout corrections of rlhf_nb.rollout_corr through the command line: keep_sampling_mask and
importance_sampling_mode geometric_mask in one 2-step GRPO run (top-k/top-p on), and their refusals."""
import json

import pytest

from rlhf_nb import launch

TINY = ["--max_steps", "2", "--num_generations", "4", "--per_device_train_batch_size", "4", "--max_completion_length", "8",
        "--arith_train_size", "64", "--eval_steps", "0", "--disable_tqdm", "true"]


def run(capsys, monkeypatch, tmp_path, *args):
    monkeypatch.delenv("RLHF_NB_DEBUG", raising=False); monkeypatch.chdir(tmp_path); capsys.readouterr()
    rc = launch.main(["grpo", *TINY, *args])
    return rc, capsys.readouterr().err


def test_keep_sampling_mask_closes_the_gap_with_top_p_and_top_k(capsys, monkeypatch, tmp_path):
    rc, err = run(capsys, monkeypatch, tmp_path, "--output_dir", "g", "--top_p", "0.8", "--top_k", "8",
                  "--keep_sampling_mask", "true", "--fast_paths", "false",
                  "--importance_sampling_mode", "geometric_mask", "--importance_sampling_cap", "1.001")
    assert rc == 0, err
    rows = [json.loads(l) for l in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "sampling/kl_prox_behav" in r]
    assert len(steps) == 2
    for r in steps:                                     # fp32, one model: the sampler's kept-set log-probs are the trainer's
        assert r["sampling/kl_prox_behav"] < 1e-6 and r["sampling/sampling_logp_difference/max"] < 1e-5, r
        assert r["sampling/importance_sampling_ratio/min"] == 1.0    # geometric_mask: every row kept, weight 1


@pytest.mark.parametrize("args,msg", [
    (["--keep_sampling_mask", "true", "--top_p", "0.8"],
     "keep_sampling_mask runs on the plain trainer with a synchronous sampler: it needs fast_paths false"),
    (["--importance_sampling_mode", "geometric", "--importance_sampling_cap", "1.0"],
     "importance_sampling_mode geometric_mask keeps rows with 1/cap <= rho_geo <= cap"),
])
def test_refusals_name_the_option(capsys, monkeypatch, tmp_path, args, msg):
    rc, err = run(capsys, monkeypatch, tmp_path, "--output_dir", "r", *args)
    assert rc == 2 and f"rlhf-nb grpo: error: {msg}" in err, err
    assert not (tmp_path / "r").exists()

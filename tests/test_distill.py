"""`rlhf-nb distill` from the command line, in this process (`launch.main`): three synchronous steps that bring the
student closer to its teacher, the top-k variant, the asynchronous sampler (`max_staleness 1`) with the teacher on a
Ray pool of its own, and the one-line refusals (another tokenizer, a teacher path that is not a model, no teacher).

The teacher is a tiny model with the student's tokenizer and another seed, its output sharpened (final norm scaled),
so a fresh tiny student starts about 0.4 nats per token away from it; responses of 2 tokens and 64 samples a step
keep the sampled reverse KL's noise below what three steps take off it. The objective itself is tested in
nbs/02c_distill.ipynb."""
import json
from pathlib import Path

import pytest
import torch

from rlhf_nb import launch
from rlhf_nb.models import char_tokenizer, tiny_causal_lm

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--max_completion_length", 2, "--per_device_train_batch_size", 32, "--num_generations", 2, "--arith_train_size", 128,
       "--eval_steps", 0, "--learning_rate", 3e-3, "--disable_tqdm", "true", "--save_final", "false", "--report_to", "none"]


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    "{'sharp': a teacher with the student's tokenizer, 'other': one with another tokenizer, 'empty': a folder, no model}."
    root, tok = tmp_path_factory.mktemp("teachers"), char_tokenizer()
    sharp = tiny_causal_lm(tok, seed=1)
    with torch.no_grad(): sharp.model.norm.weight.mul_(4.0)
    sharp.save_pretrained(root / "sharp"); tok.save_pretrained(root / "sharp")
    other_tok = char_tokenizer(chars="0123456789+-=xyz")
    tiny_causal_lm(other_tok, seed=1).save_pretrained(root / "other"); other_tok.save_pretrained(root / "other")
    (root / "empty").mkdir()
    return {k: str(root / k) for k in ("sharp", "other", "empty")}


def distill(out, teacher, *extra):
    return launch.main(["distill", "--output_dir", str(out), "--teacher_model_name_or_path", teacher, *map(str, RUN), *map(str, extra)])


def rows(out):
    return [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]


def test_three_steps_bring_the_student_closer_to_its_teacher(tmp_path, teachers):
    assert distill(tmp_path / "run", teachers["sharp"], "--max_steps", 3) == 0
    m = rows(tmp_path / "run")
    assert len(m) == 3 and all(k in m[0] for k in ("distill/reverse_kl", "distill/reverse_kl_seq", "distill/teacher_logprob",
                                                    "actor/pg_loss", "actor/grad_norm")), sorted(m[0])
    kl = [r["distill/reverse_kl"] for r in m]
    assert kl[-1] < kl[0] and (kl[1] + kl[2]) / 2 < 0.8 * kl[0], kl     # 0.55, 0.27, 0.38 nats per token on this seed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["algo"] == "distill" and summary["steps"] == 3


def test_topk_forward_kl_is_in_the_loss(tmp_path, teachers):
    assert distill(tmp_path / "run", teachers["sharp"], "--max_steps", 2, "--distill_topk", 8) == 0
    m = rows(tmp_path / "run")
    assert len(m) == 2 and all(r["distill/topk_forward_kl"] > 0 for r in m), m
    assert all(r["actor/pg_loss"] == 0 for r in m)                      # reward_coef 0: the teacher's term alone


def test_ray_teacher_pool_with_max_staleness_1(tmp_path, teachers, monkeypatch):
    "One Ray cluster: the actor on its pool, the teacher beside the sampler on another, the sampler one version ahead."
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", str(ROOT)); monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        assert distill(tmp_path / "ray", teachers["sharp"], "--max_steps", 2, "--placement", "ray", "--max_staleness", 1,
                       "--per_device_train_batch_size", 4, "--resource_pools", "trainer=1,side=1", "--ray_num_cpus", 2,
                       "--ray_cpus_per_worker", 1, "--role_pools", "ActorRollout=trainer,Teacher=side,Rollout=side") == 0
    finally:
        if ray.is_initialized(): ray.shutdown()
    m = rows(tmp_path / "ray")
    assert len(m) == 2 and all("distill/reverse_kl" in r and "staleness/mean" in r for r in m), sorted(m[0])
    workers = json.loads((tmp_path / "ray" / "ray_workers.json").read_text())
    assert sorted({w["pool"]: w["roles"] for w in workers}["side"]) == ["Rollout", "Teacher"]


@pytest.mark.parametrize("teacher, says", [("other", "uses another tokenizer than the student"),
                                           ("empty", "has no config.json: not a saved model folder")])
def test_a_wrong_teacher_is_one_line_before_any_sampling(tmp_path, teachers, capfd, teacher, says):
    assert distill(tmp_path / "run", teachers[teacher], "--max_steps", 1) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlhf-nb distill: error: ") and says in err[0], err
    assert "teacher_model_name_or_path" in err[0]
    assert not (tmp_path / "run" / "samples.jsonl").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_no_teacher_is_one_line(tmp_path, capfd):
    assert launch.main(["distill", "--output_dir", str(tmp_path / "run")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--teacher_model_name_or_path is required" in err[0], err

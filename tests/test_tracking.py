"""`report_to` in the native trainers, end to end through the console script: a GRPO run reporting to W&B (offline),
Trackio (local) and TensorBoard writes each tracker's files, with TRL's metric names; DPO reports to TensorBoard; a
tracker that is not installed stops the run with one line naming the pip extra."""
import json, os, sqlite3, subprocess, sys
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "WANDB_MODE": "offline",
       "WANDB_SILENT": "true"}
for k in ("RLHF_NB_DEBUG", "TRACKIO_DIR", "WANDB_DIR"): ENV.pop(k, None)
TINY = ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "8",
        "--arith_train_size", "64", "--eval_steps", "0", "--disable_tqdm", "true", "--max_steps", "2"]


def rlhf_nb(*args, cwd, env=ENV):
    return subprocess.run([sys.executable, "-m", "rlhf_nb.launch", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def tb_tags(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(folder)); ea.Reload()
    return {t: [e.step for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def test_grpo_reports_to_wandb_offline_trackio_and_tensorboard(tmp_path):
    pytest.importorskip("wandb"); pytest.importorskip("trackio")
    r = rlhf_nb("grpo", *TINY, "--report_to", "wandb,trackio,tensorboard", "--output_dir", "g", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "g"
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0                            # W&B, offline: nothing left the machine
    db = sqlite3.connect(out / "trackio" / "rlhf-nb.db")                           # Trackio: a local SQLite file
    rows = [json.loads(m) for (m,) in db.execute("select metrics from metrics order by step")]
    assert len(rows) == 2 and {"objective/kl", "objective/scores", "loss/policy_avg", "policy/entropy_avg",
                               "completions/mean_length"} <= set(rows[0])
    tags = tb_tags(out / "tensorboard")
    assert tags["objective/kl"] == [1, 2] and "kl/mean" not in tags                # TRL's names on the dashboards
    assert "kl/mean" in json.loads((out / "metrics.jsonl").read_text().splitlines()[0])   # native names in the file


def test_dpo_reports_to_tensorboard(tmp_path):
    r = rlhf_nb("dpo", "--max_steps", "2", "--per_device_train_batch_size", "2", "--num_pairs", "4", "--num_eval_pairs", "0",
                "--num_eval_prompts", "0", "--rejected_from_policy", "false", "--max_length", "32", "--eval_steps", "100",
                "--logging_steps", "1", "--report_to", "tensorboard", "--output_dir", "d", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    tags = tb_tags(tmp_path / "d" / "tensorboard")
    assert tags["loss"] == [1, 2] and "rewards/accuracies" in tags


def metric_table():
    "The markdown of the metric table's section in nbs/00h_tracking.ipynb."
    nb = json.loads((Path(__file__).resolve().parents[1] / "nbs" / "00h_tracking.ipynb").read_text())
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    return next(m for m in md if m.startswith("## Every metric, one name"))


@pytest.mark.parametrize("algo,extra", [("grpo", ["--filter_groups", "true"]), ("ppo", ["--adv_estimator", "gae", "--eval_steps", "2"]),
                                        ("dpo", None)])
def test_every_logged_metric_has_one_documented_name(tmp_path, algo, extra):
    from rlhf_nb.tracking import documented_metric
    if extra is None: args = ["dpo", "--max_steps", "2", "--per_device_train_batch_size", "2", "--num_pairs", "4", "--num_eval_pairs", "2",
                              "--num_eval_prompts", "4", "--rejected_from_policy", "false", "--max_length", "32", "--eval_steps", "2", "--logging_steps", "1"]
    else: args = [algo, *TINY, *extra]
    r = rlhf_nb(*args, "--output_dir", "r", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    keys = {k for l in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines() for k in json.loads(l)}
    table = metric_table()
    assert not [k for k in keys if not documented_metric(k, table)], "metrics missing from the table in nbs/00h_tracking.ipynb"
    assert not [k for k in keys if k.startswith("reward/reward/") or k in ("reward/response_length/mean", "response_length/mean")]
    if algo != "dpo": assert {"score/mean", "score/min", "reward/mean", "reward/arith/mean", "kl/mean"} <= keys


@pytest.mark.parametrize("tracker", ["wandb", "trackio"])
def test_missing_tracker_is_one_line_naming_the_extra(tmp_path, tracker):
    shim = tmp_path / "shim" / tracker
    shim.mkdir(parents=True); (shim / "__init__.py").write_text(f"raise ImportError('no module named {tracker}')\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), ENV.get("PYTHONPATH", "")])}
    r = rlhf_nb("grpo", *TINY, "--report_to", tracker, "--output_dir", "g", cwd=tmp_path, env=env)
    lines = [l for l in r.stderr.strip().splitlines() if "Warning" not in l and not l.startswith("  warnings.warn")]
    assert r.returncode == 2 and lines == [f"rlhf-nb grpo: error: report_to={tracker} needs the {tracker} package: "
                                           f"pip install 'rlhf-nb[{tracker}]'"], r.stderr
    assert not (tmp_path / "g" / "checkpoint-1").exists()


def tb_times(folder, tag="loss"):
    "(step, wall time) of each `tag` event in the TensorBoard folder."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(folder)); ea.Reload()
    return [(e.step, e.wall_time) for e in ea.Scalars(tag)]


def test_sft_and_rm_stream_each_step_to_tensorboard_before_the_model_is_saved(tmp_path):
    for stage, extra in (("sft", ["--eval_size", "4", "--n_train", "16", "--per_device_train_batch_size", "4"]),
                         ("rm", ["--eval_size", "4", "--n_train", "8"])):
        out = tmp_path / stage
        r = rlhf_nb(stage, "--max_steps", "2", "--eval_steps", "2", *extra, "--report_to", "tensorboard", "--output_dir", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        events, saved = tb_times(out / "tensorboard"), (out / "summary.json").stat().st_mtime
        assert [s for s, _ in events] == [1, 2]
        assert all(t < saved for _, t in events), (events, saved)          # written at each step, not replayed after the save
        assert (out / "model.safetensors").exists()                         # the model folder kept beside the events
    r = rlhf_nb("sft", "--max_steps", "2", "--report_to", "mlflow", "--output_dir", "bad", cwd=tmp_path)
    assert r.returncode == 2 and "unknown sink 'mlflow'" in r.stderr and not (tmp_path / "bad" / "model.safetensors").exists()

"""Two CPU processes really are two ranks, for PPO, GRPO and DPO through the `rlhf-nb` entry point:
each rank trains on its own shard of the global batch, metrics are averaged across ranks, the weights stay
bit-identical on both ranks, only the main process writes metrics/checkpoints/models, named data is prepared once,
and N steps with 2 processes match N steps with 1 process at the same global batch (sampling made a function of
(step, prompt, sample) by tests/_dist_worker.py, so both runs see the same completions).

Launched as `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml tests/_dist_worker.py ...` WITHOUT
ACCELERATE_USE_CPU in the environment: the entry point must set it itself. Free ports (main_process_port 0),
bounded time, tiny model, a few steps."""
import dataclasses, json, os, subprocess, sys
from pathlib import Path

import pytest
import torch

from rlhf_nb import launch
from rlhf_nb.algos import GRPOConfig
from rlhf_nb.arith import make_arith

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_dist_worker.py"
CPU2 = ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
for k in ("ACCELERATE_USE_CPU", "WORLD_SIZE", "RANK", "LOCAL_RANK", "RLHF_NB_DEBUG"): ENV.pop(k, None)
TIMEOUT = 600
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU two-process layout is for machines without CUDA")


def run_worker(record, args, processes, seeded=True, cwd=None):
    env = {**ENV, "RLHF_NB_TEST_RECORD": str(record), "RLHF_NB_TEST_SEEDED_ROLLOUT": "1" if seeded else "0"}
    cmd = [sys.executable, str(WORKER), *map(str, args)]
    if processes == 2:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU2), *cmd[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=cwd or record.parent)
    assert r.returncode == 0, r.stderr[-4000:]
    ranks = [json.loads((record / f"rank{i}.json").read_text()) for i in range(processes)]
    params = [torch.load(record / f"rank{i}_params.pt") for i in range(processes)]
    return r, ranks, params


def check_two_ranks(ranks, params, n_per_rank):
    "World 2, disjoint shards of equal size, identical reduced metrics and bit-identical weights."
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"]):
        assert len(s0) == len(s1) == n_per_rank and not set(s0) & set(s1), (s0, s1)
    train = lambda h: [{k: v for k, v in r.items() if not k.startswith("eval")} for r in h]   # evaluation: main only
    assert train(ranks[0]["history"]) == train(ranks[1]["history"])   # reduced: the same numbers on both ranks
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and torch.equal(params[0], params[1])


def check_matches_one_process(two, one, p2, p1, key, init, rtol=1e-4):
    "Same global batches, same per-step metric, same weights (and the weights did move)."
    for s2a, s2b, s1 in zip(two[0]["steps"], two[1]["steps"], one[0]["steps"]):
        assert sorted(s2a + s2b) == sorted(s1)
    h2 = [h[key] for h in two[0]["history"] if key in h]; h1 = [h[key] for h in one[0]["history"] if key in h]
    assert len(h2) == len(h1) > 0
    assert torch.allclose(torch.tensor(h2), torch.tensor(h1), rtol=1e-4, atol=1e-5), (h2, h1)
    moved = (p1[0][:len(init)] - init).abs().max().item()                  # the policy's part of the vector
    assert moved > 1e-4, "training did not change the weights: the comparison would be empty"
    diff = (p2[0] - p1[0]).abs().max().item()
    assert diff <= rtol * max(1.0, p1[0].abs().max().item()) + 1e-6, f"2 vs 1 process: max |dw| = {diff:.3g} (moved {moved:.3g})"


def initial_policy_params():
    from rlhf_nb.models import load_causal_lm
    m = load_causal_lm("tiny", seed=0)
    return torch.cat([p.detach().float().flatten() for _, p in sorted(m.named_parameters(), key=lambda x: x[0])])


def digit_rows(path, n_train=64, n_test=8):
    "Arithmetic prompts scored by the test reward `test_digits` (see the worker), as a rows file."
    rows = [{**r, "data_source": "test_digits"} for r in make_arith(n_train, "train") + make_arith(n_test, "test")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


# --- the trap the entry point fixes ---------------------------------------------------------------------------

def test_config_file_alone_gives_one_rank_without_accelerate_use_cpu(tmp_path):
    "Why rlhf-nb sets ACCELERATE_USE_CPU itself: a bare script under the MULTI_GPU+use_cpu file sees world size 1."
    probe = tmp_path / "probe.py"
    # one write() per line: two processes share the pipe, and print's separate writes can interleave ("WORLDWORLD 1")
    probe.write_text("import os\nfrom accelerate import Accelerator\n"
                     "os.write(1, f'WORLD {Accelerator().num_processes}\\n'.encode())\n")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU2), str(probe)]
    bare = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    fixed = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env={**ENV, "ACCELERATE_USE_CPU": "1"})
    assert bare.stdout.split().count("WORLD") == 2 and "WORLD 2" not in bare.stdout, bare.stdout   # two processes, each alone
    assert fixed.stdout.count("WORLD 2") == 2, fixed.stdout


# --- GRPO -----------------------------------------------------------------------------------------------------

def grpo_args(out, per_device, data_dir, source):
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    args = ["grpo", "--dataset", "rows", "--dataset_source", source, "--data_dir", data_dir, "--output_dir", out,
            "--per_device_train_batch_size", per_device, "--num_generations", 4, "--max_steps", 3, "--save_steps", 2,
            "--max_completion_length", 8, "--learning_rate", 1e-3, "--kl_coef", 0.01, "--eval_steps", 0,
            "--disable_tqdm", "true", "--seed", 0]
    # a loss that is a mean of per-sequence means: with equal shards, the mean over ranks equals the global one
    if "loss_type" in fields: args += ["--loss_type", "grpo"]
    else: args += ["--loss_agg_mode", "seq-mean-token-mean"]
    if "filter_groups" in fields: args += ["--filter_groups", "false"]
    return args


def test_grpo_two_processes(tmp_path):
    src = digit_rows(tmp_path / "rows.jsonl")
    r2, two, p2 = run_worker(tmp_path / "rec2", grpo_args("out2", 2, "data", src), 2)
    check_two_ranks(two, p2, n_per_rank=2)
    # data prepared once: the main process prepared, the other rank found it
    assert r2.stderr.count("data: prepared rows") == 1 and r2.stderr.count("data: reusing rows") == 1, r2.stderr[-2000:]
    # one writer: 3 metric lines (not 6), checkpoints written once (+ one RNG state per rank), a summary
    out = tmp_path / "out2"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-3", "metrics.jsonl", "samples.jsonl", "summary.json"]
    assert sorted(p.name for p in (out / "checkpoint-3").iterdir()) == ["optimizer.pt", "policy", "rng_state_0.pt",
                                                                          "rng_state_1.pt", "trainer_state.json"]
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 2 and s["ranks_identical"] and s["param_checksums"] == [two[0]["checksum"]] * 2
    # metrics are the mean over ranks: the logged score is the mean of the two ranks' local scores
    for step, h in enumerate(two[0]["history"]):
        assert abs(h["score/mean"] - (two[0]["local_scores"][step] + two[1]["local_scores"][step]) / 2) < 1e-6
    # the same 3 steps in one process with the same global batch (4 prompts x 4 completions)
    _, one, p1 = run_worker(tmp_path / "rec1", grpo_args("out1", 4, "data", src), 1)
    assert one[0]["world"] == 1
    check_matches_one_process(two, one, p2, p1, "score/mean", initial_policy_params())


# --- PPO ------------------------------------------------------------------------------------------------------

def ppo_args(out, per_device, source):
    # a mean of per-sequence means and no whitening: 2 processes compute the 1-process update with no cross-rank statistics
    return ["ppo", "--output_dir", out, "--per_device_train_batch_size", per_device, "--max_steps", 3,
            "--dataset", "rows", "--dataset_source", source, "--data_dir", "data",
            "--max_completion_length", 8, "--eval_steps", 0, "--learning_rate", 1e-3,
            "--whiten_advantages", "false", "--loss_agg_mode", "seq-mean-token-mean", "--num_ppo_epochs", 2,
            "--disable_tqdm", "true", "--seed", 0, "--save_final", "false"]


def test_ppo_two_processes(tmp_path):
    src = digit_rows(tmp_path / "rows.jsonl")
    r2, two, p2 = run_worker(tmp_path / "rec2", ppo_args("out2", 4, src), 2)
    check_two_ranks(two, p2, n_per_rank=4)
    out = tmp_path / "out2"
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "samples.jsonl", "summary.json"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    _, one, p1 = run_worker(tmp_path / "rec1", ppo_args("out1", 8, src), 1)
    # the vectors hold actor and critic weights: both must match
    check_matches_one_process(two, one, p2, p1, "critic/vf_loss", initial_policy_params())


def ppo_default_args(out, per_device, source):
    "PPO's defaults: a token-mean loss and advantage whitening, both over the global batch."
    a = ppo_args(out, per_device, source)
    for flag in ("--whiten_advantages", "--loss_agg_mode"):
        i = a.index(flag); del a[i:i + 2]
    return a


def test_ppo_defaults_match_one_process(tmp_path):
    "Token-mean weights and whitening statistics are global, so with PPO's defaults 2 processes still equal 1 process."
    src = digit_rows(tmp_path / "rows.jsonl")
    _, two, p2 = run_worker(tmp_path / "rec2", ppo_default_args("out2", 4, src), 2)
    check_two_ranks(two, p2, n_per_rank=4)
    _, one, p1 = run_worker(tmp_path / "rec1", ppo_default_args("out1", 8, src), 1)
    check_matches_one_process(two, one, p2, p1, "score/mean", initial_policy_params())


def test_ppo_defaults_keep_ranks_identical(tmp_path):
    "PPO's defaults with each rank sampling its own responses: the ranks never diverge."
    args = ["ppo", "--output_dir", "out", "--per_device_train_batch_size", 4, "--max_steps", 2, "--max_completion_length", 8,
            "--arith_train_size", 64, "--eval_steps", 0, "--disable_tqdm", "true", "--save_final", "false"]
    _, two, p2 = run_worker(tmp_path / "rec", args, 2, seeded=False)
    check_two_ranks(two, p2, n_per_rank=4)


# --- DPO ------------------------------------------------------------------------------------------------------

def dpo_args(out, per_device):
    return ["dpo", "--output_dir", out, "--num_pairs", 32, "--num_eval_pairs", 8, "--num_eval_prompts", 0,
            "--rejected_from_policy", "false", "--per_device_train_batch_size", per_device, "--max_steps", 3,
            "--eval_steps", 2, "--logging_steps", 1, "--learning_rate", 1e-3, "--seed", 0]


def test_dpo_two_processes(tmp_path):
    _, two, p2 = run_worker(tmp_path / "rec2", dpo_args("out2", 4), 2, seeded=False)
    check_two_ranks(two, p2, n_per_rank=4)
    for r in range(2):                                                # data-parallel through accelerate's DDP wrapper
        assert json.loads((tmp_path / "rec2" / f"rank{r}_dpo.json").read_text())["model_wrapped"] == "DistributedDataParallel"
    out = tmp_path / "out2"
    assert sorted(p.name for p in out.iterdir()) == ["final", "metrics.jsonl", "summary.json"]
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]                  # one writer: each step once
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2
    _, one, p1 = run_worker(tmp_path / "rec1", dpo_args("out1", 8), 1, seeded=False)
    check_matches_one_process(two, one, p2, p1, "loss", initial_policy_params())


# --- the checked launcher path of the console script ----------------------------------------------------------

def test_cli_accelerate_config_relaunch(tmp_path):
    "`rlhf-nb grpo ... --accelerate_config cpu_2proc` checks here, then runs `accelerate launch -m rlhf_nb.launch grpo`."
    import shutil
    exe = shutil.which("rlhf-nb")
    cmd = ([exe] if exe else [sys.executable, "-m", "rlhf_nb.launch"]) + [
        "grpo", "--accelerate_config", "cpu_2proc", "--output_dir", "out", "--per_device_train_batch_size", "2",
        "--num_generations", "2", "--max_steps", "2", "--max_completion_length", "4", "--arith_train_size", "32",
        "--eval_steps", "0", "--disable_tqdm", "true"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=ENV, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "-m accelerate.commands.launch --config_file" in r.stderr and "-m rlhf_nb.launch grpo" in r.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["world_size"] == 2 and s["ranks_identical"] and len(s["param_checksums"]) == 2
    assert len((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()) == 2

"The benchmark harness (bench/run.py): interleaving, per-arm processes, ratios, reports, --gpu skip and dry run."
import json, os, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import run as R  # noqa: E402
import arms as A  # noqa: E402


def test_round_times_drop_warmup_and_pair_steps():
    stamps = [(0, 0.0, 0.0), (1, 1.0, 0.5), (2, 3.0, 1.0), (3, 3.5, 1.5), (4, 4.0, 2.0), (5, 4.2, 2.5), (6, 5.0, 3.0)]
    assert A._round_times(stamps, 2, 1) == [1.0, 1.0]          # rounds (2->4) and (4->6); round 0->2 is warm-up
    assert A._round_times(stamps, 1, 0)[:2] == [1.0, 2.0]
    assert A._round_times(stamps, 2, 1, cpu=True) == [1.0, 1.0]
    t = A._timing(stamps, 2, 1, "round")
    assert t["round_s"] == 1.0 and t["round_cpu_s"] == 1.0


def test_summarize_and_ratio_of_interleaved_arms(tmp_path):
    log = open(tmp_path / "arms.log", "w")
    arms = [("a", "selftest", {"threads": 1, "value": 2.0, "mb": 64}, None),
            ("b", "selftest", {"threads": 1, "value": 4.0, "mb": 0}, None)]
    res = R.ab("t", arms, 2, ["value", "peak_rss_mb"], log)
    assert res["order"] == ["a", "b", "a", "b"]                 # interleaved A, B, A, B
    assert res["ratios"]["value"] == pytest.approx(0.5)
    assert res["paired_ratios"]["value"]["median"] == pytest.approx(0.5)
    # each arm is its own process: the 64 MB buffer shows in a's peak RSS only (VmHWM: ru_maxrss of a forked child
    # also carries the parent's RSS at fork time, which under pytest is large)
    res = R.ab("t", arms, 1, ["vm_hwm_mb"], log)
    assert res["arms"]["a"]["summary"]["vm_hwm_mb"]["min"] > res["arms"]["b"]["summary"]["vm_hwm_mb"]["max"] + 60


def test_failing_and_missing_arms_are_reported_not_fatal(tmp_path):
    log = open(tmp_path / "arms.log", "w")
    res = R.ab("t", [("x", "selftest", {"threads": 1, "fail": True}, None)], 1, ["value"], log)
    assert "selftest asked to fail" in res["arms"]["x"]["errors"][0]
    r = R.run_arm("no_such_arm", {"threads": 1})
    assert "unknown arm" in r["error"]


def test_reports_written(tmp_path):
    out = tmp_path / "res.json"
    rc = R.main(["--gpu", "--dry_run", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    g = res["benches"]["gpu"]["arms"]["hf-qwen2-0.5b-shape"]["reps"][0]
    assert g["dry_run"] and g["gen_tok_per_s"] > 0 and g["train_tok_per_s"] > 0
    assert res["machine"]["cores"] >= 1 and res["uptime_before"] and "torch" in res["versions"]
    assert "gpu" in out.with_suffix(".md").read_text()


def test_gpu_mode_skips_cleanly_without_cuda(tmp_path):
    import torch
    if torch.cuda.is_available(): pytest.skip("a GPU is present")
    out = tmp_path / "res.json"
    assert R.main(["--gpu", "--out", str(out)]) == 0
    assert not out.exists()                                     # nothing written, nothing failed


def test_peak_flops_table():
    assert A.peak_tflops("NVIDIA H100 80GB HBM3")[0] == pytest.approx(989.4)
    assert A.peak_tflops("NVIDIA H100 PCIe")[0] == pytest.approx(756.0)
    assert A.peak_tflops("mystery")[0] is None and A.peak_tflops("mystery", 100)[0] == 100


# --- bench/throughput.py: RL steps of the CLI's trainer on a 0.5B-shaped model (a tiny shape here) -----------------
import throughput as T  # noqa: E402


def test_rl_throughput_dry_run_accounting():
    "The CPU dry run of the GPU throughput code at a tiny shape (bf16 autocast on the CPU too): the token and FLOP accounting."
    dry = T.rl_throughput("grpo", **T.DRY_RUNS["grpo"])
    assert (dry["algo"], dry["dtype"], dry["episodes_per_step"]) == ("grpo", "bf16", 8)
    assert dry["tokens_per_s"] == pytest.approx(8 * (dry["prompt_tokens"] + dry["response_tokens"]) / dry["step_s"], rel=1e-6)
    assert 0 < dry["response_tokens"] <= 8 and dry["mfu"] is None                # no peak known for a CPU
    ppo = T.rl_throughput("ppo", peak_tflops=1.0, **T.DRY_RUNS["ppo"])
    assert ppo["dtype"] == "fp32" and ppo["tflops"] > 0 and ppo["mfu"] == pytest.approx(ppo["tflops"] / 1.0)


def test_parity_reward_on_the_last_token():
    import torch
    batch = {"responses": torch.tensor([[2, 3, 4, 0], [1, 1, 0, 0]]), "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}
    scores, m = T.ParityReward()(batch)
    torch.testing.assert_close(scores, torch.tensor([[0.0, 0.0, 2 / 3, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert m["parity/mean"] == pytest.approx(1 / 3)


def test_throughput_script_skips_cleanly_without_cuda(capsys):
    import torch
    if torch.cuda.is_available(): pytest.skip("a GPU is present")
    assert T.main(["--algo", "grpo"]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


def test_one_peak_table_for_both_gpu_benches():
    assert A.PEAK_BF16_TFLOPS is T.PEAK_BF16_TFLOPS and A.QWEN05_SHAPE is T.QWEN25_05B_SHAPE


def test_sft_start_per_size_is_keyed_on_its_shape_and_settings():
    "The accuracy race's SFT start: the demo keeps its old cache folder and call; other sizes get their shape and settings."
    import common as C
    assert C.sft_dir("demo").name == "sft_start" and C.sft_kwargs("demo") == {}
    kw = C.sft_kwargs("6.3M")
    assert kw["model_kw"] == C.SIZES["6.3M"] and kw["learning_rate"] < 3e-3
    assert C.sft_dir("6.3M") != C.sft_dir("demo") and C.sft_dir("6.3M").parent == C.WORK
    with pytest.raises(ValueError, match="unknown model size '7B'"): C.sft_kwargs("7B")


def test_grpo_accuracy_follows_sizes_and_precisions():
    "grpo_accuracy runs at every size x precision like grpo (demo/fp32 keeps the bare key); --quick still refuses it."
    a = R.parse_args(["--only", "grpo_accuracy", "--sizes", "demo,6.3M", "--precision", "all"])
    keys = [k for k, *_ in R.plan(a.only, a.sizes, a.precisions)]
    assert keys == ["grpo_accuracy", "grpo_accuracy@demo/bf16", "grpo_accuracy@6.3M/fp32",
                    "grpo_accuracy@6.3M/bf16"]
    assert R.plan(["rewards", "grpo"], ["6.3M"], ["fp32"]) == [("grpo@6.3M/fp32", "grpo", "6.3M", "fp32"),
                                                               ("rewards", "rewards", None, None)]
    with pytest.raises(SystemExit, match="full mode only"): R.main(["--quick", "--only", "grpo_accuracy", "--out", "/nonexistent/x.json"])


def test_accuracy_race_learning_rate_per_size():
    "--acc_lr wins, then the bench's per-size rate, then GRPOConfig's default (the demo's)."
    defaults = {"learning_rate": 3e-4}
    a = R.parse_args(["--only", "grpo_accuracy"])
    assert R.acc_lr(a, "demo", defaults) == (3e-4, "rlhf-nb GRPOConfig's default")
    lr, src = R.acc_lr(a, "6.3M", defaults)
    assert lr == R.ACC_LR["6.3M"] and lr < 3e-4 and "6.3M" in src
    a = R.parse_args(["--only", "grpo_accuracy", "--acc_lr", "5e-5"])
    assert R.acc_lr(a, "6.3M", defaults) == (5e-5, "--acc_lr")


def test_rollout_engines_bench_logic(tmp_path):
    "bench/rollout_engines.py: the 0.5B shape with the character vocabulary, an hf step arm, and the report from a results file."
    import rollout_engines as RE
    from rlhf_nb.models import char_tokenizer
    assert RE.shape("0.5B", len(char_tokenizer()))["hidden_size"] == 896
    r = RE.step_arm("demo", "hf", False, steps=1)
    assert r["sync_s"] is None and r["rollout_s"] > 0                           # the shared hf engine logs no sync and r["train_s"] == pytest.approx(r["logprobs_s"] + r["update_s"])
    res = {"machine": {"date": "d", "cpus": 2, "vllm": "0.32.0", "load_before": 1.0, "load_after": 1.0},
           "steps": [{"size": "demo", "engine": e, "dtype": "fp32", "n_params": 1, "step_s": s, "rollout_s": 1.0, "sync_s": 0.0,
                      "train_s": 1.0, "gen_tokens_per_s": 9.0} for e, s in (("hf", 2.0), ("vllm", 3.0))],
           "sync": [{"size": "demo", "n_params": 1, "mbytes": 3.8, "mode": "colocate", "sync_s": 0.02}]}
    out = tmp_path / "r.json"; out.write_text(json.dumps(res))
    subprocess.run([sys.executable, str(ROOT / "bench/rollout_engines.py"), "--report", "--out", str(out)], check=True, timeout=120)
    md = out.with_suffix(".md").read_text()
    assert "| demo | 1 | fp32 | vllm | 3 | 1 | 0 | 1 | 9 | 1.5 |" in md and "Weight sync against model size" in md

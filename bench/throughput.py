"""RL throughput of rlhf-nb's trainer on a 0.5B-shaped model: `python bench/throughput.py [--algo grpo|ppo|both] [--dry_run]`.

A randomly initialised model with Qwen2.5-0.5B's shape (built locally, no download) runs a few timed steps of the RL
trainer that `rlhf-nb ppo|grpo` uses (`rlhf_nb.algos.rl_trainer_class`), in bf16 on a GPU, scored by a reward that
needs no decoding (`ParityReward`: random init samples token ids the character tokenizer never made). It reports
generation tokens/s, step time and its rollout / log-prob / update parts, peak memory and MFU. MFU counts model
FLOPs with the usual 6N per trained token and 2N per forward-only token (prefill, decoding, old/reference log-probs,
critic values), attention left out, over the device's dense bf16 peak (`PEAK_BF16_TFLOPS`).

`--dry_run` runs exactly that code at a tiny shape on the CPU (bf16 autocast there too), to check the logic and the
accounting; its numbers mean nothing. Without CUDA and without --dry_run it says so and exits 0.
`python bench/run.py --gpu` measures the plain forward/backward throughput of the same shape for comparison."""
from __future__ import annotations
import argparse, json, sys, tempfile

# Qwen2.5-0.5B's architecture (config.json of the hub model), and a tiny shape with the same structure for dry runs.
QWEN25_05B_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                        rms_norm_eps=1e-6, tie_word_embeddings=True)
DRY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=True)
# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' data sheets; first match on the device name.
PEAK_BF16_TFLOPS = [("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("GH200", 989.4), ("B200", 2250.0),
                    ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0), ("RTX 4090", 165.2),
                    ("V100", 125.0), ("T4", 65.0)]


def peak_tflops(device_name, override=None):
    "(peak dense bf16 TFLOP/s of `device_name`, where the number comes from); `override` wins; (None, why) if unknown."
    if override: return float(override), "given with --peak_tflops"
    for key, v in PEAK_BF16_TFLOPS:
        if key.lower() in (device_name or "").lower(): return v, f"{key} dense bf16 data-sheet peak"
    return None, "unknown device: pass --peak_tflops"

_peak_of = peak_tflops   # rl_throughput's `peak_tflops` argument (an override) shadows the function's name


class ParityReward:
    "Synthetic reward for throughput runs: the fraction of even token ids in each response, on its last token."
    def __call__(self, batch):
        import torch
        resp, mask = batch["responses"], batch["response_mask"].float()
        s = ((resp % 2 == 0).float() * mask).sum(-1) / mask.sum(-1).clamp_min(1)
        out = torch.zeros_like(mask)
        out[torch.arange(len(s)), (mask.sum(-1).long() - 1).clamp_min(0)] = s
        return out, {"parity/mean": float(s.mean())}


def _trainer(algo, shape, steps, warmup_steps, prompts_per_step, num_generations, max_completion_length, bf16, seed, output_dir,
             **overrides):
    "The RL trainer the CLI would build for `algo`, on a random-init model of `shape`, with ParityReward."
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from rlhf_nb.algos import GRPOConfig, rl_trainer_class
    from rlhf_nb.arith import make_arith
    from rlhf_nb.models import char_tokenizer
    from rlhf_nb.ppo import PPOConfig
    tok = char_tokenizer()
    torch.manual_seed(seed)
    policy = Qwen2ForCausalLM(Qwen2Config(**shape, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None))
    common = dict(output_dir=output_dir or tempfile.mkdtemp(prefix="rl_throughput-"), max_steps=warmup_steps + steps,
                  per_device_train_batch_size=prompts_per_step, max_completion_length=max_completion_length, eval_steps=0,
                  save_final=False, disable_tqdm=True, bf16=torch.cuda.is_available() if bf16 is None else bf16, seed=seed)
    common.update(overrides)
    cfg = GRPOConfig(num_generations=num_generations, **common) if algo == "grpo" else PPOConfig(kl_coef=0.05, **common)
    rows = make_arith(prompts_per_step * (warmup_steps + steps) * 8, "train", seed=seed)
    return rl_trainer_class(cfg)(cfg, policy=policy, tokenizer=tok, train_dataset=rows, reward_manager=ParityReward()).init_workers()


# GRPO as both rlhf-nb and TRL run it in the side-by-side (`--impl trl`): the same work on both sides, so GRPOConfig's
# group filter (TRL has none) is off and the KL weight, updates per generation and loss aggregation are set on both.
SAME_GRPO = dict(filter_groups=False, kl_coef=0.01, num_ppo_epochs=1, loss_type="dapo", learning_rate=1e-6)


def rl_throughput(algo="grpo", shape=None, steps=3, warmup_steps=1, prompts_per_step=16, num_generations=8,
                  max_completion_length=128, bf16=None, peak_tflops=None, seed=0, output_dir=None, **overrides):
    "Random-init model of `shape` (default Qwen2.5-0.5B's) through `steps` timed RL steps: tokens/s, step time, memory, MFU."
    import torch
    from rlhf_nb.dist import peak_memory
    cuda = torch.cuda.is_available()
    G = num_generations if algo == "grpo" else 1
    trainer = _trainer(algo, dict(QWEN25_05B_SHAPE if shape is None else shape), steps, warmup_steps, prompts_per_step, G,
                       max_completion_length, bf16, seed, output_dir, **overrides)
    cfg, n_params = trainer.config, sum(p.numel() for p in trainer.unwrapped_policy.parameters())
    if cuda: torch.cuda.reset_peak_memory_stats()
    hist = trainer.fit()[warmup_steps:]
    mean = lambda k: sum(h[k] for h in hist) / len(hist)
    episodes = prompts_per_step * G * trainer.world
    P = sum(len(trainer.train_dataset[i]["input_ids"]) for i in range(8)) / 8
    R = mean("response/length")
    T = episodes * (P + R)                                               # tokens per step, all ranks
    n_critic = 0 if trainer.critic is None else sum(p.numel() for p in trainer.accelerator.unwrap_model(trainer.critic).parameters())
    fwd_passes = 1 + int(trainer.reference.active) + int(trainer._kl_in_reward())   # rollout + reference + old log-probs
    flops = (2 * n_params * T * fwd_passes + 6 * n_params * T * cfg.num_ppo_epochs
             + (2 * n_critic * T + 6 * n_critic * T * cfg.num_ppo_epochs))
    step_s = mean("time/step")
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak, peak_source = _peak_of(name if cuda else "", peak_tflops)
    return {"impl": "rlhf-nb", "algo": algo, "device": name, "n_params": n_params, "dtype": "bf16" if cfg.bf16 else "fp32",
            "episodes_per_step": episodes, "prompt_tokens": P, "response_tokens": R, "step_s": step_s,
            "rollout_s": mean("time/rollout"), "logprobs_s": mean("time/logprobs"), "update_s": mean("time/update"),
            "sync_s": mean("time/sync") if all("time/sync" in h for h in hist) else None,
            "gen_tokens_per_s": episodes * R / mean("time/rollout"), "tokens_per_s": T / step_s,
            "tflops": flops / step_s / 1e12, "mfu": flops / step_s / (peak * 1e12) if peak else None,
            "peak_source": peak_source, **peak_memory(), "world_size": trainer.world}


def trl_throughput(shape=None, steps=3, warmup_steps=1, prompts_per_step=16, num_generations=8, max_completion_length=128,
                   bf16=None, peak_tflops=None, seed=0, output_dir=None):
    """TRL's GRPOTrainer on the same random-init model, prompts, lengths and settings as `rl_throughput('grpo', **SAME_GRPO)`:
    step time after warm-up, generation tokens/s, peak memory and MFU by the same FLOP count."""
    import time, torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from rlhf_nb.arith import make_arith
    from rlhf_nb.dataset import to_trl_grpo
    from rlhf_nb.dist import peak_memory
    from rlhf_nb.models import char_tokenizer
    cuda = torch.cuda.is_available()
    tok = char_tokenizer()
    torch.manual_seed(seed)
    shape = dict(QWEN25_05B_SHAPE if shape is None else shape)
    policy = Qwen2ForCausalLM(Qwen2Config(**shape, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None))
    n_params = sum(p.numel() for p in policy.parameters())
    lengths = []
    def parity(prompts, completions, completion_ids, **kw):       # ParityReward's score, from the token ids
        lengths.extend(len(ids) for ids in completion_ids)
        return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]
    stamps = []
    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda: torch.cuda.synchronize()
            stamps.append(time.perf_counter())
    B = prompts_per_step * num_generations
    cfg = GRPOConfig(output_dir=output_dir or tempfile.mkdtemp(prefix="trl_throughput-"), per_device_train_batch_size=B,
                     num_generations=num_generations, max_completion_length=max_completion_length, temperature=1.0,
                     beta=SAME_GRPO["kl_coef"], num_iterations=SAME_GRPO["num_ppo_epochs"], loss_type=SAME_GRPO["loss_type"],
                     learning_rate=SAME_GRPO["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
                     bf16=cuda if bf16 is None else bf16, use_cpu=not cuda, gradient_checkpointing=False,
                     max_steps=warmup_steps + steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
                     seed=seed, dataloader_num_workers=0)
    rows = make_arith(prompts_per_step * (warmup_steps + steps) * 8, "train", seed=seed)
    init = tempfile.mkdtemp(prefix="trl_throughput_init-")                # TRL builds its reference from a path (beta > 0)
    policy.save_pretrained(init); tok.save_pretrained(init); del policy
    cfg.model_init_kwargs = {"dtype": torch.float32}
    trainer = GRPOTrainer(model=init, processing_class=tok, reward_funcs=[parity], args=cfg, train_dataset=to_trl_grpo(rows),
                          callbacks=[Stamp()])
    if cuda: torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter(); trainer.train()
    ends = [t0] + stamps
    step_s = (ends[-1] - ends[warmup_steps]) / steps
    ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in rows[:8]]
    P = sum(len(x["input_ids"] if hasattr(x, "keys") else x) for x in ids) / len(ids)
    R = sum(lengths[B * warmup_steps:]) / max(len(lengths[B * warmup_steps:]), 1)
    T = B * (P + R)
    fwd_passes = 1 + int(SAME_GRPO["kl_coef"] != 0)                     # rollout + reference (on-policy: no old log-prob pass)
    flops = 2 * n_params * T * fwd_passes + 6 * n_params * T * SAME_GRPO["num_ppo_epochs"]
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak, peak_source = _peak_of(name if cuda else "", peak_tflops)
    return {"impl": "trl", "trl_version": __import__("trl").__version__, "algo": "grpo", "device": name, "n_params": n_params,
            "dtype": "bf16" if cfg.bf16 else "fp32", "episodes_per_step": B, "prompt_tokens": P, "response_tokens": R,
            "step_s": step_s, "tokens_per_s": T / step_s, "tflops": flops / step_s / 1e12,
            "mfu": flops / step_s / (peak * 1e12) if peak else None, "peak_source": peak_source, **peak_memory()}


# The GPU run: 16 prompts x 8 completions (GRPO) or 64 prompts (PPO, with a critic and a reference: three 0.5B models),
# 128 new tokens, bf16. The dry run: the same code at DRY_SHAPE, a few rows, 8 new tokens.
GPU_RUNS = {"grpo": dict(prompts_per_step=16, num_generations=8), "ppo": dict(prompts_per_step=64)}
# The 0.5B point of the CPU cost curve (`--cpu`): the real shape, short sequences, a small group, one timed update.
CPU_RUNS = {"grpo": dict(steps=1, prompts_per_step=2, num_generations=4, max_completion_length=8),
            "ppo": dict(steps=1, prompts_per_step=4, max_completion_length=8)}
DRY_RUNS = {"grpo": dict(shape=DRY_SHAPE, steps=2, prompts_per_step=2, num_generations=4, max_completion_length=8, bf16=True),
            "ppo": dict(shape=DRY_SHAPE, steps=1, prompts_per_step=4, max_completion_length=8)}
COLUMNS = ["impl", "algo", "device", "n_params", "step_s", "rollout_s", "update_s", "gen_tokens_per_s", "tokens_per_s", "tflops",
           "mfu", "peak_gpu_gb"]


def _fmt(v):
    if isinstance(v, float): return f"{v:.4g}"
    return "-" if v is None else str(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=["grpo", "ppo", "both"], default="both", help="which trainer to time")
    ap.add_argument("--dry_run", action="store_true", help="the tiny shape on the CPU: checks the code, not the speed")
    ap.add_argument("--cpu", action="store_true", help="the 0.5B shape on the CPU with short sequences (CPU_RUNS): one timed "
                                                       "update, its time, peak memory and the fraction of the measured matmul peak")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="--cpu: fp32 (default) or bf16 autocast")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step (GPU run)")
    ap.add_argument("--max_completion_length", type=int, default=128, help="new tokens per completion (GPU run)")
    ap.add_argument("--peak_tflops", type=float, default=None, help="override the assumed peak bf16 TFLOP/s (for MFU)")
    ap.add_argument("--impl", choices=["rlhf-nb", "trl", "both"], default="rlhf-nb",
                    help="trl / both: also time TRL's GRPOTrainer on the same work (GRPO only; both sides run SAME_GRPO)")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)
    import torch
    if a.cpu:
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
        import flops
        torch.set_num_threads(min(torch.get_num_threads(), 2) if a.peak_tflops is None else torch.get_num_threads())
        prec = a.precision or "fp32"
        peak = a.peak_tflops or flops.measure_matmul_peak("bfloat16" if prec == "bf16" else "float32", 2048) / 1e3
        results = []
        for algo in (["grpo", "ppo"] if a.algo == "both" else [a.algo]):
            r = rl_throughput(algo, peak_tflops=peak, bf16=prec == "bf16", **CPU_RUNS[algo])
            r.update(device=f"cpu ({torch.get_num_threads()} threads)", measured_peak_tflops=peak,
                     peak_source="given with --peak_tflops" if a.peak_tflops else "matmul 2048x2048 measured in this run")
            results.append(r)
        cols = ["algo", "dtype", "n_params", "step_s", "rollout_s", "logprobs_s", "update_s", "tokens_per_s", "tflops",
                "mfu", "peak_rss_gb"]
        print("  ".join(cols))
        for r in results: print("  ".join(_fmt(r.get(c)) for c in cols))
        if a.out:
            with open(a.out, "w") as f: json.dump(results, f, indent=1)
        return 0
    if not a.dry_run and not torch.cuda.is_available():
        print("bench/throughput.py: no CUDA device here, nothing measured (--dry_run checks the code on the CPU)")
        return 0
    results = []
    for algo in (["grpo", "ppo"] if a.algo == "both" else [a.algo]):
        kw = DRY_RUNS[algo] if a.dry_run else dict(GPU_RUNS[algo], steps=a.steps, max_completion_length=a.max_completion_length)
        same = SAME_GRPO if algo == "grpo" and a.impl != "rlhf-nb" else {}
        if a.impl in ("rlhf-nb", "both"): results.append(rl_throughput(algo, peak_tflops=a.peak_tflops, **kw, **same))
        if a.impl in ("trl", "both") and algo == "grpo":
            results.append(trl_throughput(peak_tflops=a.peak_tflops, **{k: v for k, v in kw.items()}))
    print("  ".join(COLUMNS))
    for r in results: print("  ".join(_fmt(r.get(c)) for c in COLUMNS))
    if a.out:
        with open(a.out, "w") as f: json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

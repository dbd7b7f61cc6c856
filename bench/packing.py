"""GRPO's training side (old/reference log-probs + the update) on a batch with long-tailed response lengths: padded rows
against padding-free rows (`padding_free`) against padding-free rows in token-budget micro-batches (`use_dynamic_bsz`).

The batch is an arithmetic prompt set (the built-in task, left-padded) whose responses have lognormal lengths (median
`--median_len`, sigma `--sigma`, cut at `--max_len`), so most rows are short and a few run to the cut: the shape of
RL batches whose padding `perf/padding_fraction` measures. The responses are fixed tokens ending in eos and the scores
are seeded random numbers, so every arm trains on the same batch and only the forward layout differs; sampling is left
out because packing does not change it. Each arm runs in a fresh process (peak RSS is the arm's own), builds the trainer
the CLI builds (`rl_trainer_class`), and times `--steps` steps after one warm-up step. The arms' first-step metrics are
compared too (pg_loss, grad_norm, entropy): packing changes no number beyond float rounding.

Small by default (the demo model, a shared CPU); the 33.6M shape in float32, as the full measurement:
    python bench/packing.py --shape 33.6M --prompts 16 --generations 8 --max_len 256 --median_len 24 --budget 4096 --steps 5 --threads 8
Writes bench/results_packing.{json,md}."""
from __future__ import annotations
import argparse, json, math, subprocess, sys, time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent)); sys.path.insert(0, str(BENCH))
from common import SIZES, peak_rss_mb, vm_hwm_mb                      # noqa: E402

TAG = "@@PACKING "
ARMS = {"padded": {}, "packed": {"padding_free": True},
        "packed+budget": {"padding_free": True, "use_dynamic_bsz": True}}
COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss")


def long_tailed_batch(trainer, args):
    "The trainer's next prompts with fixed responses of lognormal lengths (eos last) and seeded scores -> data."
    import torch
    from rlhf_nb.workers import rollout_batch
    g = torch.Generator().manual_seed(args.seed)
    batch, tok = trainer.next_batch(), trainer.tokenizer
    B, R = batch["input_ids"].shape[0], args.max_len
    lengths = (args.median_len * torch.exp(args.sigma * torch.randn(B, generator=g))).round().clamp(1, R).long()
    resp = torch.randint(6, len(tok), (B, R), generator=g)
    resp[torch.arange(B), lengths - 1] = tok.eos_token_id
    resp = torch.where(torch.arange(R)[None] < lengths[:, None], resp, tok.pad_token_id)
    resp[torch.arange(B), lengths - 1] = tok.eos_token_id                  # eos sits at each row's last token
    data = {**batch, **rollout_batch(batch["input_ids"], batch["attention_mask"], resp, tok.eos_token_id, tok.pad_token_id)}
    scores = torch.zeros(B, R)
    scores[torch.arange(B), lengths - 1] = torch.rand(B, generator=g)      # distinct scores: no group is filtered out
    data["token_level_scores"] = scores
    return data


def train_side_step(trainer, data):
    "One step without sampling: log-probs and values, advantages, update -> (seconds, metrics)."
    import torch
    d = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in data.items()}
    t0 = time.perf_counter()
    d = trainer.compute_log_probs_and_values(d)
    d = trainer.compute_advantages(d)
    upd = trainer.update(d)
    sec = time.perf_counter() - t0
    m = trainer.step_metrics(d, d["token_level_scores"].sum(-1), upd, {})
    return sec, m


def arm(name, args):
    "One arm in this process -> dict of its timings, padding fraction, peak RSS and first-step metrics."
    import torch
    from rlhf_nb.rl_config import GRPOConfig
    from rlhf_nb.algos import rl_trainer_class
    from rlhf_nb.models import load_tokenizer, tiny_causal_lm
    torch.set_num_threads(args.threads)
    tok = load_tokenizer("tiny", padding_side="left")
    opts = dict(ARMS[name])
    if opts.get("use_dynamic_bsz"): opts["ppo_max_token_len_per_gpu"] = args.budget
    cfg = GRPOConfig(output_dir=str(BENCH / "_work" / f"packing_{name}"), per_device_train_batch_size=args.prompts,
                     num_generations=args.generations, max_completion_length=args.max_len, arith_train_size=256,
                     eval_steps=0, save_final=False, seed=args.seed, parallel_roles="off", rollout_threads=1,
                     disable_tqdm=True, **opts)
    pol = tiny_causal_lm(tok, seed=args.seed, **SIZES[args.shape])
    trainer = rl_trainer_class(cfg)(cfg, policy=pol, tokenizer=tok, reward_manager=lambda d: (d["token_level_scores"], {}))
    trainer.init_workers()
    data = long_tailed_batch(trainer, args)
    first = train_side_step(trainer, data)[1]                              # warm-up step; its metrics are compared
    secs = [train_side_step(trainer, data)[0] for _ in range(args.steps)]
    return {"arm": name, "step_s": sorted(secs)[len(secs) // 2], "steps_s": secs, "peak_rss_mb": peak_rss_mb(),
            "vm_hwm_mb": vm_hwm_mb(), "padding_fraction": first["perf/padding_fraction"],
            "rows": int(data["responses"].shape[0]), "response_mean_len": float(data["response_mask"].sum(-1).float().mean()),
            "metrics": {k: first[k] for k in COMPARED if k in first}}


def run_arm(name, args):
    "Run `arm(name)` in a fresh interpreter -> its result dict."
    argv = [sys.executable, __file__, "--arm", name] + [f"--{k}={v}" for k, v in vars(args).items() if k not in ("arm", "out")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    line = next((l for l in r.stdout.splitlines() if l.startswith(TAG)), None)
    if line is None: raise RuntimeError(f"arm {name} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len(TAG):])


def report(rows, args):
    "The markdown table of the arms, with each one's step time and peak RSS against the padded arm's."
    base = rows[0]
    lines = [f"# Packing: GRPO's training side, padded vs packed vs packed + token budget ({args.shape}, float32)", "",
             f"{args.prompts} prompts x {args.generations} completions, responses lognormal (median {args.median_len}, "
             f"sigma {args.sigma}, cut at {args.max_len}); token budget {args.budget}; {args.threads} torch thread(s); "
             f"median of {args.steps} steps after one warm-up.", "",
             "| arm | padding fraction | step s | x padded | peak RSS MB | x padded | pg_loss | grad_norm |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["metrics"]
        lines.append(f"| {r['arm']} | {r['padding_fraction']:.3f} | {r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f} | "
                     f"{m.get('actor/pg_loss', float('nan')):.6g} | {m.get('actor/grad_norm', float('nan')):.6g} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="demo", choices=list(SIZES))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--median_len", type=float, default=8)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--budget", type=int, default=256, help="ppo_max_token_len_per_gpu of the token-budget arm")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(BENCH / "results_packing"))
    args = p.parse_args(argv)
    if args.arm: print(TAG + json.dumps(arm(args.arm, args), default=float), flush=True); return 0
    rows = [run_arm(n, args) for n in ARMS]
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("arm", "out")}, "arms": rows,
           "ratios": {r["arm"]: {"step": r["step_s"] / rows[0]["step_s"], "peak_rss": r["peak_rss_mb"] / rows[0]["peak_rss_mb"]}
                      for r in rows}}
    Path(args.out + ".json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    Path(args.out + ".md").write_text(report(rows, args))
    print(report(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

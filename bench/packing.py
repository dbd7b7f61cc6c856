"""GRPO's training side (old/reference log-probs + the update) on a batch with long-tailed response lengths: padded rows
against padding-free rows (`padding_free`) against padding-free rows in token-budget micro-batches (`use_dynamic_bsz`).

The batch is an arithmetic prompt set (the built-in task, left-padded) whose responses have lognormal lengths (median
`--median_len`, sigma `--sigma`, cut at `--max_len`), so most rows are short and a few run to the cut: the shape of
RL batches whose padding `perf/padding_fraction` measures. The responses are fixed tokens ending in eos and the scores
are seeded random numbers, so every arm trains on the same batch and only the forward layout differs; sampling is left
out because packing does not change it. Each arm runs in a fresh process (peak RSS is the arm's own), builds the trainer
the CLI builds (`rl_trainer_class`), and times `--steps` steps after one warm-up step. The arms' first-step metrics are
compared too (pg_loss, grad_norm, entropy): packing changes no number beyond float rounding.

Padded rows end at the batch's longest response, as `generate` leaves them. `--acc_seeds N` adds short GRPO runs on
arithmetic from the SFT start for each arm and seed (held-out accuracy curves; `--steps 0` runs only them).
Small by default (the demo model, a shared CPU); the 33.6M shape in float32, as the full measurement:
    python bench/packing.py --shape 33.6M --prompts 16 --generations 8 --max_len 256 --median_len 24 --budget 4096 --steps 5 --threads 8
Writes bench/results_packing.{json,md}."""
from __future__ import annotations
import argparse, json, math, os, subprocess, sys, time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent)); sys.path.insert(0, str(BENCH))
from common import SIZES, peak_rss_mb, vm_hwm_mb                      # noqa: E402
from throughput import QWEN25_05B_SHAPE                                 # noqa: E402

SHAPES = {**SIZES, "0.5B": {k: v for k, v in QWEN25_05B_SHAPE.items()            # tiny_config takes shape fields only
                            if k not in ("max_position_embeddings", "rope_theta")}}

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
    R = int(lengths.max())                                                 # generate stops at the longest row
    resp = torch.where(torch.arange(R)[None] < lengths[:, None], resp[:, :R], tok.pad_token_id)
    resp[torch.arange(B), lengths - 1] = tok.eos_token_id                  # eos sits at each row's last token
    data = {**batch, **rollout_batch(batch["input_ids"], batch["attention_mask"], resp, tok.eos_token_id, tok.pad_token_id)}
    scores = torch.zeros(B, R)
    scores[torch.arange(B), lengths - 1] = torch.rand(B, generator=g)      # distinct scores: no group is filtered out
    data["token_level_scores"] = scores
    return data


def train_side_step(trainer, data):
    "One step without sampling: log-probs and values, advantages, update -> ((wall s, CPU s), metrics)."
    import torch
    d = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in data.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    d = trainer.compute_log_probs_and_values(d)
    d = trainer.compute_advantages(d)
    upd = trainer.update(d)
    sec = (time.perf_counter() - t0, time.process_time() - c0)
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
                     disable_tqdm=True, bf16=args.bf16, **opts)
    pol = tiny_causal_lm(tok, seed=args.seed, **SHAPES[args.shape])
    trainer = rl_trainer_class(cfg)(cfg, policy=pol, tokenizer=tok, reward_manager=lambda d: (d["token_level_scores"], {}))
    trainer.init_workers()
    data = long_tailed_batch(trainer, args)
    first = train_side_step(trainer, data)[1]                              # warm-up step; its metrics are compared
    secs = [train_side_step(trainer, data)[0] for _ in range(args.steps)]
    wall, cpu = [w for w, _ in secs], [c for _, c in secs]
    return {"arm": name, "step_s": sorted(wall)[len(wall) // 2], "steps_s": wall, "step_cpu_s": sorted(cpu)[len(cpu) // 2],
            "steps_cpu_s": cpu, "load": os.getloadavg()[0], "peak_rss_mb": peak_rss_mb(),
            "vm_hwm_mb": vm_hwm_mb(), "padding_fraction": first["perf/padding_fraction"],
            "rows": int(data["responses"].shape[0]), "response_mean_len": float(data["response_mask"].sum(-1).float().mean()),
            "metrics": {k: first[k] for k in COMPARED if k in first}}


def run_arm(name, args):
    "Run `arm(name)` in a fresh interpreter -> its result dict."
    flags = [f"--{k}" if v is True else f"--{k}={v}" for k, v in vars(args).items()
             if k not in ("arm", "arms", "out") and v is not False and not k.startswith("acc")]
    argv = [sys.executable, __file__, "--arm", name] + flags
    r = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    line = next((l for l in r.stdout.splitlines() if l.startswith(TAG)), None)
    if line is None: raise RuntimeError(f"arm {name} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len(TAG):])


def accuracy_run(name, seed, args):
    """A short GRPO run on arithmetic from the SFT start with arm `name`'s options -> its held-out greedy accuracy
    curve, padding fraction and step seconds (the trainer's own metrics.jsonl)."""
    import statistics, torch
    from rlhf_nb.rl_config import GRPOConfig
    from rlhf_nb.algos import run_rl
    torch.set_num_threads(args.threads)
    opts = dict(ARMS[name])
    if opts.get("use_dynamic_bsz"): opts["ppo_max_token_len_per_gpu"] = args.acc_budget
    out = BENCH / "_work" / f"packing_acc_{name.replace('+', '_')}_{seed}"
    run_rl(GRPOConfig(model_name_or_path=args.acc_start, output_dir=str(out), max_steps=args.acc_steps,
                      eval_steps=args.acc_eval_every, eval_size=args.acc_eval_size, learning_rate=2e-4, kl_coef=0.0,
                      seed=seed, save_steps=0, save_final=False, overwrite_output_dir=True, disable_tqdm=True, **opts))
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    ev = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    steps = [r for r in rows if "time/step" in r]
    return {"arm": name, "seed": seed, "step": [s for s, _ in ev], "accuracy": [a for _, a in ev],
            "padding_fraction": statistics.mean(r.get("perf/padding_fraction", 0.0) for r in steps),
            "step_s": statistics.median(r["time/step"] for r in steps)}


def accuracy_report(runs, args):
    "Markdown: held-out accuracy at each evaluation, mean and spread over seeds, per arm."
    import statistics
    by = {n: [r for r in runs if r["arm"] == n] for n in ARMS}
    steps = by["padded"][0]["step"]
    lines = ["", f"## Held-out accuracy, {args.acc_seeds} seeds", "",
             f"GRPO on arithmetic from `{Path(args.acc_start).name}` (the tiny model's SFT start), default batch "
             f"(16 prompts x 8 completions), lr 2e-4, no KL, {args.acc_steps} steps, greedy accuracy on "
             f"{args.acc_eval_size} held-out prompts every {args.acc_eval_every} steps (the step-0 column is the start); "
             f"token budget {args.acc_budget}. Mean over seeds, [min, max] in brackets.", "",
             "| arm | " + " | ".join(f"step {s}" for s in steps) + " | padding fraction | median step s |",
             "|---|" + "---|" * (len(steps) + 2)]
    for n, rs in by.items():
        cols = [[r["accuracy"][i] for r in rs] for i in range(len(steps))]
        lines.append(f"| {n} | " + " | ".join(f"{statistics.mean(c):.3f} [{min(c):.2f}, {max(c):.2f}]" for c in cols)
                     + f" | {statistics.mean(r['padding_fraction'] for r in rs):.3f}"
                     f" | {statistics.median(r['step_s'] for r in rs):.2f} |")
    same = all(r["accuracy"] == by["padded"][i % args.acc_seeds]["accuracy"] for i, r in enumerate(runs) if r["arm"] != "padded")
    lines += ["", "Every seed's curve is identical across the three arms." if same else
              "The arms' curves differ only where float rounding changes a sampled token; compare the spreads.", ""]
    return "\n".join(lines)


def report(rows, args):
    "The markdown table of the arms, with each one's step time and peak RSS against the padded arm's."
    base = rows[0]
    dtype = "bfloat16 autocast" if args.bf16 else "float32"
    lines = [f"# Packing: GRPO's training side, padded vs packed vs packed + token budget ({args.shape}, {dtype})", "",
             f"{args.prompts} prompts x {args.generations} completions, responses lognormal (median {args.median_len}, "
             f"sigma {args.sigma}, cut at {args.max_len}); token budget {args.budget}; {args.threads} torch thread(s); "
             f"median of {args.steps} steps after one warm-up.", "",
             "CPU s: the process's CPU seconds per step, summed over its threads (far less disturbed than wall seconds "
             "when other work shares the cores); load: the 1-minute load average at the arm's end.", "",
             "| arm | padding fraction | step s | x padded | CPU s | x padded | peak RSS MB | x padded | pg_loss | grad_norm "
             "| load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["metrics"]
        cpu = (f"{r['step_cpu_s']:.3f} | {r['step_cpu_s'] / base['step_cpu_s']:.2f}" if "step_cpu_s" in r else "- | -")
        lines.append(f"| {r['arm']} | {r['padding_fraction']:.3f} | {r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f} | "
                     f"{cpu} | "
                     f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f} | "
                     f"{m.get('actor/pg_loss', float('nan')):.6g} | {m.get('actor/grad_norm', float('nan')):.6g} | "
                     f"{r.get('load', float('nan')):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="demo", choices=list(SHAPES))
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (the trainer's bf16 option)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--median_len", type=float, default=8)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--budget", type=int, default=256, help="ppo_max_token_len_per_gpu of the token-budget arm")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="arms to time (padded first)")
    p.add_argument("--acc_seeds", type=int, default=0, help="seeds of the held-out accuracy runs (0: none; --steps 0: only them)")
    p.add_argument("--acc_steps", type=int, default=20, help="GRPO steps of each accuracy run")
    p.add_argument("--acc_eval_every", type=int, default=5)
    p.add_argument("--acc_eval_size", type=int, default=200)
    p.add_argument("--acc_budget", type=int, default=1024, help="ppo_max_token_len_per_gpu of the accuracy runs' budget arm")
    p.add_argument("--acc_start", default=str(BENCH / "_work" / "passk" / "sft_start"), help="SFT start of the accuracy runs")
    p.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(BENCH / "results_packing"))
    args = p.parse_args(argv)
    if args.arm: print(TAG + json.dumps(arm(args.arm, args), default=float), flush=True); return 0
    rows = [run_arm(n, args) for n in args.arms] if args.steps else []
    runs = [accuracy_run(n, s, args) for n in ARMS for s in range(args.acc_seeds)]
    cmd = "python bench/packing.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if not rows:                                                            # accuracy only: keep the timing tables
        old = json.loads(Path(args.out + ".json").read_text())
        old.update(accuracy=runs, accuracy_command=cmd)
        Path(args.out + ".json").write_text(json.dumps(old, indent=1, default=float) + "\n")
        md = Path(args.out + ".md").read_text().split("\n## Held-out accuracy")[0].rstrip("\n") + "\n"
        Path(args.out + ".md").write_text(md + accuracy_report(runs, args) + f"\nCommand: `{cmd}`\n")
        print(accuracy_report(runs, args)); return 0
    acc_md, old = "", Path(args.out + ".json")
    if not runs and old.is_file() and json.loads(old.read_text()).get("accuracy"):   # timing only: keep the accuracy runs
        o = json.loads(old.read_text())
        runs, acc_cmd = o["accuracy"], o.get("accuracy_command", o.get("command"))
        acc_md = Path(args.out + ".md").read_text().split("\n## Held-out accuracy")[1].split("\nCommand:")[0]
        acc_md = "\n## Held-out accuracy" + acc_md.rstrip("\n") + f"\n\nCommand: `{acc_cmd}`\n"
    elif runs: acc_md, acc_cmd = accuracy_report(runs, args), cmd
    out = {"args": {k: v for k, v in vars(args).items() if k not in ("arm", "out")}, "command": cmd, "arms": rows,
           "accuracy": runs, "accuracy_command": acc_cmd if runs else None,
           "ratios": {r["arm"]: {"step": r["step_s"] / rows[0]["step_s"], "peak_rss": r["peak_rss_mb"] / rows[0]["peak_rss_mb"]}
                      for r in rows}}
    Path(args.out + ".json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    md = report(rows, args) + f"\nCommand: `{cmd}`\n" + acc_md
    Path(args.out + ".md").write_text(md)
    print(report(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

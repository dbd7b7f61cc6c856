"""Seconds per GRPO step: rlhf-nb (padded, packed, packed + token budget) against TRL's `GRPOTrainer`, in one run.

Every arm starts from the same checkpoint (the demo's SFT warm start on arithmetic, or a fresh model of `--shape`),
answers the same training prompts with the same batch (`--prompts` x `--generations` completions of at most
`--max_new_tokens` tokens, temperature 1), scores them with the same rule reward and makes one update per batch
(lr 2e-4, no KL, fp32: `bf16=False` on TRL's side). Each arm runs in a fresh process through `bench/arms.py`
(`nb_grpo`, `trl_grpo`), `--warmup` steps first, then the median of `--steps` steps, wall and CPU seconds.

What differs in the work: rlhf-nb computes the old policy's log-probs before its update (a forward TRL skips when
it updates once per batch) and scores with its own reward manager; both average the loss over the batch's tokens
(TRL's `dapo`, rlhf-nb's `token-mean`) and sample with Hugging Face `generate` and a KV cache. Groups whose rewards
are all equal are kept on both sides (no filtering), so both train every row.

Small and full are the same command (the tiny model is cheap):
    python bench/trl_grpo.py
Writes bench/results_trl_grpo.{json,md}."""
from __future__ import annotations
import argparse, dataclasses, json, os, shlex, statistics, subprocess, sys, time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent)); sys.path.insert(0, str(BENCH))
TAG = "@@TRL_GRPO "
ARMS = {"rlhf-nb padded": ("nb_grpo", {}), "rlhf-nb packed": ("nb_grpo", {"padding_free": True}),
        "rlhf-nb packed+budget": ("nb_grpo", {"padding_free": True, "use_dynamic_bsz": True}), "trl": ("trl_grpo", {})}


def run_in_process(name, p):
    "One arm in this process, through bench/arms.py, with the packing options of `name` on rlhf-nb's config."
    import arms as A
    kind, opts = ARMS[name]
    opts = {**opts, **({"ppo_max_token_len_per_gpu": p["budget"]} if opts.get("use_dynamic_bsz") else {})}
    base, seen = A._grpo_config, {}
    A._grpo_config = lambda q, *a, **k: (lambda c, s: (dataclasses.replace(c, **opts), s))(*base(q, *a, **k))
    phases = A._phase_medians
    A._phase_medians = lambda hist, w: (seen.setdefault("hist", hist), phases(hist, w))[1]
    res = A.ARMS[kind](p)
    hist = [h for h in seen.get("hist", []) if h.get("step", 0) > p["warmup_rounds"]]
    pad = [h["perf/padding_fraction"] for h in hist if "perf/padding_fraction" in h]
    res.update(padding_fraction=statistics.median(pad) if pad else None, options=opts)
    return res


def run_arm(name, a):
    "Run `name` in a fresh interpreter -> its result dict (with the process's peak RSS)."
    p = params(a)
    r = subprocess.run([sys.executable, __file__, "--arm", name, "--params", json.dumps(p)], capture_output=True,
                       text=True, timeout=3600)
    line = next((l for l in r.stdout.splitlines() if l.startswith(TAG)), None)
    if line is None: raise RuntimeError(f"arm {name} failed:\n{r.stderr[-3000:]}")
    return json.loads(line[len(TAG):])


def params(a):
    "The arms' shared settings (bench/arms.py's parameter names)."
    import common as C
    init = None if a.init == "none" else a.init
    return dict(prompts=a.prompts, generations=a.generations, updates_per_generation=1, max_new_tokens=a.max_new_tokens,
                lr=2e-4, beta=0.0, threads=a.threads, seed=a.seed, init_path=init, shape=C.SIZES[a.shape] or None,
                warmup_rounds=a.warmup, rounds=a.steps, n_train=2000, budget=a.budget, loss_type="dapo")


def report(rows, a, cmd):
    "Markdown: each arm's seconds per step against TRL's."
    trl = next(r for r in rows if r["arm"] == "trl")
    lines = [f"# GRPO step: rlhf-nb against TRL {trl.get('trl_version', '')} GRPOTrainer", "",
             f"Start: {a.init if a.init != 'none' else 'a fresh ' + a.shape + ' model'}; {a.prompts} prompts x "
             f"{a.generations} completions of at most {a.max_new_tokens} tokens, temperature 1, one update per batch, "
             f"lr 2e-4, no KL, fp32; {a.threads} torch thread(s); median of {a.steps} steps after {a.warmup} warm-up "
             f"step(s); load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end. Lower is better.", "",
             "| arm | padding fraction | step s | x TRL | CPU s | x TRL (CPU) | completion tokens/step | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pf = "-" if r.get("padding_fraction") is None else f"{r['padding_fraction']:.3f}"
        lines.append(f"| {r['arm']} | {pf} | {r['round_s']:.3f} | {r['round_s'] / trl['round_s']:.2f} | "
                     f"{r['round_cpu_s']:.3f} | {r['round_cpu_s'] / trl['round_cpu_s']:.2f} | "
                     f"{r.get('tokens_per_round') or 0:.0f} | {r['peak_rss_mb']:.0f} |")
    lines += ["", f"Command: `{cmd}`", "", __doc__.split("\n\n")[2].replace("\n", " "), ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", default=str(BENCH / "_work" / "passk" / "sft_start"),
                    help="checkpoint every arm starts from ('none': a fresh model of --shape)")
    ap.add_argument("--shape", default="demo", choices=["demo", "6.3M", "33.6M"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=32)
    ap.add_argument("--budget", type=int, default=2048, help="ppo_max_token_len_per_gpu of the token-budget arm")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--params", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(BENCH / "results_trl_grpo"))
    a = ap.parse_args(argv)
    if a.arm:
        import common as C, trl
        res = run_in_process(a.arm, json.loads(a.params))
        res.update(arm=a.arm, peak_rss_mb=C.peak_rss_mb(), trl_version=trl.__version__)
        print(TAG + json.dumps(res, default=float), flush=True); return 0
    cmd = "python bench/trl_grpo.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    rows = [run_arm(n, a) for n in ARMS]
    trl = rows[-1]
    out = {"args": vars(a), "command": cmd, "date": time.strftime("%Y-%m-%d %H:%M"), "arms": rows,
           "ratio_vs_trl": {r["arm"]: {"wall": r["round_s"] / trl["round_s"], "cpu": r["round_cpu_s"] / trl["round_cpu_s"]}
                            for r in rows}}
    Path(a.out + ".json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    Path(a.out + ".md").write_text(report(rows, a, cmd))
    print(report(rows, a, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The staleness lab: what training on stale samples costs, objective by objective, on the arithmetic task.

    python bench/staleness_lab.py                        # s in {0,1,2,4} x 4 objectives, 40 steps, seed 0 (16 arms)
    python bench/staleness_lab.py --staleness 0,1        # part of the grid (merged into the json of the same settings)
    python bench/staleness_lab.py --seeds 0,1 --lr 2e-4
    python bench/staleness_lab.py --quick                # smoke test: s in {0,1}, 2 objectives, 4 steps -> bench/_work/staleness_quick.*
    python bench/staleness_lab.py --plot_only            # redraw the figure and rewrite the table from the json

Every arm is GRPO (`GRPOConfig` defaults: 16 prompts x 8 completions x 16 new tokens, one optimiser step per batch)
from the cached SFT start (`bench/_work/sft_arith`, as `bench/rollout_engines.py --curve` uses), placement colocate,
the hf engine, the trainer class `rlhf_nb.algos.rl_trainer_class` picks, `torch.set_num_threads(2)`, in a fresh
process (`--arm JSON`). With `max_staleness` s the batch of step j is sampled with weight version max(0, j-1-s)
(a sampler thread beside the trainer); s = 0 is the synchronous trainer. The objectives:

    none            decoupled, importance_sampling_mode none: stale samples trained on as if fresh
    bypass          bypass: the vanilla clipped loss with its ratio taken against the sampler's log-probs
    decoupled_cap2  decoupled, token_truncate at cap 2: each token weighted by min(pi_prox / pi_behav, 2)
    unclipped_is    bypass with policy_loss importance_sampling: -A pi_theta / pi_behav, nothing clipped

Every arm passes importance_sampling_cap 2, so `sampling/truncated_frac` (the share of tokens whose ratio
pi_prox / pi_behav exceeds 2) is logged wherever the trainer logs the sampler gap: every s >= 1 arm, and at s = 0 the
arm with a correction (decoupled_cap2). At s = 0 the four objectives are the same update up to float rounding (one
optimiser step per batch: the ratio to the proximal policy is 1, and the sampler's log-probs equal the trainer's), so
their spread at s = 0 is the drift that rounding alone causes in one seed. Held-out greedy accuracy on 256 prompts at
step 0 and every `--eval_steps`. Results: bench/results_staleness.json, .md and .png.

The learning rate (`--lr`, default 3e-4: GRPOConfig's own) sets how far the policy moves in one step, so how far a
batch s versions old is from the weights that train on it (KL(pi_prox || pi_behav) grows about as (s * lr)^2). At the
demo's 2e-4 an s = 4 run keeps that KL at a few hundredths per token with under 1% of tokens above the cap; at 5e-4
the synchronous run from this start is already erratic, and at 1e-3 it collapses, so staleness could not be told from
a rate that is too high. 3e-4 keeps the synchronous run learning and lets s = 4 move the sampler a long way off.
One arm of 40 steps takes 1.5-2.5 minutes on the shared 2-core machine: about half an hour for the 16 arms.
"""
from __future__ import annotations
import argparse, json, math, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CAP = 2.0
OBJECTIVES = {
    "none": dict(off_policy_objective="decoupled", importance_sampling_mode="none", policy_loss="vanilla"),
    "bypass": dict(off_policy_objective="bypass", importance_sampling_mode="none", policy_loss="vanilla"),
    "decoupled_cap2": dict(off_policy_objective="decoupled", importance_sampling_mode="token_truncate", policy_loss="vanilla"),
    "unclipped_is": dict(off_policy_objective="bypass", importance_sampling_mode="none", policy_loss="importance_sampling"),
}
STALENESS = (0, 1, 2, 4)
SUMMARY_COLS = ("max_staleness", "objective", "seeds", "acc_start", "acc_final", "kl_mean", "trunc_mean", "entropy_final", "score_last10", "step_s")
SERIES = ("eval/accuracy", "sampling/kl_prox_behav", "sampling/truncated_frac", "actor/entropy", "score/mean", "staleness/max", "time/step")
QUICK = dict(staleness="0,1", objectives="bypass,decoupled_cap2", steps=4, out=str(HERE / "_work/staleness_quick.json"))


def series(hist):
    "Trainer history -> {'step': [...], key: [value or None, ...]} for the keys of SERIES (a key a row lacks is None)."
    rows = {}
    for h in hist: rows.setdefault(h["step"], {}).update(h)               # step 0: the evaluation before training
    steps = sorted(rows)
    return {"step": steps, **{k: [rows[n].get(k) for n in steps] for k in SERIES}}


def arm(staleness, objective, steps, eval_steps, seed, lr, sft_dir, eval_size=256):
    "One GRPO run from the SFT start with `max_staleness` = `staleness` and the objective's options -> its per-step series."
    import torch
    from rlhf_nb.algos import GRPOConfig, rl_trainer_class
    torch.set_num_threads(2)
    cfg = GRPOConfig(model_name_or_path=sft_dir, max_steps=steps, eval_steps=eval_steps, eval_size=eval_size, seed=seed, learning_rate=lr,
                     max_staleness=staleness, importance_sampling_cap=CAP, placement="colocate", rollout_engine="hf", **OBJECTIVES[objective],
                     output_dir=tempfile.mkdtemp(prefix=f"bench_stale_{staleness}_{objective}_"), disable_tqdm=True, save_final=False,
                     report_to="none")
    t0 = time.time()
    hist = rl_trainer_class(cfg)(cfg).fit()
    return {"max_staleness": staleness, "objective": objective, "seed": seed, "seconds": time.time() - t0, "series": series(hist)}


def run_arm(**kw):
    "One arm in a fresh process -> its result."
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
    r = subprocess.run([sys.executable, __file__, "--arm", json.dumps(kw)], capture_output=True, text=True, env=env, timeout=3600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("ARM ")]
    if r.returncode or not lines: raise RuntimeError(f"arm {kw} failed:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][4:])


def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.mean(xs) if xs else None


def summarise_arm(a):
    "The summary of one arm: held-out accuracy at the start and the end, mean KL(prox || behav) and truncated fraction, final entropy."
    s = a["series"]
    evals = [(n, x) for n, x in zip(s["step"], s["eval/accuracy"]) if x is not None]
    trained = [i for i, n in enumerate(s["step"]) if n > 0]
    at = lambda k: [s[k][i] for i in trained]
    last = trained[-min(10, len(trained)):]
    return {"acc_start": evals[0][1] if evals else None, "acc_final": evals[-1][1] if evals else None,
            "kl_mean": _mean(at("sampling/kl_prox_behav")), "trunc_mean": _mean(at("sampling/truncated_frac")),
            "entropy_final": s["actor/entropy"][trained[-1]] if trained else None,
            "score_last10": _mean([s["score/mean"][i] for i in last]), "staleness_max": max((x or 0) for x in at("staleness/max")),
            "step_s": statistics.median(x for x in at("time/step") if x is not None)}


def summarise(arms):
    "Per (s, objective): the mean over seeds of each arm summary, with the seeds it covers."
    cells = {}
    for a in arms: cells.setdefault((a["max_staleness"], a["objective"]), []).append(a)
    out = []
    for (st, obj), group in sorted(cells.items(), key=lambda kv: (kv[0][0], list(OBJECTIVES).index(kv[0][1]))):
        per = [summarise_arm(a) for a in group]
        out.append({"max_staleness": st, "objective": obj, "seeds": ",".join(str(a["seed"]) for a in group),
                    **{k: _mean([p[k] for p in per]) for k in per[0]}})
    return out


def mean_series(group, key):
    "(steps, mean over the arms of `group` of `key` at each step; None where no arm has it) of arms with the same steps."
    steps = group[0]["series"]["step"]
    vals = [_mean([a["series"][key][i] for a in group if i < len(a["series"][key])]) for i in range(len(steps))]
    return steps, vals


def running_mean(pts, window):
    "[(step, value)] -> the trailing mean of the last `window` values at each step (per-step metrics are noisy)."
    return [(n, statistics.mean(v for _, v in pts[max(0, i - window + 1):i + 1])) for i, (n, _) in enumerate(pts)]


def plot_lab(res, path=None, window=5, title=None):
    "The lab's 2x2 figure: accuracy, KL(prox || behav), truncated fraction and entropy against the step; colour = objective, line = s."
    import matplotlib
    if path is not None: matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    colours = dict(zip(OBJECTIVES, ("tab:gray", "tab:blue", "tab:green", "tab:red")))
    styles = {0: (":", 1.3), 1: ("-", 1.6), 2: ("--", 1.6), 4: ("-.", 1.6)}
    smooth = f" ({window}-step running mean)" if window > 1 else ""
    panels = (("eval/accuracy", "held-out greedy accuracy", 1), ("sampling/kl_prox_behav", "KL(π_prox ‖ π_behav) per token" + smooth, window),
              ("sampling/truncated_frac", f"share of tokens with π_prox / π_behav > {CAP:g}" + smooth, window),
              ("actor/entropy", "policy entropy" + smooth, window))
    fig, axs = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    groups = {}
    for a in res["arms"]: groups.setdefault((a["max_staleness"], a["objective"]), []).append(a)
    for ax, (key, panel_title, w) in zip(axs.flat, panels):
        for (st, obj), group in sorted(groups.items()):
            steps, vals = mean_series(group, key)
            pts = [(n, v) for n, v in zip(steps, vals) if v is not None]
            if key == "sampling/kl_prox_behav": pts = [(n, max(v, 1e-5)) for n, v in pts]   # rounding (s = 0, step 1) drawn at the floor
            if not pts: continue
            ls, lw = styles.get(st, ("-", 1.0))
            ax.plot(*zip(*running_mean(pts, w)), ls=ls, lw=lw, color=colours.get(obj, "k"), marker="o" if w == 1 else None, ms=4, alpha=0.9)
        ax.set_title(panel_title, fontsize=10.5); ax.grid(alpha=0.3)
        if key == "sampling/kl_prox_behav": ax.set_yscale("log"); ax.set_ylim(bottom=1e-5)
    for ax in axs[1]: ax.set_xlabel("step")
    obj_h = [Line2D([], [], color=c, lw=2, label=o) for o, c in colours.items() if any(k[1] == o for k in groups)]
    st_h = [Line2D([], [], color="k", ls=styles.get(s, ("-", 1))[0], lw=styles.get(s, ("-", 1))[1], label=f"s = {s}" + (" (synchronous)" if s == 0 else ""))
            for s in sorted({k[0] for k in groups})]
    axs[0, 0].legend(handles=obj_h, title="objective", fontsize=9, loc="best")
    axs[0, 1].legend(handles=st_h, title="max_staleness", fontsize=9, loc="best")
    st, seeds = res.get("settings", {}), res.get("settings", {}).get("seeds", "")
    fig.suptitle(title or f"GRPO on arithmetic from the SFT start: learning rate {st.get('lr')}, {st.get('steps')} steps, "
                 + (f"mean over seeds {seeds}" if "," in str(seeds) else f"seed {seeds}"), fontsize=12)
    fig.tight_layout()
    if path is not None: fig.savefig(path, dpi=110); plt.close(fig)
    return fig


def table(rows, cols):
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    fmt = lambda v: "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
    return "\n".join(out + ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows])


def report(res, out_path):
    "The .md (summary table with the run's date, load and command) and the .png next to the json."
    st, m = res["settings"], res["machine"]
    md = [f"# The staleness lab: GRPO on arithmetic with stale samples ({m['date']}, {m['cpus']} CPUs)", "",
          f"Command: `{m['command']}`. Load average before / after: {m['load_before']:.2f} / {m['load_after']:.2f}; "
          f"{m['wall_s'] / 60:.1f} min for the arms of the last invocation. torch {m['torch']}, 2 threads per arm, one fresh process per arm.", "",
          f"Each arm: GRPO from the SFT start (`bench/_work/sft_arith`), learning rate {st['lr']}, {st['steps']} steps of "
          "16 prompts x 8 completions x 16 new tokens (GRPOConfig defaults otherwise: one optimiser step per batch, kl_coef 0.01), "
          f"placement colocate, hf engine, importance_sampling_cap {CAP:g}; held-out greedy accuracy on {st['eval_size']} prompts at "
          f"step 0 and every {st['eval_steps']} steps. Objectives: none = decoupled without weights; bypass = clipped ratio against the "
          "sampler; decoupled_cap2 = decoupled with token_truncate at 2; unclipped_is = bypass with policy_loss importance_sampling.", "",
          "Columns: accuracy at step 0 and at the last step; kl_mean and trunc_mean = mean over steps of sampling/kl_prox_behav and "
          "sampling/truncated_frac (— where the trainer does not log them: a synchronous run without a correction); entropy at the last "
          "step; score/mean over the last 10 steps; median seconds per step. Means over the seeds listed.", "",
          table(res["summary"], SUMMARY_COLS), ""]
    if res.get("failed"):
        md += ["## Arms that failed", ""] + [f"- {f['arm']}: {f['error'].strip().splitlines()[-1] if f['error'].strip() else '?'}" for f in res["failed"]] + [""]
    md += [f"Figure: `{out_path.with_suffix('.png').name}` (colour: objective, line style: max_staleness; KL, truncated fraction and "
           "entropy as a 5-step running mean, KL values under 1e-5, float rounding, drawn at 1e-5).", ""]
    out_path.with_suffix(".md").write_text("\n".join(md))
    plot_lab(res, out_path.with_suffix(".png"))
    print("\n".join(md))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", help="run one arm (JSON of arm()'s arguments) and print its result")
    ap.add_argument("--lr", type=float, default=3e-4, help="learning rate of every arm (default: GRPOConfig's)")
    ap.add_argument("--steps", type=int, default=40); ap.add_argument("--eval_steps", type=int, default=10)
    ap.add_argument("--eval_size", type=int, default=256); ap.add_argument("--seeds", default="0")
    ap.add_argument("--staleness", default=",".join(map(str, STALENESS))); ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--out", default=str(HERE / "results_staleness.json"))
    ap.add_argument("--quick", action="store_true", help="smoke test: " + ", ".join(f"{k} {v}" for k, v in QUICK.items()))
    ap.add_argument("--plot_only", action="store_true", help="redraw the .png and rewrite the .md from the json")
    a = ap.parse_args()
    if a.arm: print("ARM " + json.dumps(arm(**json.loads(a.arm))), flush=True); return
    if a.quick:
        for k, v in QUICK.items(): setattr(a, k, v)
    out_path = Path(a.out)
    if a.plot_only: return report(json.loads(out_path.read_text()), out_path)
    import torch
    from rlhf_nb.sft import sft_warm_start
    settings = {"lr": a.lr, "steps": a.steps, "eval_steps": a.eval_steps, "eval_size": a.eval_size}
    old = json.loads(out_path.read_text()) if out_path.exists() else {}
    keep = old.get("arms", []) if {k: old.get("settings", {}).get(k) for k in settings} == settings else []
    sft = str(sft_warm_start(str(HERE / "_work/sft_arith"), seed=0, progress=False))
    load0, t0 = os.getloadavg()[0], time.time()
    cells = [(int(s), o, int(seed)) for seed in a.seeds.split(",") for s in a.staleness.split(",") for o in a.objectives.split(",")]
    arms, failed = [x for x in keep if (x["max_staleness"], x["objective"], x["seed"]) not in set(cells)], []
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for s, o, seed in cells:
        spec = dict(staleness=s, objective=o, steps=a.steps, eval_steps=a.eval_steps, seed=seed, lr=a.lr, sft_dir=sft, eval_size=a.eval_size)
        try: arms.append(run_arm(**spec))
        except (RuntimeError, subprocess.TimeoutExpired) as e: failed.append({"arm": {k: spec[k] for k in ("staleness", "objective", "seed")}, "error": str(e)[-3000:]}); print(e, flush=True)
        else: print(f"s={s} {o} seed {seed}: {json.dumps(summarise_arm(arms[-1]))}", flush=True)
        res = {"settings": {**settings, "seeds": ",".join(sorted({str(x["seed"]) for x in arms}))}, "arms": arms, "failed": failed,
               "summary": summarise(arms) if arms else [],
               "machine": {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "torch": torch.__version__, "load_before": load0,
                           "load_after": os.getloadavg()[0], "wall_s": time.time() - t0, "command": " ".join(["python"] + sys.argv)}}
        out_path.write_text(json.dumps(res, indent=1))                       # after every arm: a stopped run keeps what it did
    report(res, out_path)


if __name__ == "__main__": main()

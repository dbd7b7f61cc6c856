"""pass@k and maj@k on the arithmetic task for a list of named checkpoints: the SFT warm start, the same model after a
short GRPO run, and any checkpoint added with --checkpoint NAME=DIR (e.g. after on-policy distillation).

Each checkpoint answers the same held-out prompts n_samples times at the same temperature and seed
(rlhf_nb.evaluate.run_eval, the code of `rlhf-nb eval --n_samples N --temperature T`); the table holds pass@1, pass@k
and maj@k with 95% intervals across prompts (normal approximation), the figure pass@k against k.

The SFT start is the demo's warm start (the tiny model SFT-trained on arithmetic to 30% held-out greedy accuracy),
built once into bench/_work/passk/sft_start with a step limit instead of a time limit, so that a loaded machine gives
the same checkpoint as an idle one (first build: a few minutes); the GRPO run is likewise cut by steps.
Small default (after the first build, about 2 minutes on 2 shared cores: 40 GRPO steps, 100 prompts x 16 samples):
    python bench/passk.py
Full size (500 held-out prompts, 64 samples, 200 GRPO steps):
    python bench/passk.py --eval_size 500 --n_samples 64 --grpo_steps 200 --fresh
Adding a checkpoint (the GRPO run and the other checkpoints' eval files are reused when already there):
    python bench/passk.py --checkpoint opd=runs/distill/model --describe "opd=sft after 40 distillation steps"
Writes bench/results_passk.json, bench/results_passk.md and bench/results_passk.png; eval files in bench/_work/passk/.
"""
from __future__ import annotations
import argparse, json, os, shlex, shutil, sys, time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
WORK = BENCH / "_work" / "passk"


def grpo_checkpoint(sft_dir, out, steps, seed):
    "The final policy of a GRPO run from `sft_dir` (the demo's tiny preset: lr 2e-4, no KL), reused when already there."
    from rlhf_nb import launch
    summary = out / "summary.json"
    if not summary.is_file():
        rc = launch.main(["grpo", "--model_name_or_path", str(sft_dir), "--output_dir", str(out), "--max_steps", str(steps),
                          "--learning_rate", "2e-4", "--kl_coef", "0", "--eval_steps", "0",
                          "--seed", str(seed), "--disable_tqdm", "true", "--overwrite_output_dir", "true"])
        if rc: raise SystemExit(f"passk: the GRPO run failed (exit {rc})")
    s = json.loads(summary.read_text())
    return launch.final_model_folder(out, s), s


def evaluate(name, path, a):
    "`rlhf-nb eval --n_samples N --temperature T` of one checkpoint, written to WORK/NAME.json; -> (result, seconds)."
    from rlhf_nb.evaluate import EvalArgs, run_eval
    f, t0 = WORK / f"{name}.json", time.time()
    if f.is_file() and not a.fresh:                                    # the same checkpoint and settings: reuse
        old = json.loads(f.read_text())
        same = (str(path), a.eval_size, a.n_samples, a.temperature, a.seed)
        if tuple(old.get(k) for k in ("model", "n", "n_samples", "temperature", "seed")) == same: return old, None
    res = run_eval(EvalArgs(model_name_or_path=str(path), eval_size=a.eval_size, n_samples=a.n_samples,
                            temperature=a.temperature, batch_size=256, seed=a.seed, output_file=str(f)))
    return res, time.time() - t0


def table(rows, ks):
    "Markdown table: one row per checkpoint, pass@k and maj@k with their 95% intervals."
    f = lambda m, key: f"{m[key]:.3f}" + (f" [{m[key + '_ci95'][0]:.2f}, {m[key + '_ci95'][1]:.2f}]" if m.get(key + "_ci95") else "")
    head = ["checkpoint", "greedy"] + [f"pass@{k}" for k in ks] + [f"maj@{ks[-1]}", f"mean@{ks[-1]}"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["metrics"]
        out.append("| " + " | ".join([r["name"], f"{r['greedy']:.3f}"] + [f(m, f"pass@{k}") for k in ks]
                                     + [f(m, f"maj@{ks[-1]}"), f"{m[f'mean@{ks[-1]}']:.3f}"]) + " |")
    return "\n".join(out)


def report(meta, rows):
    "Write bench/results_passk.md from the results (also `--report`, without running anything); -> the table."
    ks, s, g = rows[0]["ks"], meta.get("sft_start") or {}, meta.get("grpo") or {}
    extra = "".join(f"; {r['name']} = {r.get('about') or r['path']}" for r in rows[2:])    # --describe, else the folder
    md = [f"# pass@k on the arithmetic task ({meta['date']})", "",
          f"{meta['eval_size']} held-out prompts, {meta['n_samples']} samples each at temperature {meta['temperature']} "
          f"(seed {meta['seed']}); greedy = greedy accuracy on the same prompts; brackets: 95% interval across prompts "
          f"(normal approximation). Checkpoints: sft = the tiny model's SFT warm start ({s.get('steps')} steps, held-out "
          f"greedy accuracy {s.get('eval_accuracy') or 0:.3f} at the stop), grpo = sft after {g.get('steps')} GRPO steps "
          f"(16 prompts x 8 samples, lr 2e-4, no KL){extra}. "
          f"{meta['cpus']} CPUs, {meta['torch_threads']} torch thread(s), load {meta['load']}.", "",
          table(rows, ks), "", f"Command: `{meta['command']}`", "",
          "Add a checkpoint: `python bench/passk.py --checkpoint NAME=DIR` (same prompts, samples and seed).", "",
          "![pass@k against k](results_passk.png)", ""]
    (BENCH / "results_passk.md").write_text("\n".join(md))
    return table(rows, ks)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval_size", type=int, default=100, help="held-out prompts per checkpoint")
    ap.add_argument("--n_samples", type=int, default=16, help="answers sampled per prompt")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--grpo_steps", type=int, default=40, help="GRPO steps (16 prompts x 8 samples each)")
    ap.add_argument("--fresh", action="store_true", help="redo the GRPO run and every eval even when bench/_work/passk holds them")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR", help="another checkpoint to evaluate")
    ap.add_argument("--describe", action="append", default=[], metavar="NAME=TEXT",
                    help="how an added checkpoint was made, for the table's caption")
    ap.add_argument("--report", action="store_true", help="rewrite results_passk.md from results_passk.json only")
    a = ap.parse_args(argv)
    if a.report:
        res = json.loads((BENCH / "results_passk.json").read_text()); print(report(res["meta"], res["checkpoints"])); return 0
    import torch
    from rlhf_nb.sft import sft_warm_start, greedy_accuracy
    from rlhf_nb.models import load_causal_lm, load_tokenizer
    from rlhf_nb.arith import make_arith
    from rlhf_nb.evaluate import plot_passk
    WORK.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)                                            # tiny model: one thread is fastest on shared cores
    t0 = time.time()
    sft_dir = Path(sft_warm_start(str(WORK / "sft_start"), max_seconds=None, max_steps=1500, progress=False))
    t_sft = time.time() - t0
    if a.fresh: shutil.rmtree(WORK / "grpo_run", ignore_errors=True)
    grpo_dir, grpo_summary = grpo_checkpoint(sft_dir, WORK / "grpo_run", a.grpo_steps, a.seed)
    checkpoints = [("sft", sft_dir), ("grpo", grpo_dir)] + [tuple(c.split("=", 1)) for c in a.checkpoint]
    rows, held_out = [], make_arith(a.eval_size, "test", seed=a.seed)
    about = dict(d.split("=", 1) for d in a.describe)
    for name, path in checkpoints:
        res, secs = evaluate(name, path, a)
        tok, model = load_tokenizer(str(path), verbose=False), load_causal_lm(str(path)).eval()
        greedy = greedy_accuracy(model, tok, held_out, batch_size=256)["accuracy"]
        rows.append({"name": name, "path": str(path), "about": about.get(name), "greedy": greedy,
                     "eval_seconds": secs and round(secs, 1),
                     "metrics": res["metrics"]["all"], "ks": res["ks"]})
        print(f"passk: {name}: greedy {greedy:.3f}, pass@1 {res['accuracy']:.3f}, "
              f"pass@{a.n_samples} {res['metrics']['all'][f'pass@{a.n_samples}']:.3f}"
              + (f" ({secs:.0f} s)" if secs else " (eval file reused)"), file=sys.stderr)
    ks = rows[0]["ks"]
    plot_passk([WORK / f"{n}.json" for n, _ in checkpoints], BENCH / "results_passk.png", labels=[n for n, _ in checkpoints])
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "eval_size": a.eval_size, "n_samples": a.n_samples,
            "temperature": a.temperature, "seed": a.seed, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "load": round(os.getloadavg()[0], 1), "sft_seconds": round(t_sft, 1),
            "sft_start": {k: json.loads((sft_dir / "sft_info.json").read_text()).get(k)
                          for k in ("steps", "reached_target", "eval_accuracy", "final_accuracy", "train_seconds")},
            "grpo": {k: grpo_summary.get(k) for k in ("steps", "seconds") if k in grpo_summary},
            "command": "python bench/passk.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "ci": "95% normal approximation across prompts"}
    (BENCH / "results_passk.json").write_text(json.dumps({"meta": meta, "checkpoints": rows}, indent=1))
    print(report(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

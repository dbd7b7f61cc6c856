"""The distillation lab: on-policy distillation against SFT on teacher samples and GRPO, at equal compute, on arithmetic.

    python bench/distill_lab.py                 # small default (about 20 minutes on 2 busy CPU cores, most of it the teacher's SFT): 300 steps per arm
    python bench/distill_lab.py --full          # full size: teacher SFT to 60%, 1000 steps per arm, 500 held-out prompts
    python bench/distill_lab.py --plot_only     # redraw the figure and rewrite the table from the json
    python bench/distill_lab.py --student_acc 0.15 --steps 1500 --eval_every 100 --eval_size 200 \
        --arms grpo,opd,opd_reward,sft_teacher  # the run in results_distill.md: a student that is sometimes right

--student_acc stops the student's SFT at that held-out accuracy (cached in bench/_work/distill_student_acc<pct>, time
cap --student_seconds, 900 s by default with it); --steps, --eval_every and --eval_size override the size. The teacher
cache is the same in every case (reused, never retrained, as long as its SFT settings are unchanged).

The teacher is the tiny model (hidden 128, 4 layers) SFT-trained on the arithmetic task (`rlhf_nb.sft.sft_warm_start`,
cached in bench/_work/distill_teacher); the student is a smaller model (hidden 64, 2 layers) from the same SFT recipe
stopped early (bench/_work/distill_student). From that one student start, four arms:

    sft_teacher   SFT on the teacher's sampled answers to the training prompts (off-policy distillation)
    opd           on-policy distillation, `rlhf-nb distill` with reward_coef 0 (no reward at all)
    grpo          GRPO with the rule reward (GRPOConfig; no reference, as the distillation arms)
    opd_reward    on-policy distillation + the rule reward's GRPO advantage (reward_coef 1)

Every RL arm samples the same batch (16 prompts x 4 completions x up to 12 tokens), one optimiser step per batch, learning
rate 5e-4 (the SFT arm: 3e-3, the SFT recipe's own, batches of 64), placement colocate, the trainer class the CLI picks. Compute is counted in FLOPs from the model shapes
(bench/flops.py: sampling, the old-policy forward, the teacher's forward, forward + backward of the update; for
sft_teacher the teacher's sampling and the student's SFT steps), the held-out evaluation left out (the same for all).
The SFT arm gets the GRPO arm's FLOPs. Held-out greedy accuracy on `eval_size` prompts of the arithmetic test split.
Results: bench/results_distill.json, .md, .png.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)); sys.path.insert(0, str(HERE.parent))
import flops as F                                                       # noqa: E402

SMALL = dict(steps=300, eval_every=50, eval_size=200, teacher_acc=0.5, teacher_seconds=720, student_seconds=40, tag="small")
FULL = dict(steps=1000, eval_every=100, eval_size=500, teacher_acc=0.6, teacher_seconds=1200, student_seconds=120, tag="full")
STUDENT_SHAPE = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
BATCH = dict(per_device_train_batch_size=16, num_generations=4, max_completion_length=12, learning_rate=5e-4,
             arith_train_size=2000, save_final=False, disable_tqdm=True, report_to="none", ref_strategy="none", kl_coef=0.0)
ARMS = ("sft_teacher", "opd", "grpo", "opd_reward")


def shape(path):
    "The flops.py shape dict of the model saved at `path`."
    c = json.loads((Path(path) / "config.json").read_text())
    return {k: c[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                              "num_key_value_heads", "vocab_size") if k in c}


def rl_step_flops(student, teacher, rows, P, R, kept=1.0):
    "FLOPs of one RL step: sampling, old log-probs, the teacher's forward (when `teacher`), the update on the kept rows."
    f = F.generation(student, rows, P, R) + F.forward(student, rows, P + R, R) + F.train(student, max(1, round(rows * kept)), P + R, R)
    return f + (F.forward(teacher, rows, P + R, R) if teacher else 0)


def starts(a):
    "(teacher folder, student folder): SFT warm starts, cached in bench/_work."
    from rlhf_nb.sft import sft_warm_start
    teacher = sft_warm_start(str(HERE / "_work/distill_teacher"), seed=0, target_accuracy=a["teacher_acc"],
                             max_seconds=a["teacher_seconds"], progress=False)
    acc = a.get("student_acc")                                          # None: the old start (SFT cut at student_seconds)
    folder = "_work/distill_student" if acc is None else f"_work/distill_student_acc{round(acc * 100)}"
    student = sft_warm_start(str(HERE / folder), seed=0, target_accuracy=0.9 if acc is None else acc,
                             max_seconds=a["student_seconds"], model_kw=STUDENT_SHAPE, progress=False)
    return teacher, student


def rl_arm(name, a, teacher, student, out):
    "Train one RL arm; -> {'flops': [...], 'accuracy': [...], 'seconds': [...]} at each evaluation."
    from rlhf_nb.rl_config import GRPOConfig, DistillConfig
    from rlhf_nb.distill import run_distill
    from rlhf_nb.algos import run_rl
    kw = dict(BATCH, model_name_or_path=student, output_dir=str(out / name), max_steps=a["steps"], eval_steps=a["eval_every"],
              eval_size=a["eval_size"], overwrite_output_dir=True)
    t0 = time.time()
    if name == "grpo": run_rl(GRPOConfig(**kw))
    else: run_distill(DistillConfig(**kw, teacher_model_name_or_path=teacher, reward_coef=1.0 if name == "opd_reward" else 0.0))
    rows = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines() if l.strip()]
    s_shape, t_shape = shape(student), shape(teacher) if name != "grpo" else None
    P, rows_per_step = 16, BATCH["per_device_train_batch_size"] * BATCH["num_generations"]
    curve, total, wall = {"step": [], "flops": [], "accuracy": [], "seconds": [], "reverse_kl": []}, 0.0, 0.0
    for r in sorted(rows, key=lambda r: r["step"]):
        if "response/length" in r:
            total += rl_step_flops(s_shape, t_shape, rows_per_step, P, max(1, round(r["response/length"])), r.get("informative_frac", 1.0))
            wall += r.get("time/step", 0.0)
        if "eval/accuracy" in r:
            curve["step"].append(r["step"]); curve["flops"].append(total); curve["accuracy"].append(r["eval/accuracy"])
            curve["seconds"].append(round(wall, 1)); curve["reverse_kl"].append(r.get("distill/reverse_kl"))
    curve["run_seconds"] = round(time.time() - t0, 1)
    return curve


def sft_arm(a, teacher, student, budget):
    "SFT of the student on the teacher's sampled answers (one per training prompt), steps chosen to spend `budget` FLOPs."
    import torch
    from transformers import AutoModelForCausalLM
    from rlhf_nb.models import load_tokenizer
    from rlhf_nb.arith import make_arith
    from rlhf_nb.prep import load_split
    from rlhf_nb.dataset import render_prompt
    from rlhf_nb.sft import sft_train, greedy_accuracy
    from rlhf_nb.workers import make_generation_config, generate_rollout
    tok = load_tokenizer(teacher, verbose=False)
    tm, sm = AutoModelForCausalLM.from_pretrained(teacher), AutoModelForCausalLM.from_pretrained(student)
    s_shape, t_shape, bs, P, R = shape(student), shape(teacher), 64, 16, 8
    step_f = F.train(s_shape, bs, P + R, R)
    n = max(bs, int(min(budget * 0.5 / F.generation(t_shape, 1, P, R), 4000)))    # at most half the budget on samples
    steps = max(1, int((budget - F.generation(t_shape, n, P, R)) / step_f))
    t0, rows, gc = time.time(), make_arith(n, "train", seed=1), make_generation_config(tok, BATCH["max_completion_length"])
    for i in range(0, n, 256):                                           # the teacher's samples, temperature 1
        chunk = rows[i:i + 256]
        enc = tok([render_prompt(tok, r["prompt"]) for r in chunk], return_tensors="pt", padding=True)
        out = generate_rollout(tm, enc.input_ids, enc.attention_mask, gc, tok.eos_token_id, tok.pad_token_id)
        for r, ids in zip(chunk, out["responses"]): r["completion"] = tok.decode(ids, skip_special_tokens=True)
    held = load_split("arith", "test", n=a["eval_size"], seed=0)[: a["eval_size"]]
    gen_f, every = F.generation(t_shape, n, P, R), max(1, steps // max(1, a["steps"] // a["eval_every"]))
    hist = sft_train(sm, tok, rows, held, learning_rate=3e-3, batch_size=bs, max_steps=steps,
                     eval_steps=every, warmup_steps=0, progress=False)
    ev = [h for h in hist if "eval_accuracy" in h]
    curve = {"step": [h["step"] for h in ev], "flops": [gen_f * (h["step"] > 0) + h["step"] * step_f for h in ev],
             "accuracy": [h["eval_accuracy"] for h in ev], "seconds": [round(h.get("seconds", 0.0), 1) for h in ev],
             "reverse_kl": [None] * len(ev)}
    curve.update(run_seconds=round(time.time() - t0, 1), teacher_samples=n, sft_steps=steps)
    return curve


def at_budget(curve, budget):
    "Held-out accuracy of the last evaluation at or below `budget` FLOPs."
    return next((a for f, a in reversed(list(zip(curve["flops"], curve["accuracy"]))) if f <= budget * 1.0001), None)


def to_reach(curve, target):
    "(FLOPs, seconds) of the first evaluation at or above `target` accuracy; (None, None) if never."
    return next(((f, s) for f, s, a in zip(curve["flops"], curve["seconds"], curve["accuracy"]) if a >= target), (None, None))


def table(res):
    "The markdown results table."
    t, budget = res["teacher_accuracy"], min(c["flops"][-1] for c in res["arms"].values())
    lines = [f"Teacher (hidden 128, 4 layers) held-out greedy accuracy {t:.3f}; student start (hidden 64, 2 layers) "
             f"{res['student_accuracy']:.3f}; {res['settings']['eval_size']} held-out prompts. Equal compute = "
             f"{budget:.3g} FLOPs (the smallest arm's total).", "",
             "| arm | final acc | best acc | acc at equal compute | FLOPs | train seconds | FLOPs to teacher - 5 pts |"
             " seconds to it |", "|---|---|---|---|---|---|---|---|"]
    for name, c in res["arms"].items():
        f, s = to_reach(c, t - 0.05)
        lines.append(f"| {name} | {c['accuracy'][-1]:.3f} | {max(c['accuracy']):.3f} | {at_budget(c, budget):.3f} | "
                     f"{c['flops'][-1]:.3g} | {c['seconds'][-1]:.0f} | {'-' if f is None else f'{f:.3g}'} | "
                     f"{'-' if s is None else f'{s:.0f}'} |")
    return "\n".join(lines) + "\n"


def leaders(res, n=8):
    "Markdown table: each arm's accuracy at `n` equal-FLOPs budgets up to the largest arm's total, and the leader."
    arms, top = res["arms"], max(c["flops"][-1] for c in res["arms"].values())
    lines = ["| FLOPs | " + " | ".join(arms) + " | leader |", "|---" * (len(arms) + 2) + "|"]
    for b in [top * (i + 1) / n for i in range(n)]:
        acc = {k: at_budget(c, b) for k, c in arms.items()}
        best = max(v for v in acc.values() if v is not None)
        lead = ", ".join(k for k, v in acc.items() if v == best)
        cell = lambda k, v: "-" if v is None else f"{v:.3f}" + ("*" if arms[k]["flops"][-1] < b * 0.99 else "")
        lines.append(f"| {b:.3g} | " + " | ".join(cell(k, v) for k, v in acc.items()) + f" | {lead} |")
    return "\n".join(lines) + "\n\n\\* the arm's run ended below this budget: its final accuracy.\n"


def verdict(res):
    "One paragraph: does on-policy distillation reach the teacher within 5 points at <= 1/4 of GRPO's compute?"
    t, arms, s0 = res["teacher_accuracy"], res["arms"], res["student_accuracy"]
    goal, out = t - 0.05, []
    for k, c in arms.items():
        f, s = to_reach(c, goal)
        out.append(f"{k}: reaches {goal:.3f} at {f:.3g} FLOPs ({s:.0f} s)" if f is not None else
                   f"{k}: does not reach {goal:.3f} (best {max(c['accuracy']):.3f}, final {c['accuracy'][-1]:.3f}, "
                   f"{c['flops'][-1]:.3g} FLOPs)")
    g, fo = arms.get("grpo"), min((to_reach(arms[k], goal)[0] for k in ("opd", "opd_reward") if k in arms
                                   and to_reach(arms[k], goal)[0] is not None), default=None)
    if g is None or fo is None: shape = "not tested: no on-policy distillation arm comes within 5 points"
    elif to_reach(g, goal)[0] is not None:
        fg = to_reach(g, goal)[0]
        shape = f"{'holds' if fo <= fg / 4 else 'does not hold'}: GRPO needs {fg / fo:.1f}x the FLOPs"
    elif max(g["accuracy"]) <= s0:
        shape = (f"holds only in the weak sense: GRPO never rises above the student start ({s0:.3f}) in "
                 f"{g['flops'][-1]:.3g} FLOPs, so no multiple of its compute can be given")
    else: shape = f"holds at least {g['flops'][-1] / fo:.2f}x: GRPO does not get there in {g['flops'][-1]:.3g} FLOPs"
    return "Teacher - 5 points: " + "; ".join(out) + f". Expected shape (on-policy distillation at <= 1/4 of GRPO's compute): {shape}.\n"


def plot(res, path):
    "Held-out accuracy against FLOPs, one line per arm, the teacher as a dashed line."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, c in res["arms"].items():
        axes[0].plot(c["flops"], c["accuracy"], marker="o", label=name)
        axes[1].plot(c["seconds"], c["accuracy"], marker="o", label=name)
    for ax, x in zip(axes, ("FLOPs (counted from the shapes)", "training seconds")):
        ax.axhline(res["teacher_accuracy"], ls="--", c="k", lw=1, label="teacher")
        ax.set_xlabel(x); ax.set_ylabel("held-out greedy accuracy"); ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8); fig.suptitle("distillation lab: arithmetic, student from one SFT start")
    fig.tight_layout(); fig.savefig(path, dpi=110); plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true"); ap.add_argument("--plot_only", action="store_true")
    ap.add_argument("--arms", default=",".join(ARMS)); ap.add_argument("--out", default=str(HERE / "results_distill.json"))
    ap.add_argument("--student_acc", type=float, default=None,
                    help="stop the student's SFT at this held-out accuracy (e.g. 0.15: sometimes right, as RL needs); "
                         "default: the old start, SFT cut at --student_seconds")
    ap.add_argument("--student_seconds", type=float, default=None, help="time cap of the student's SFT (default 40, "
                                                                           "or 900 with --student_acc)")
    ap.add_argument("--steps", type=int, default=None, help="optimiser steps per RL arm (default 300; --full 1000)")
    ap.add_argument("--eval_every", type=int, default=None, help="steps between held-out evaluations")
    ap.add_argument("--eval_size", type=int, default=None, help="held-out prompts per evaluation")
    ap.add_argument("--learning_rate", type=float, default=None, help="the RL arms' learning rate (default 5e-4)")
    args = ap.parse_args(argv)
    if args.student_acc is not None and not 0 < args.student_acc < 1:
        ap.error(f"--student_acc must be in (0, 1), got {args.student_acc}")
    for k in ("steps", "eval_every", "eval_size"):
        if getattr(args, k) is not None and getattr(args, k) < 1: ap.error(f"--{k} must be >= 1, got {getattr(args, k)}")
    out = Path(args.out)
    if args.plot_only:
        res = json.loads(out.read_text())
    else:
        import torch
        torch.set_num_threads(2)
        from rlhf_nb.models import load_tokenizer
        from rlhf_nb.sft import greedy_accuracy
        from rlhf_nb.prep import load_split
        from transformers import AutoModelForCausalLM
        a = dict(FULL if args.full else SMALL, student_acc=args.student_acc)
        if args.learning_rate is not None:
            if args.learning_rate <= 0: ap.error(f"--learning_rate must be > 0, got {args.learning_rate}")
            BATCH["learning_rate"] = args.learning_rate
        if args.student_acc is not None: a["student_seconds"] = 900
        for k in ("student_seconds", "steps", "eval_every", "eval_size"):
            if getattr(args, k) is not None: a[k] = getattr(args, k)
        given = sys.argv[1:] if argv is None else list(argv)
        given = [x for i, x in enumerate(given) if x != "--out" and (i == 0 or given[i - 1] != "--out")]
        a["command"] = " ".join(["python bench/distill_lab.py", *given])
        if a["command"] != "python bench/distill_lab.py" + (" --full" if args.full else ""):
            a["tag"] = (f"{a['tag']}_s{a['steps']}" + ("" if args.student_acc is None else f"_acc{round(args.student_acc * 100)}")
                        + ("" if args.learning_rate is None else f"_lr{args.learning_rate:g}"))
        t0 = time.time()
        teacher, student = starts(a)
        tok, held = load_tokenizer(teacher, verbose=False), load_split("arith", "test", n=a["eval_size"], seed=0)[: a["eval_size"]]
        acc = lambda p: greedy_accuracy(AutoModelForCausalLM.from_pretrained(p), tok, held)["accuracy"]
        res = {"settings": {**a, **BATCH, "student_shape": STUDENT_SHAPE}, "teacher_accuracy": acc(teacher),
               "student_accuracy": acc(student), "arms": {}}
        work = HERE / "_work" / f"distill_{a['tag']}"
        for name in [n for n in args.arms.split(",") if n != "sft_teacher"]:
            res["arms"][name] = rl_arm(name, a, teacher, student, work)
            print(name, res["arms"][name]["accuracy"], flush=True)
            out.write_text(json.dumps(res, indent=1))                   # partial results, arm by arm
        if "sft_teacher" in args.arms.split(","):
            budget = res["arms"].get("grpo", next(iter(res["arms"].values())))["flops"][-1]
            res["arms"] = {"sft_teacher": sft_arm(a, teacher, student, budget), **res["arms"]}
        res["seconds"] = round(time.time() - t0, 1)
        out.write_text(json.dumps(res, indent=1))
    cmd = res["settings"].get("command") or "python bench/distill_lab.py" + (" --full" if res["settings"]["tag"] == "full" else "")
    out.with_suffix(".md").write_text(f"# Distillation lab\n\nCommand: `{cmd}` ({res.get('seconds', 0):.0f} s)\n\n"
                                      + table(res) + "\nAccuracy at equal FLOPs (the last evaluation at or below each budget):\n\n"
                                      + leaders(res) + "\n" + verdict(res)
                                      + "".join(f"\n{n}\n" for n in res.get("notes", [])))
    plot(res, out.with_suffix(".png"))
    print(table(res))


if __name__ == "__main__": main()

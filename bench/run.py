"""rlhf-nb vs TRL, same work, same machine, one run: `python bench/run.py [--quick] [--gpu [--dry_run]] [--only NAME]`.

Each measurement ("arm") runs in a FRESH subprocess (bench/arms.py) so peak RSS (`ru_maxrss`) is per arm; the two arms
of a comparison alternate A, B, A, B, ... so machine load drifts hit both. Writes bench/results.json, bench/results.md
and bench/results.png. Absolute times on a shared CPU drift; the ratios (rlhf-nb / TRL, same run) are the result."""
from __future__ import annotations
import os, sys, json, time, argparse, statistics, subprocess, datetime, shutil, tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C

BENCH = C.BENCH_DIR
VENV112 = BENCH / ".venv-trl112"
PY112 = VENV112 / "bin" / "python"
RESULTS_JSON, RESULTS_MD, RESULTS_PNG = BENCH / "results.json", BENCH / "results.md", BENCH / "results.png"


def log(*a):
    print("[bench]", *a, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# TRL 1.12 lives in its own virtualenv (TRL >= 1.13 removed PPOTrainer)
# ----------------------------------------------------------------------------------------------------------------
def _venv_ok():
    if not PY112.exists(): return False, "missing"
    code = "import trl, requests; from trl.experimental.ppo import PPOTrainer; print(trl.__version__)"
    r = subprocess.run([str(PY112), "-c", code], capture_output=True, text=True, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    if r.returncode != 0: return False, (r.stderr.strip().splitlines() or ["?"])[-1]
    v = r.stdout.strip()
    return v == "1.12.0", f"trl {v}"


def outer_site_paths():
    """The import paths of the interpreter running the bench (its site-packages, a virtualenv's included). A side venv
    made with `--system-site-packages` from inside a virtualenv sees the *base* interpreter's packages instead, so the
    side venv reads these through a .pth file: trl 1.12 in its own site-packages comes first, torch & co. from here."""
    import site
    paths = list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return [p for p in dict.fromkeys(paths) if Path(p).is_dir()]


def make_side_venv(path, packages, python=sys.executable, runner=subprocess.run):
    """A virtualenv at `path` whose own site-packages holds `packages` (installed by this interpreter's pip, no deps)
    and that imports everything else from this interpreter's paths; -> (ok, message). Works from a venv or not."""
    path = Path(path)
    steps = [[python, "-m", "venv", "--without-pip", "--clear", str(path)]]
    r = runner(steps[0], capture_output=True, text=True)
    if r.returncode != 0: return False, f"venv failed: {(r.stderr or r.stdout).strip()[-400:]}"
    side = next((path / "lib").glob("python*/site-packages"), None)
    if side is None: return False, f"no site-packages under {path / 'lib'}"
    (side / "_outer_env.pth").write_text("\n".join(outer_site_paths()) + "\n")
    cmd = [python, "-m", "pip", "install", "--no-deps", "--target", str(side), *packages]
    r = runner(cmd, capture_output=True, text=True)
    if r.returncode != 0: return False, f"`{' '.join(cmd[1:])}` failed: {(r.stderr or r.stdout).strip()[-400:]}"
    return True, f"{path} ({', '.join(packages)} over {len(outer_site_paths())} outer path(s))"


def ensure_trl112_venv():
    "Make bench/.venv-trl112 (trl==1.12.0 over this interpreter's packages) when missing or broken; -> (ok, why)."
    ok, why = _venv_ok()
    if ok:
        log(f"TRL 1.12 virtualenv ok: {VENV112} ({why})"); return True, why
    log(f"TRL 1.12 virtualenv {VENV112} not usable ({why}); creating it")
    made, msg = make_side_venv(VENV112, ["trl==1.12.0"])
    log(f"  {msg}")
    ok, why = _venv_ok() if made else (False, msg)
    log(f"TRL 1.12 virtualenv {'ready' if ok else 'still broken'} ({why})")
    return ok, why


# ----------------------------------------------------------------------------------------------------------------
# Running one arm in a fresh process
# ----------------------------------------------------------------------------------------------------------------
def arm_env(threads):
    env = dict(os.environ)
    # Under CPU oversubscription (2 shared cores) OpenMP's default busy-wait makes 2-thread torch up to ~20x slower;
    # passive waiting keeps both arms sane. Both arms get the same environment.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(C.REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_arm(name, params, python=None, timeout=600, logf=None):
    "Run `bench/arms.py NAME` in a fresh process; return its result dict (or {'error': ...})."
    python = str(python or sys.executable)
    cmd = [python, str(BENCH / "arms.py"), name, json.dumps(params)]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=arm_env(params.get("threads", 2)),
                           cwd=str(C.REPO))
        out, err, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout", -9
    wall = time.perf_counter() - t0
    if logf is not None:
        logf.write(f"\n===== {name} {json.dumps(params)} rc={rc} wall={wall:.1f}s\n{out[-20000:]}\n--- stderr ---\n{err[-20000:]}\n")
        logf.flush()
    for line in out.splitlines()[::-1]:
        if line.startswith(C.RESULT_TAG):
            res = json.loads(line[len(C.RESULT_TAG):]); res["process_wall_s"] = wall
            return res
    tail = "\n".join((err or out).strip().splitlines()[-6:])
    return {"error": f"rc={rc}: {tail}", "process_wall_s": wall}


def summarize(values):
    vals = [v for v in values if isinstance(v, (int, float))]
    if not vals: return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def ab(bench, arms, reps, metrics, logf, lower_is_better=None, derive=None):
    """Interleaved A/B/...: for each repetition run every arm once, in order, each in a fresh process.
    `arms`: list of (label, arm_name, params, python). Returns per-arm reps, summaries and ratios arm0/arm1."""
    out = {"arms": {}, "order": []}
    for label, name, params, python in arms:
        out["arms"][label] = {"arm": name, "params": params, "reps": [], "summary": {}}
    for rep in range(reps):
        for label, name, params, python in arms:
            if out["arms"][label].get("unavailable"): continue
            log(f"{bench}: rep {rep + 1}/{reps} {label} ({name}) ...")
            res = run_arm(name, params, python=python, timeout=params.get("timeout", 600), logf=logf)
            res["load_1m"] = (C.load_avg() or [None])[0]
            if derive and "error" not in res and "unavailable" not in res: derive(res)
            if "unavailable" in res:
                out["arms"][label]["unavailable"] = res["unavailable"]; log(f"  {label} skipped: {res['unavailable']}")
                continue
            out["arms"][label]["reps"].append(res)
            out["order"].append(label)
            if "error" in res: log(f"  {label} FAILED: {res['error'][-400:]}")
            else: log("  " + ", ".join(f"{m}={res[m]:.4g}" for m in metrics if isinstance(res.get(m), (int, float))))
    for label, a in out["arms"].items():
        for m in metrics: a["summary"][m] = summarize([r.get(m) for r in a["reps"]])
        errs = [r["error"] for r in a["reps"] if "error" in r]
        if errs: a["errors"] = errs
    labels = list(out["arms"])
    if len(labels) >= 2:
        A, B = out["arms"][labels[0]], out["arms"][labels[1]]
        out["ratio_of"] = f"{labels[0]} / {labels[1]}"
        out["ratios"], out["paired_ratios"] = {}, {}
        for m in metrics:
            sa, sb = A["summary"].get(m), B["summary"].get(m)
            if m.startswith("accuracy"):                 # accuracies compare as differences (points), not ratios
                if sa and sb: out.setdefault("differences", {})[m] = sa["median"] - sb["median"]
                continue
            if sa and sb and sb["median"]: out["ratios"][m] = sa["median"] / sb["median"]
            pr = [ra[m] / rb[m] for ra, rb in zip(A["reps"], B["reps"])
                  if isinstance(ra.get(m), (int, float)) and isinstance(rb.get(m), (int, float)) and rb[m]]
            if pr: out["paired_ratios"][m] = summarize(pr)
    return out


# ----------------------------------------------------------------------------------------------------------------
# The benchmarks
# ----------------------------------------------------------------------------------------------------------------
def grpo_params(a, size="demo", precision="fp32"):
    return dict(threads=a.threads, prompts=16, generations=8, max_new_tokens=16, updates_per_generation=2, lr=a.lr,
                beta=0.0, temperature=1.0, warmup_rounds=1, rounds=2 if a.quick else 4, seed=0,
                init_path=a.init_path if size == "demo" else None, shape=C.SIZES[size], precision=precision, size=size)


# The targets of the scaling issue, at every size and precision: time ratios (wall and CPU) and peak RSS.
TARGETS = {"grpo": {"round_s": 0.5, "round_cpu_s": 0.5, "peak_rss_mb": 0.8},
           "ppo": {"update_s": 0.5, "update_cpu_s": 0.5, "peak_rss_mb": 0.8},
           "dpo": {"step_s": 0.6, "step_cpu_s": 0.6, "peak_rss_mb": 0.8}}
TIME_KEY = {"grpo": "round_s", "ppo": "update_s", "dpo": "step_s"}
FLOP_METRICS = ["gflop_per_round", "achieved_gflops", "peak_fraction"]


def flop_deriver(kind, peaks, precision):
    "Adds GFLOP per round, achieved GFLOP/s and the fraction of the measured matmul peak of `precision` to an arm's result."
    peak = (peaks or {}).get("bfloat16_gflops" if precision == "bf16" else "float32_gflops")
    def derive(res):
        fl, t = res.get("flops_per_round"), res.get(TIME_KEY[kind])
        if not fl or not t: return
        res["gflop_per_round"] = fl / 1e9
        res["achieved_gflops"] = fl / t / 1e9
        if peak: res["peak_fraction"] = res["achieved_gflops"] / peak
    return derive


def _sized(res, kind, size, precision, a):
    "Labels, targets and the machine peak of one (size, precision) comparison."
    res["size"], res["precision"] = size, precision
    res["target"] = TARGETS[kind]
    res["peak_gflops"] = a.peaks
    res["what"] += f"; model {size} ({'default tiny shape' if size == 'demo' else C.SIZES[size]}), {precision}"
    return res


def bench_grpo(a, logf, size="demo", precision="fp32"):
    p = grpo_params(a, size, precision)
    res = ab("grpo", [("rlhf-nb", "nb_grpo", p, None), ("trl-1.16", "trl_grpo", p, None)], a.reps,
             ["round_s", "round_cpu_s", "completion_tok_per_s", "peak_rss_mb"] + FLOP_METRICS, logf,
             derive=flop_deriver("grpo", a.peaks, precision))
    res["what"] = ("one GRPO round = generate 16 prompts x 8 completions (max 16 new tokens, T=1) + score + 2 optimizer "
                   "updates on them (TRL: num_iterations=2); same lr, constant schedule; time after warm-up round(s)")
    return _sized(res, "grpo", size, precision, a)


# The GRPO learning rate of the accuracy race per size when --acc_lr is not given; None: GRPOConfig's default (3e-4),
# which was set on the demo model. At 6.3M that rate wrecks the SFT start on both sides within 150 s (held-out
# accuracy 0.35 -> 0.01 for rlhf-nb, 0.02 for TRL), so the race would only compare two collapses; at 1e-4 (a third,
# as its SFT rate is a third of the demo's, chosen before measuring) both sides learn: 0.35 -> 0.65 rlhf-nb, 0.54 TRL
# (load ~2.7); at 3e-5 both learn too, 0.67 rlhf-nb vs 0.68 TRL (load ~2.2), a tie within one seed's noise.
ACC_LR = {"demo": None, "6.3M": 1e-4, "33.6M": None}


def acc_lr(a, size, defaults):
    "-> (lr, where it came from) of the accuracy race at `size`: --acc_lr, else ACC_LR[size], else GRPOConfig's default."
    if a.acc_lr: return a.acc_lr, "--acc_lr"
    if ACC_LR.get(size): return ACC_LR[size], f"the bench's rate for {size}"
    return defaults.get("learning_rate") or a.lr, "rlhf-nb GRPOConfig's default"


def bench_grpo_accuracy(a, logf, size="demo", precision="fp32"):
    "Held-out greedy accuracy after equal wall time from the same SFT start at `size`, both sides in `precision` (full run only)."
    d = grpo_defaults()
    lr, lr_src = acc_lr(a, size, d)
    p = dict(grpo_params(a, size, precision), wall_seconds=a.acc_seconds, n_eval=a.n_eval, init_path=a.sft_paths[size],
             lr=lr, beta=d.get("kl_coef", 0.0), updates_per_generation=a.acc_updates or d.get("num_ppo_epochs") or 1)
    res = ab("grpo_accuracy", [("rlhf-nb", "nb_grpo_acc", p, None), ("trl-1.16", "trl_grpo_acc", p, None)], 1,
             ["accuracy_start", "accuracy_end", "accuracy_gain", "rounds_done", "peak_rss_mb"], logf)
    res["reps"] = 1
    res["what"] = (f"GRPO for {a.acc_seconds:.0f} s of wall time from the same SFT start, then greedy accuracy on "
                   f"{a.n_eval} held-out prompts; both at lr {p['lr']:g} ({lr_src}), beta {p['beta']:g} (rlhf-nb GRPOConfig's default), "
                   f"16 prompts x 8 completions, {p['updates_per_generation']} update(s) per generation; rlhf-nb otherwise with its GRPO defaults "
                   f"(zero-signal groups dropped), TRL with its own; model {size} "
                   f"({'default tiny shape' if size == 'demo' else C.SIZES[size]}), {precision}"
                   f"{' (both sides train under bfloat16 autocast on the CPU; the accuracy is measured in fp32)' if precision == 'bf16' else ''}")
    res.update(size=size, precision=precision, sft_start=(a.sft_info or {}).get(size), sft_path=a.sft_paths[size])
    return res


def grpo_defaults():
    "learning_rate and kl_coef of rlhf_nb.algos.GRPOConfig (read in a subprocess: the runner imports no torch)."
    code = ("import json; from rlhf_nb.algos import GRPOConfig as G; c = G(); "
            "print(json.dumps({'learning_rate': c.learning_rate, 'kl_coef': c.kl_coef, 'num_ppo_epochs': c.num_ppo_epochs}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=arm_env(1), timeout=300)
    try: return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception: return {}


def bench_ppo(a, logf, critic="separate", size="demo", precision="fp32"):
    p = dict(critic=critic, threads=a.threads, episodes=128, mini_batch_size=64, ppo_epochs=2, max_new_tokens=16, lr=a.lr,
             kl_coef=0.05, temperature=1.0, warmup_rounds=1, rounds=2 if a.quick else 5, seed=0,
             init_path=a.init_path if size == "demo" else None, shape=C.SIZES[size], precision=precision, size=size)
    ok, why = ensure_trl112_venv()
    if not ok:          # no baseline, no comparison: an error in the report (and the run's exit status), never a silent gap
        return {"error": f"baseline missing: the TRL 1.12 virtualenv {VENV112} could not be made ({why}); nothing was "
                         f"compared", "arms": {}, "what": "PPO update vs TRL 1.12", "size": size, "precision": precision}
    arms = [("rlhf-nb", "nb_ppo", p, None), ("trl-1.12", "trl112_ppo", p, PY112)]
    res = ab("ppo" if critic == "separate" else "ppo_shared", arms, a.reps,
             ["update_s", "update_cpu_s", "peak_rss_mb"] + FLOP_METRICS, logf, derive=flop_deriver("ppo", a.peaks, precision))
    res["what"] = ("one PPO update = generate 128 episodes (response length 16) + reward + ref/old log-probs + values + "
                   "GAE + 2 PPO epochs x 2 minibatches of 64; separate critic; TRL 1.12 also runs a reward model of the demo shape")
    return _sized(res, "ppo", size, precision, a)


def bench_dpo(a, logf, size="demo", precision="fp32"):
    p = dict(threads=a.threads, n_pairs=512, batch_size=32, lr=a.lr, beta=0.1, warmup_steps=1 if a.quick else 2,
             steps=3 if a.quick else 8, seed=0, init_path=a.init_path if size == "demo" else None, precompute_ref=True,
             shape=C.SIZES[size], precision=precision, size=size)
    res = ab("dpo", [("rlhf-nb", "nb_dpo", p, None), ("trl-1.16", "trl_dpo", p, None)], a.reps,
             ["step_s", "step_cpu_s", "peak_rss_mb", "setup_s"] + FLOP_METRICS, logf, derive=flop_deriver("dpo", a.peaks, precision))
    res["what"] = ("one DPO optimizer step on 32 preference pairs of the arithmetic task (chosen = right answer, "
                   "rejected = wrong), sigmoid loss beta=0.1, reference log-probs precomputed before training")
    return _sized(res, "dpo", size, precision, a)


def bench_refs(a, logf):
    res = ab("ref_strategies", [("rlhf-nb", "ref_strategies", dict(threads=a.threads), None)], 1,
             [f"{s}_{k}" for k in ("bytes", "total_bytes", "bytes_0.5b_bf16", "total_bytes_0.5b_bf16")
              for s in ("copy", "peft", "none")] + ["peft_adapter_bytes", "peft_adapter_bytes_0.5b_bf16"], logf)
    res["reps"] = 1
    res["what"] = "bytes of weights resident for the reference policy: frozen copy / PEFT base with adapter off / none"
    return res


def bench_rewards(a, logf):
    res = ab("rewards", [("rlhf-nb", "rewards", dict(threads=1, quick=a.quick, timeout=900), None)], 1,
             ["reward_manager_completions_per_s", "math_verify_calls_per_s"], logf)
    res["reps"] = 1
    res["what"] = "RewardManager on 10,000 GSM8K-style completions; math-verify calls/s (bench/bench_rewards.py)"
    return res


def bench_gpu(a, logf):
    p = dict(threads=a.threads, dry_run=a.dry_run, peak_tflops=a.peak_tflops, timeout=600)
    res = ab("gpu", [("hf-qwen2-0.5b-shape", "gpu_model", p, None)], 1,
             ["gen_tok_per_s", "train_tok_per_s", "train_step_s", "peak_gpu_mem_gb", "mfu"], logf)
    res["what"] = ("0.5B-shaped Qwen2 (hidden 896, 24 layers, 14 heads, 2 kv heads, ffn 4864, vocab 151936), random init, "
                   "bf16: generation and training throughput, step time, peak GPU memory, MFU = 6*N*tokens/time/peak")
    if a.dry_run: res["what"] += " -- DRY RUN: small shape on CPU, numbers only test the logic"
    return res


def bench_ppo_shared(a, logf):
    "rlhf-nb PPO with the critic as a value head on the policy trunk vs TRL 1.12's separate value model (different work)."
    res = bench_ppo(a, logf, critic="shared")
    res.pop("target", None)
    res["what"] = ("as `ppo`, but rlhf-nb runs critic='shared' (one trunk, a scalar value head: no second backbone to "
                   "run or train) while TRL 1.12 keeps its separate value model: NOT the same work; it shows what the "
                   "shared critic buys")
    res.pop("target", None)
    return res


BENCHES = {"grpo": bench_grpo, "ppo": bench_ppo, "ppo_shared": bench_ppo_shared, "dpo": bench_dpo, "ref_strategies": bench_refs,
           "rewards": bench_rewards, "grpo_accuracy": bench_grpo_accuracy, "gpu": bench_gpu}


# ----------------------------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------------------------
def fmt(x, nd=3):
    if x is None: return "—"
    if isinstance(x, float):
        if abs(x) >= 1e6: return f"{x:.3g}"
        return f"{x:.{nd}g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def write_md(results):
    m, L = results, []
    L.append("# rlhf-nb benchmark results\n")
    L.append(f"- last command: `{m['command']}` on {m['date']} (mode: {m['mode']}); each bench below says when and "
             f"how it was measured (a run updates only its own benches)")
    mc = m["machine"]
    L.append(f"- machine: {mc['cpu_model']}, {mc['cores']} cores, {mc.get('mem_total_gb')} GB RAM, {mc['platform']}")
    v = m["versions"]
    L.append(f"- versions: python {mc['python']}, torch {v.get('torch')}, transformers {v.get('transformers')}, "
             f"trl {v.get('trl')} (PPO baseline: trl {(m.get('versions_trl112') or {}).get('trl')} in bench/.venv-trl112), "
             f"peft {v.get('peft')}")
    L.append(f"- torch threads per arm: {m['settings']['threads']}, OMP_WAIT_POLICY={m['settings']['omp_wait_policy']}")
    if m.get("peak_gflops"):
        pk = m["peak_gflops"]
        L.append(f"- measured matmul peak (the MFU denominator, {m['settings']['threads']} threads, n=1024/2048): "
                 f"fp32 {fmt(pk.get('float32_gflops'))} GFLOP/s, bf16 {fmt(pk.get('bfloat16_gflops'))} GFLOP/s")
    L.append(f"- load (uptime) before the last command: `{m['uptime_before']}`")
    L.append(f"- load (uptime) after the last command:  `{m['uptime_after']}`\n")
    L.append("Ratios are rlhf-nb / TRL from the same run (medians of interleaved repetitions, each arm in a fresh "
             "process); below 1 means rlhf-nb is faster / leaner. Paired = median of per-repetition ratios.\n")
    rows = []
    for name, b in m["benches"].items():
        for met, r in (b.get("ratios") or {}).items():
            pr = (b.get("paired_ratios") or {}).get(met) or {}
            tgt = (b.get("target") or {}).get(met)
            ok = "" if tgt is None else ("met" if r <= tgt else "NOT met")
            rows.append(f"| {name} | {met} | {fmt(r)} | {fmt(pr.get('min'))}–{fmt(pr.get('max'))} | "
                        f"{'≤ ' + fmt(tgt) if tgt is not None else ''} {ok} |")
    for name, b in m["benches"].items():
        for met, d in (b.get("differences") or {}).items():
            rows.append(f"| {name} | {met} | {100 * d:+.1f} points (rlhf-nb − TRL) | | |")
        if b.get("error"): rows.append(f"| {name} | ERROR | {b['error'][:200]} | | |")
    if rows:
        L.append("## Ratios (rlhf-nb / TRL)\n")
        L.append("| bench | metric | ratio of medians | paired min–max | target |")
        L.append("|---|---|---|---|---|")
        L += rows
        L.append("")
    for name, b in m["benches"].items():
        L.append(f"## {name}\n")
        if b.get("what"): L.append(b["what"] + "\n")
        if b.get("note"): L.append(f"Note: {b['note']}\n")
        if b.get("date"): L.append(f"(measured {b['date']}, {b.get('mode', '?')} mode, {b.get('reps', '?')} repetitions, start: "
                                   f"{b.get('init', '?')}; 1-min load before/after: {b.get('load_before')} / {b.get('load_after')})\n")
        if b.get("skipped"): L.append(f"Skipped: {b['skipped']}\n"); continue
        if b.get("error"): L.append(f"**ERROR: {b['error']}**\n"); continue
        mets = sorted({k for a in b["arms"].values() for k in a["summary"]})
        L.append("| arm | metric | median | min | max | n |")
        L.append("|---|---|---|---|---|---|")
        for label, a in b["arms"].items():
            for met in mets:
                s = a["summary"].get(met)
                if s: L.append(f"| {label} | {met} | {fmt(s['median'])} | {fmt(s['min'])} | {fmt(s['max'])} | {s['n']} |")
            if a.get("unavailable"): L.append(f"| {label} | not measured | {a['unavailable']} | | | |")
            for e in a.get("errors", [])[:2]:
                L.append(f"| {label} | ERROR | {e.splitlines()[-1][:160].replace('|', '/')} | | | |")
        extra = [(label, r.get("info")) for label, a in b["arms"].items() for r in a["reps"][:1] if r.get("info")]
        for label, info in extra: L.append(f"\n{label}: {info}")
        for label, a in b["arms"].items():
            ph = [r["phases"] for r in a["reps"] if r.get("phases")]
            if ph:
                keys = sorted({k for d in ph for k in d})
                med = {k: statistics.median([d[k] for d in ph if k in d]) for k in keys}
                L.append(f"\n{label} time per phase (s, median over repetitions of the in-process medians): " +
                         ", ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in med.items()))
        L.append("")
    tmp = RESULTS_MD.with_suffix(".md.tmp"); tmp.write_text("\n".join(L) + "\n"); os.replace(tmp, RESULTS_MD)


def write_png(results):
    "Bar chart of every time/memory ratio (rlhf-nb / TRL); dashed: the issue's target; green met, red not, grey none."
    try:
        import matplotlib; matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log(f"no plot ({e})"); return
    items = [(f"{n}\n{met}", r, (b.get("target") or {}).get(met), b.get("load_before"))
             for n, b in results["benches"].items() for met, r in (b.get("ratios") or {}).items()
             if not met.endswith("per_s") and met != "setup_s"]
    if not items: return
    fig, ax = plt.subplots(figsize=(max(5, 1.0 * len(items)), 3.8))
    xs = range(len(items))
    col = ["tab:gray" if t is None else ("tab:green" if r <= t else "tab:red") for _, r, t, _ in items]
    ax.bar(xs, [r for _, r, _, _ in items], color=col)
    for i, (_, r, t, _) in enumerate(items):
        ax.text(i, r, f"{r:.2f}", ha="center", va="bottom", fontsize=8)
        if t: ax.plot([i - 0.4, i + 0.4], [t, t], "k--", lw=1)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(list(xs)); ax.set_xticklabels([n for n, _, _, _ in items], fontsize=7)
    ax.set_ylabel("rlhf-nb / TRL (lower is better)")
    dates = sorted(b["date"][:10] for b in results["benches"].values() if b.get("date"))
    loads = [l for _, _, _, l in items if l is not None]
    ax.set_title(f"rlhf-nb vs TRL on the same work, ratios of interleaved medians ({dates[0] if dates else '?'}"
                 f"{' to ' + dates[-1] if dates and dates[-1] != dates[0] else ''}; 1-min load "
                 f"{min(loads):.0f}-{max(loads):.0f} on {results['machine']['cores']} cores)" if loads else "rlhf-nb vs TRL", fontsize=8)
    fig.tight_layout()
    tmp = str(RESULTS_PNG) + ".tmp.png"; fig.savefig(tmp, dpi=110); os.replace(tmp, RESULTS_PNG)
    plt.close(fig)


def ratios_table(results):
    "Markdown table of every ratio in `results` with the date, mode and load, for bench/README.md."
    L = [f"{results['machine']['cpu_model']}, {results['machine']['cores']} cores; torch {results['versions'].get('torch')}, "
         f"transformers {results['versions'].get('transformers')}, trl {results['versions'].get('trl')} / "
         f"{(results.get('versions_trl112') or {}).get('trl')} (PPO). Ratio = rlhf-nb / TRL, medians of interleaved "
         f"repetitions; `*_cpu_s` is CPU time (steady under load), `*_s` wall time. Full tables: `bench/results.md`.", "",
         "| comparison | metric | rlhf-nb | TRL | ratio | target | measured (mode, reps, 1-min load) |",
         "|---|---|---|---|---|---|---|"]
    for name, b in results["benches"].items():
        labels = list(b.get("arms", {}))
        for met, dif in (b.get("differences") or {}).items():
            va = (b["arms"][labels[0]]["summary"].get(met) or {}).get("median")
            vb = (b["arms"][labels[1]]["summary"].get(met) or {}).get("median")
            L.append(f"| {name} | {met} | {fmt(va)} | {fmt(vb)} ({labels[1]}) | **{100 * dif:+.1f} points** (difference) | "
                     f"{'> 0' if met == 'accuracy_end' else ''} | {b.get('date', '?')[:16]} ({b.get('mode', '?')}, "
                     f"{b.get('reps', '?')}, {b.get('load_before')}→{b.get('load_after')}) |")
        for met, r in (b.get("ratios") or {}).items():
            va = (b["arms"][labels[0]]["summary"].get(met) or {}).get("median")
            vb = (b["arms"][labels[1]]["summary"].get(met) or {}).get("median")
            t = (b.get("target") or {}).get(met)
            L.append(f"| {name} | {met} | {fmt(va)} | {fmt(vb)} ({labels[1]}) | **{r:.2f}** | "
                     f"{'' if t is None else ('≤ ' + str(t) + (' met' if r <= t else ' NOT met'))} | "
                     f"{b.get('date', '?')[:16]} ({b.get('mode', '?')}, {b.get('reps', '?')}, "
                     f"{b.get('load_before')}→{b.get('load_after')}) |")
        for label, a in b.get("arms", {}).items():
            if a.get("unavailable"): L.append(f"| {name} | — | {label}: not measured ({a['unavailable']}) | | | | |")
        if b.get("skipped"): L.append(f"| {name} | — | skipped: {b['skipped']} | | | | |")
    other = []
    rs = (results["benches"].get("ref_strategies") or {}).get("arms", {}).get("rlhf-nb", {}).get("reps") or []
    if rs:
        r = rs[0]
        mib = lambda k: f"{r[k] / 2**20:,.1f} MiB" if isinstance(r.get(k), (int, float)) else "—"
        other.append(f"| reference weights beyond the policy, tiny model: copy / peft / none | {mib('copy_bytes')} / "
                     f"{mib('peft_bytes')} (+ {mib('peft_adapter_bytes')} trained LoRA adapter) / {mib('none_bytes')} |")
        other.append(f"| same, 0.5B shape in bf16 | {mib('copy_bytes_0.5b_bf16')} / {mib('peft_bytes_0.5b_bf16')} "
                     f"(+ {mib('peft_adapter_bytes_0.5b_bf16')} adapter) / {mib('none_bytes_0.5b_bf16')} |")
    rw = (results["benches"].get("rewards") or {}).get("arms", {}).get("rlhf-nb", {}).get("reps") or []
    if rw and "error" not in rw[0]:
        r = rw[0]
        other.append(f"| RewardManager, 10,000 GSM8K completions | {fmt(r.get('reward_manager_completions_per_s'))} "
                     f"completions/s ({fmt(r.get('reward_manager.best_s'))} s) |")
        other.append(f"| math-verify (MATH500 answer vs boxed solution, main thread) | {fmt(r.get('math_verify_calls_per_s'))} calls/s |")
    g = (results["benches"].get("gpu") or {}).get("arms", {})
    for label, a in g.items():
        for r in a.get("reps", [])[:1]:
            if "error" in r or r.get("dry_run"): continue
            other.append(f"| 0.5B shape on {r['device']} (bf16) | generation {fmt(r['gen_tok_per_s'])} tok/s, training "
                         f"{fmt(r['train_tok_per_s'])} tok/s, step {fmt(r['train_step_s'])} s, peak "
                         f"{fmt(r['peak_gpu_mem_gb'])} GiB, MFU {fmt(r['mfu'])} |")
    if other: L += ["", "| other figures | value |", "|---|---|"] + other
    return "\n".join(L)


def update_readme(results, path=BENCH / "README.md"):
    "Replace the block between the ratios markers of bench/README.md with the latest ratios table."
    if not path.exists(): return
    text = path.read_text()
    a, b = "<!-- ratios:start -->", "<!-- ratios:end -->"
    if a not in text or b not in text: return
    new = text[: text.index(a) + len(a)] + "\n" + ratios_table(results) + "\n" + text[text.index(b):]
    tmp = path.with_suffix(".md.tmp"); tmp.write_text(new); os.replace(tmp, path)


def write_json(results):
    tmp = RESULTS_JSON.with_suffix(".json.tmp"); tmp.write_text(json.dumps(results, indent=1, default=float)); os.replace(tmp, RESULTS_JSON)


# ----------------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions/rounds, no accuracy arm (< 10 min)")
    ap.add_argument("--gpu", action="store_true", help="only the GPU bench (0.5B-shaped model, bf16); skips without CUDA")
    ap.add_argument("--dry_run", action="store_true", help="with --gpu: a small shape on CPU to test the logic")
    ap.add_argument("--only", action="append", default=None, choices=sorted(BENCHES), help="run only these benches")
    ap.add_argument("--reps", type=int, default=None, help="A/B repetitions (default 2 quick, 4 full)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per arm (<= 2 on the shared CPU)")
    ap.add_argument("--lr", type=float, default=1e-5, help="learning rate used by both sides")
    ap.add_argument("--budget", type=float, default=560, help="--quick: skip the benches without ratios that would end past this many seconds")
    ap.add_argument("--prepare_sft", action="store_true", help="only build (or check) the cached SFT start, then exit")
    ap.add_argument("--acc_lr", type=float, default=None, help="GRPO accuracy arm: lr of both sides (default: run.ACC_LR's per size, else GRPOConfig's)")
    ap.add_argument("--acc_updates", type=int, default=None, help="GRPO accuracy arm: updates per generation (default: GRPOConfig's num_ppo_epochs)")
    ap.add_argument("--acc_seconds", type=float, default=150.0, help="GRPO accuracy arm: wall seconds of RL per side")
    ap.add_argument("--n_eval", type=int, default=300, help="GRPO accuracy arm: held-out prompts")
    ap.add_argument("--sft", dest="use_sft", action="store_true", default=None, help="start timing arms from the SFT checkpoint (default in the full mode)")
    ap.add_argument("--sft_seconds", type=float, default=None, help="time limit of the SFT warm start (made once per size, "
                                                                    "cached; default per size: common.SFT_SECONDS)")
    ap.add_argument("--peak_tflops", type=float, default=None, help="--gpu: override the assumed peak bf16 TFLOP/s")
    ap.add_argument("--out", default=None, help="write results here instead of bench/ (json; md/png beside it)")
    ap.add_argument("--sizes", default="demo", help=f"grpo/ppo/dpo at these model sizes, comma-separated: {', '.join(C.SIZES)} or all")
    ap.add_argument("--precision", default="fp32", help="grpo/ppo/dpo in these precisions, comma-separated: fp32, bf16 or all "
                                                        "(bf16: both sides autocast to bfloat16 on the CPU)")
    a = ap.parse_args(argv)
    a.sizes = list(C.SIZES) if a.sizes == "all" else [x.strip() for x in a.sizes.split(",") if x.strip()]
    a.precisions = ["fp32", "bf16"] if a.precision == "all" else [x.strip() for x in a.precision.split(",") if x.strip()]
    bad = [x for x in a.sizes if x not in C.SIZES] + [x for x in a.precisions if x not in ("fp32", "bf16")]
    if bad: ap.error(f"unknown size or precision {bad}: sizes are {', '.join(C.SIZES)}, precisions fp32, bf16")
    if a.reps is None: a.reps = 2 if a.quick else 4
    if a.use_sft is None: a.use_sft = not a.quick and not a.gpu      # full mode: timing arms start from the SFT policy
    if a.dry_run and not a.gpu: ap.error("--dry_run only applies with --gpu")
    return a


def _has_cuda():
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True)
    return r.stdout.strip() == "True"


SCALED = ("grpo", "ppo", "dpo", "grpo_accuracy")      # the benches that run at every --sizes x --precision


def plan(names, sizes, precisions):
    """[(result key, bench, size, precision)] for `names`: the scaled benches once per size and precision, keyed
    `bench@size/precision` except demo/fp32, which keeps the bare name so older results still compare; the others once."""
    jobs = [(n if (sz, pr) == ("demo", "fp32") else f"{n}@{sz}/{pr}", n, sz, pr)
            for n in names if n in SCALED for sz in sizes for pr in precisions]
    return jobs + [(n, n, None, None) for n in names if n not in SCALED]


def sft_start(a, size="demo"):
    """Path of the SFT start at `size` (rlhf_nb.sft.sft_warm_start with the shape and settings of C.sft_kwargs(size),
    cached in C.sft_dir(size); sft_warm_start itself rebuilds a cache made with other settings). Sets a.sft_info[size]."""
    f = C.nb("sft", "sft_warm_start")
    if f is None: return None
    path, kw = C.sft_dir(size), C.sft_kwargs(size)
    secs = a.sft_seconds or C.SFT_SECONDS[size]
    log(f"SFT warm start ({size}) -> {path} (reused when present)")
    info = path / "sft_info.json"
    if info.exists() and not json.loads(info.read_text()).get("reached_target"):
        log(f"the cached SFT start {path} missed its accuracy target (made under load?); making a new one")
        shutil.rmtree(path)
    code = (f"import sys, json; sys.path.insert(0, {str(BENCH)!r}); import common as C; C.set_threads({a.threads});"
            f"from rlhf_nb.sft import sft_warm_start; print(sft_warm_start({str(path)!r}, seed=0, "
            f"max_seconds={secs}, progress=False, **json.loads({json.dumps(kw)!r})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=arm_env(a.threads),
                       timeout=secs + 300)
    if r.returncode != 0:
        log("SFT warm start failed:", r.stderr.strip()[-600:]); return None
    if info.exists():
        d = json.loads(info.read_text())
        a.sft_info = {**(a.sft_info or {}), size: {k: d.get(k) for k in ("reached_target", "final_accuracy", "eval_accuracy",
                                                                         "steps", "train_seconds", "learning_rate")}}
        log(f"SFT start ({size}): {a.sft_info[size]}")
    return r.stdout.strip().splitlines()[-1]


def main(argv=None):
    a = parse_args(argv)
    global RESULTS_JSON, RESULTS_MD, RESULTS_PNG
    if a.out:
        RESULTS_JSON = Path(a.out); RESULTS_MD = RESULTS_JSON.with_suffix(".md"); RESULTS_PNG = RESULTS_JSON.with_suffix(".png")
    C.WORK.mkdir(parents=True, exist_ok=True)
    if a.gpu and not a.dry_run and not _has_cuda():
        log("no CUDA device here: --gpu skipped, results untouched (use --gpu --dry_run to test the logic on CPU)")
        return 0
    if a.prepare_sft:
        a.sft_info = None
        paths = {sz: sft_start(a, sz) for sz in a.sizes}
        log(f"SFT start(s): {paths}"); return 0 if all(paths.values()) else 1
    if a.gpu: names = ["gpu"]
    elif a.only: names = a.only
    else:
        names = ["grpo", "ppo", "dpo", "ref_strategies", "rewards"] + ([] if a.quick else ["ppo_shared", "grpo_accuracy"])
        if not a.quick: log("the full run takes over 10 minutes here; on the shared machine run it in parts with --only "
                            "(see bench/README.md)")
    if a.quick and "grpo_accuracy" in names: sys.exit("grpo_accuracy runs in the full mode only (drop --quick)")
    a.init_path, a.sft_path, a.sft_info, a.sft_paths = None, None, None, {}
    if a.use_sft:
        a.sft_path = a.sft_paths["demo"] = sft_start(a)
        a.init_path = a.sft_path
    if "grpo_accuracy" in names:                # the accuracy race starts from an SFT start made at its own size
        for sz in a.sizes:
            if sz not in a.sft_paths: a.sft_paths[sz] = sft_start(a, sz)
    t_start = time.time()
    before, up_before = C.load_avg(), C.uptime_line()
    log(f"load before: {up_before}")
    cmd = "python bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    benches, a.peaks = {}, None
    jobs = plan(names, a.sizes, a.precisions)
    with open(C.WORK / "arms.log", "a") as logf:
        if any(sz and n != "grpo_accuracy" for _, n, sz, _ in jobs):      # MFU's denominator, measured in this run, before the arms
            a.peaks = run_arm("matmul_peak", {"threads": a.threads}, logf=logf)
            log(f"measured matmul peak ({a.threads} threads): " + ", ".join(f"{k} {v:.0f}" for k, v in a.peaks.items()
                                                                             if isinstance(v, float) and k.endswith("gflops")))
        for key, n, size, prec in jobs:
            t0 = time.time(); lb = C.load_avg()
            est = {"ref_strategies": 40, "rewards": 90}.get(n)
            if a.quick and est and t0 - t_start + est > a.budget:
                res = {"skipped": f"--quick time budget ({a.budget:.0f} s) reached under load {lb and round(lb[0], 1)}; "
                                  f"run it alone with --only {n}", "arms": {}}
                log(f"{n}: skipped ({res['skipped']})")
            elif n == "grpo_accuracy" and not a.sft_paths.get(size):
                res = {"skipped": f"no SFT start at size {size}: rlhf_nb.sft.sft_warm_start is not available or failed "
                                  f"(see the log above)", "arms": {}}
            elif size is not None:
                res = BENCHES[n](a, logf, size=size, precision=prec)
            else:
                res = BENCHES[n](a, logf)
            res.update(date=datetime.datetime.now().isoformat(timespec="seconds"), seconds=round(time.time() - t0, 1),
                       load_before=lb and round(lb[0], 2), load_after=round((C.load_avg() or [0])[0], 2),
                       mode=("gpu-dry_run" if a.dry_run else "gpu") if a.gpu else ("quick" if a.quick else "full"),
                       init=(res.get("sft_path") or a.init_path or "random init"))
            res.setdefault("reps", a.reps)
            benches[key] = res
            log(f"{key}: done in {res['seconds']} s" + "".join(f"; ratio {k} = {v:.3f}" for k, v in (res.get("ratios") or {}).items()))
    after, up_after = C.load_avg(), C.uptime_line()
    log(f"load after: {up_after}")
    results = {}
    if RESULTS_JSON.exists():          # every run updates its own benches in the last results (each bench says its mode/date)
        try: results = json.loads(RESULTS_JSON.read_text())
        except Exception: results = {}
    prev = results.get("benches", {})
    results.update(
        date=datetime.datetime.now().isoformat(timespec="seconds"), command=cmd,
        mode=("gpu-dry_run" if a.dry_run else "gpu") if a.gpu else ("quick" if a.quick else "full"),
        machine=C.machine(), versions=C.versions(), versions_trl112=C.versions(str(PY112)) if PY112.exists() else None,
        settings={"threads": a.threads, "omp_wait_policy": arm_env(a.threads)["OMP_WAIT_POLICY"], "reps": a.reps,
                  "lr": a.lr, "init": a.init_path or "random init (seed 0)", "sft_start": a.sft_info,
                  "stand_ins": stand_ins()},
        uptime_before=up_before, uptime_after=up_after, load_before_1m=before and round(before[0], 2),
        load_after_1m=after and round(after[0], 2), wall_seconds=round(time.time() - t_start, 1),
        benches={**prev, **benches}, peak_gflops=a.peaks or results.get("peak_gflops"))
    write_json(results); write_md(results); write_png(results)
    if not a.out and results["mode"] in ("full", "quick") and not a.gpu: update_readme(results)
    log(f"wrote {RESULTS_JSON}, {RESULTS_MD.name}, {RESULTS_PNG.name} in {results['wall_seconds']} s")
    print()
    failed = []
    for n, b in benches.items():
        if b.get("error"): print(f"  {n:15s} ERROR: {b['error']}"); failed.append(n)
        elif b.get("target") and not b.get("ratios"): print(f"  {n:15s} ERROR: no ratio (an arm failed)"); failed.append(n)
        for met, d in (b.get("differences") or {}).items():
            print(f"  {n:15s} {met:22s} rlhf-nb - TRL = {100 * d:+.1f} points")
        for met, r in (b.get("ratios") or {}).items():
            t = (b.get("target") or {}).get(met)
            print(f"  {n:15s} {met:22s} rlhf-nb/TRL = {r:6.3f}" + (f"   (target <= {t}: {'met' if r <= t else 'NOT met'})" if t else ""))
        if b.get("skipped"): print(f"  {n:15s} skipped: {b['skipped']}")
        for label, arm in b.get("arms", {}).items():
            if arm.get("unavailable"): print(f"  {n:15s} {label}: not measured ({arm['unavailable']})")
            if arm.get("errors"): print(f"  {n:15s} {label}: ERROR {arm['errors'][0].splitlines()[-1][:200]}")
    if failed: log(f"{len(failed)} comparison(s) have no result: {', '.join(failed)} (see above); exit status 1")
    return 1 if failed else 0


def stand_ins():
    "Which names the bench needs from rlhf_nb are not defined yet (read from the module sources, nothing imported)."
    import ast
    need = {"models": ["char_tokenizer", "tiny_causal_lm", "tiny_value_model"], "arith": ["make_arith"], "dataset": ["to_trl_grpo", "to_trl_dpo"],
            "rewards": ["compute_score", "trl_reward_func", "RewardManager"], "sft": ["sft_warm_start", "greedy_accuracy"],
            "ppo": ["PPOConfig"], "algos": ["GRPOConfig", "rl_trainer_class"], "dpo": ["DPOConfig", "DPOLoop"]}
    missing = {}
    for mod, names in need.items():
        path = C.REPO / "rlhf_nb" / f"{mod}.py"
        defined = set()
        if path.exists():
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)): defined.add(node.name)
                elif isinstance(node, ast.Assign): defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                elif isinstance(node, (ast.ImportFrom, ast.Import)): defined |= {(n.asname or n.name).split(".")[0] for n in node.names}
        gone = [n for n in names if n not in defined]
        if gone: missing[mod] = gone
    return missing


if __name__ == "__main__":
    sys.exit(main())

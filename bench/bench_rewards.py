"""Reward throughput: RewardManager on 10,000 GSM8K-style completions, and math-verify checks per second.

    python bench/bench_rewards.py [--quick] [--n 10000] [--out bench/results_rewards.json]

What is timed:
- `RewardManager.__call__` on one batch of N tokenized completions (decode + strict GSM8K grading + placing each score on
  the last valid token + metrics). Completions are real GSM8K reference solutions (../shared/data) with their own truth for
  half and a wrong truth for the other half; a synthetic stand-in is used when the data folder is absent. Tokenizing the
  batch is set-up, not timed. Best and median wall time of `repeats` runs, and the best process CPU time (on a shared,
  oversubscribed machine the CPU time is what the wall time would be on an idle core; quote `load_before` with both).
- math-verify: `guarded_verify(answer, boxed_solution)` over MATH500 (every call goes through sympy, no string shortcut),
  on the main thread (in-process timer) and with `isolation="process"` (worker subprocess, as off the main thread);
  plus `math_score` end to end (where the exact-match shortcut applies).
Writes the JSON atomically to --out and prints it as the last line. `run_bench(quick)` returns the same dict.
"""
from __future__ import annotations
import os, sys, json, time, random, statistics, platform, tempfile, argparse, logging
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DATA = REPO.parent / "shared" / "data"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _load():
    "Host load (1, 5, 15 min) as uptime shows it."
    try: return list(os.getloadavg())
    except OSError: return None


def gsm8k_completions(n, seed=0):
    "n (completion, ground_truth) pairs: GSM8K reference solutions, half paired with a wrong truth."
    rng = random.Random(seed)
    path = DATA / "gsm8k" / "train.jsonl"
    if path.exists():
        recs = [json.loads(l) for l in open(path)]
        src = "gsm8k/train.jsonl reference solutions"
    else:
        recs = []
        for i in range(1000):
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            recs.append({"answer": f"She has {a} apples and buys {b} more, so {a} + {b} = <<{a}+{b}={a+b}>>{a+b}.\n#### {a+b}"})
        src = "synthetic GSM8K-style solutions (shared data absent)"
    out = []
    for i in range(n):
        r = recs[i % len(recs)]
        truth = r["answer"].split("####")[-1].strip().replace(",", "")
        if i % 2: truth = str(int(float(truth)) + 1)
        out.append((r["answer"], truth))
    return out, src


def bench_reward_manager(n=10_000, repeats=3):
    import torch
    torch.set_num_threads(1)
    from rlhf_nb.models import char_tokenizer
    from rlhf_nb.rewards import RewardManager
    tok = char_tokenizer()
    pairs, src = gsm8k_completions(n)
    enc = tok([c for c, _ in pairs], add_special_tokens=False, verbose=False)["input_ids"]
    R = max(len(e) for e in enc) + 1
    responses = torch.full((n, R), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, R), dtype=torch.long)
    for i, e in enumerate(enc):
        e = e + [tok.eos_token_id]
        responses[i, :len(e)] = torch.tensor(e); mask[i, :len(e)] = 1
    batch = dict(responses=responses, response_mask=mask, data_source=["openai/gsm8k"] * n,
                 reward_model=[{"style": "rule", "ground_truth": t} for _, t in pairs], extra_info=[{"index": i} for i in range(n)])
    rm = RewardManager(tok)
    times, cpu, mean = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        scores, metrics = rm(batch)
        times.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
        mean = metrics["reward/mean"]
    # where the time goes (one run): decoding vs grading
    t0 = time.perf_counter(); texts = rm.decode_responses(responses, mask); t_decode = time.perf_counter() - t0
    return {"n_completions": n, "response_len_tokens": R, "mean_tokens": float(mask.sum(1).float().mean()),
            "completions_from": src, "best_s": min(times), "median_s": statistics.median(times),
            "cpu_s_best": min(cpu),   # CPU time of this process: what the wall time would be on an idle core
            "completions_per_s": n / min(times), "decode_s": t_decode, "reward_mean": mean, "repeats": repeats}


def bench_math_verify(n=500, quick=False):
    from rlhf_nb.data import last_boxed
    from rlhf_nb.equivalence import guarded_verify, VERIFY_POOL
    from rlhf_nb.rewards import math_score
    path = DATA / "math" / "math500_test.jsonl"
    if path.exists():
        recs = [json.loads(l) for l in open(path)]
        pairs = [(r["answer"], last_boxed(r["solution"])) for r in recs]
        sols = [(r["solution"], r["answer"]) for r in recs]
        src = "MATH500 answer vs boxed reference solution"
    else:
        pairs = [(r"\frac{%d}{%d}" % (i, i + 1), "%d/%d" % (i, i + 1)) for i in range(1, 200)]
        sols = [(r"so \boxed{%s}" % p, g) for g, p in pairs]
        src = "synthetic fraction pairs (shared data absent)"
    if quick: pairs, sols = pairs[:100], sols[:100]
    out = {"from": src, "n": len(pairs)}
    t0 = time.perf_counter(); ok = sum(guarded_verify(g, p)[0] for g, p in pairs); dt = time.perf_counter() - t0
    out["main_thread"] = {"calls_per_s": len(pairs) / dt, "seconds": dt, "equal": ok}
    VERIFY_POOL.warm(1)
    t0 = time.perf_counter(); ok = sum(guarded_verify(g, p, isolation="process")[0] for g, p in pairs); dt = time.perf_counter() - t0
    out["worker_process"] = {"calls_per_s": len(pairs) / dt, "seconds": dt, "equal": ok}
    t0 = time.perf_counter(); ok = sum(math_score(s, a) for s, a in sols); dt = time.perf_counter() - t0
    out["math_score_end_to_end"] = {"calls_per_s": len(sols) / dt, "seconds": dt, "score_sum": ok,
                                     "note": "references match their answer string, so the exact-match shortcut decides all"}
    t0 = time.perf_counter(); r = guarded_verify("1", r"9^{9^{9^{9}}}", timeout_seconds=1.0); dt = time.perf_counter() - t0
    out["pathological_1s_limit"] = {"seconds": dt, "status": r[1]}
    VERIFY_POOL.shutdown()
    return out


def run_bench(quick=False, n=None, out=None):
    "Run both benchmarks; write the JSON result atomically to `out` (default bench/results_rewards.json) and return it."
    import torch
    n = n or (2_000 if quick else 10_000)
    res = {"bench": "rewards", "quick": quick, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "machine": {"cpus": os.cpu_count(), "load_before": _load(), "python": platform.python_version(),
                       "torch": torch.__version__, "torch_threads": 1}}
    res["reward_manager"] = bench_reward_manager(n, repeats=2 if quick else 3)
    res["math_verify"] = bench_math_verify(quick=quick)
    res["machine"]["load_after"] = _load()
    res["target"] = {"reward_manager_10k_s": 2.0,
                     "met_wall": res["reward_manager"]["best_s"] * (10_000 / n) < 2.0,
                     "met_cpu": res["reward_manager"]["cpu_s_best"] * (10_000 / n) < 2.0}
    out = Path(out or BENCH_DIR / "results_rewards.json")
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".results_rewards.", suffix=".json")
    with os.fdopen(fd, "w") as f: json.dump(res, f, indent=1)
    os.replace(tmp, out)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 completions and 100 math-verify pairs")
    ap.add_argument("--n", type=int, default=None, help="number of completions (default 10,000)")
    ap.add_argument("--out", default=None, help="result file (default bench/results_rewards.json)")
    a = ap.parse_args()
    print(json.dumps(run_bench(a.quick, a.n, a.out)))

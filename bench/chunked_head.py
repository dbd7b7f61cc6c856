"""Peak memory and time of the sampled tokens' log-probs (+ entropy as a metric) from final hidden states and an LM head:
the plain path (`head(hidden)` then `core.logprobs_and_entropy`) against `rlhf_nb.chunked_head.lm_head_logprobs`, forward
and backward, at vocabularies of 32k and 151k. Each (path, vocab) runs in a fresh process; peak memory is the rise of
the process's peak RSS (VmHWM) over its RSS once the inputs exist, so it counts what the computation itself allocates.

Small by default (a shared CPU); the 0.5B shape at the trainer's size:
    python bench/chunked_head.py --hidden 896 --tokens 8192 --chunk 1024 --reps 3
Writes bench/results_chunked_head.{json,md}."""
from __future__ import annotations
import argparse, json, shlex, subprocess, sys, time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))                                  # rlhf_nb from this checkout
TAG = "@@CHUNKED_HEAD "


def _rss_mb():
    "(current RSS, peak RSS) of this process in MB, from /proc/self/status."
    vals = {l.split(":")[0]: int(l.split()[1]) / 1024 for l in Path("/proc/self/status").read_text().splitlines()
            if l.startswith(("VmRSS:", "VmHWM:"))}
    return vals["VmRSS"], vals["VmHWM"]


def arm(path, vocab, hidden, tokens, chunk, reps, threads, seed=0):
    "One (path, vocab) measurement in this process -> dict: peak MB above the inputs, median seconds of fwd+bwd."
    import torch, torch.nn as nn
    from rlhf_nb.core import logprobs_and_entropy
    from rlhf_nb.chunked_head import lm_head_logprobs
    torch.set_num_threads(threads); torch.manual_seed(seed)
    head = nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(tokens, hidden, requires_grad=True)
    y = torch.randint(0, vocab, (tokens,))
    def step():
        if path == "plain": lp, ent = logprobs_and_entropy(head(h), y)
        else: lp, ent = lm_head_logprobs(h, head, y, chunk_size=chunk)
        lp.sum().backward()
        out = float(lp.detach().sum()), float(ent.mean())
        h.grad = None; head.weight.grad = None
        return out
    base, _ = _rss_mb()
    times, value = [], None
    for _ in range(reps):
        t0 = time.perf_counter(); value = step(); times.append(time.perf_counter() - t0)
    _, peak = _rss_mb()
    return {"path": path, "vocab": vocab, "peak_mb": peak - base, "seconds": sorted(times)[len(times) // 2],
            "lp_sum": value[0], "entropy_mean": value[1]}


def run_arm(path, vocab, a):
    "The arm in a fresh interpreter (its own peak RSS) -> its dict."
    cmd = [sys.executable, __file__, "--_arm", path, "--vocab", str(vocab), "--hidden", str(a.hidden), "--tokens",
           str(a.tokens), "--chunk", str(a.chunk), "--reps", str(a.reps), "--threads", str(a.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    return json.loads(next(l for l in out.splitlines() if l.startswith(TAG))[len(TAG):])


def report(res):
    "The markdown table of a results dict."
    a = res["args"]
    lines = [f"# Chunked LM head: peak memory and time (fwd+bwd)", "",
             f"hidden {a['hidden']}, {a['tokens']} tokens, chunk {a['chunk']}, {a['threads']} threads, median of "
             f"{a['reps']}; peak = rise of peak RSS over the inputs.", "",
             "| vocab | plain peak MB | chunked peak MB | peak ratio | plain s | chunked s | time ratio | max abs lp diff |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['vocab']} | {r['plain_peak_mb']:.0f} | {r['chunked_peak_mb']:.0f} | {r['peak_ratio']:.2f} | "
                     f"{r['plain_s']:.3f} | {r['chunked_s']:.3f} | {r['time_ratio']:.2f} | {r['lp_sum_diff']:.2e} |")
    if res.get("command"): lines += ["", f"Command: `{res['command']}`"]
    if res.get("note"): lines += ["", res["note"]]
    return "\n".join(lines) + "\n"


def _fit_note(rows, a):
    "How much memory the plain path needs per token (measured here) and what the trainer's full size would need."
    v = max(rows, key=lambda r: r["vocab"])
    per_tok = v["plain_peak_mb"] / a.tokens
    return (f"The plain path's peak grows as {per_tok:.3f} MB per token at vocab {v['vocab']} "
            f"({per_tok * 2**20 / (4 * v['vocab']):.1f} float32 [T, V] tensors alive at once): "
            f"{per_tok * 8192 / 1024:.1f} GB at 8192 tokens.")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(BENCH / "results_chunked_head"))
    p.add_argument("--_arm", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._arm:
        print(TAG + json.dumps(arm(a._arm, a.vocab[0], a.hidden, a.tokens, a.chunk, a.reps, a.threads)), flush=True)
        return
    rows = []
    for v in a.vocab:
        pl, ch = run_arm("plain", v, a), run_arm("chunked", v, a)
        rows.append({"vocab": v, "plain_peak_mb": pl["peak_mb"], "chunked_peak_mb": ch["peak_mb"],
                     "peak_ratio": ch["peak_mb"] / max(pl["peak_mb"], 1e-9), "plain_s": pl["seconds"],
                     "chunked_s": ch["seconds"], "time_ratio": ch["seconds"] / pl["seconds"],
                     "lp_sum_diff": abs(pl["lp_sum"] - ch["lp_sum"])})
    res = {"args": {k: v for k, v in vars(a).items() if not k.startswith("_") and k != "out"}, "rows": rows,
           "command": "python bench/chunked_head.py " + shlex.join(sys.argv[1:] if argv is None else argv),
           "note": _fit_note(rows, a)}
    Path(a.out + ".json").write_text(json.dumps(res, indent=1) + "\n")
    Path(a.out + ".md").write_text(report(res))
    print(report(res))


if __name__ == "__main__":
    main()

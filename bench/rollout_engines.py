"""Rollout engines side by side: `hf` (transformers' generate) and `vllm` (colocated), on this machine, in one run.

    tools/vllm_env.sh                                   # once: the interpreter that has vLLM (its last line)
    $VLLM_PY bench/rollout_engines.py                   # step split + sync times (demo, 33.6M, 0.5B shape)
    $VLLM_PY bench/rollout_engines.py --curve           # learning curve: GRPO on arithmetic from the SFT start, hf vs vllm

Both engines run in the same interpreter (the vLLM virtualenv, transformers 5.19) so their ratios come from one run.
Each arm is a fresh process (`--arm JSON`). The step arms run the CLI's trainer (`bench/throughput.py`'s `rl_throughput`,
GRPO, ParityReward, random init) and report the mean over the timed steps (the first is warm-up) of the step's parts:
generate (`time/rollout`), sync (`time/sync`), train (old/ref log-probs + update). The sync arms time `update_weights`
alone, colocated (vLLM's in-place reload) and through a server (HTTP transfer + reload), median of 3, by model size.
Results: bench/results_rollout.json and bench/results_rollout.md."""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Work per step: prompts x completions x new tokens (smaller for the 0.5B shape, whose fp32 step takes tens of seconds here)
WORK = {"demo": (16, 8, 16), "33.6M": (16, 8, 16), "0.5B": (4, 4, 16)}


def shape(size, vocab):
    "Qwen2Config fields of a bench size (the 0.5B shape with the character vocabulary: 358M parameters)."
    import common as C
    from throughput import QWEN25_05B_SHAPE
    if size == "0.5B": return {**QWEN25_05B_SHAPE, "vocab_size": vocab, "max_position_embeddings": 512}
    base = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, tie_word_embeddings=True)
    return {**base, **(C.SIZES[size] or {}), "vocab_size": vocab}


def step_arm(size, engine, bf16, steps):
    from throughput import rl_throughput
    from rlhf_nb.models import char_tokenizer
    import torch
    torch.set_num_threads(2)
    P, G, R = WORK[size]
    r = rl_throughput("grpo", shape(size, len(char_tokenizer())), steps=steps, warmup_steps=1, prompts_per_step=P, num_generations=G,
                      max_completion_length=R, bf16=bf16, rollout_engine=engine, filter_groups=False, parallel_roles="off")
    r["train_s"] = r["logprobs_s"] + r["update_s"]
    return r


def sync_arm(size, mode, reps=3):
    "Seconds of one update_weights of a `size` policy into a vLLM engine (colocate or server), median of `reps`."
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from rlhf_nb.models import char_tokenizer
    from rlhf_nb.rollout import VLLMEngine, VLLMServerEngine, checkpoint_weights, save_for_engine
    torch.set_num_threads(2)
    tok = char_tokenizer()
    model = Qwen2ForCausalLM(Qwen2Config(**shape(size, len(tok)), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    folder = save_for_engine(model, tok, Path(tempfile.mkdtemp(prefix="bench_sync_")) / "m")
    eng = (VLLMEngine(folder, tok.eos_token_id, tok.pad_token_id, max_model_len=256) if mode == "colocate" else
           VLLMServerEngine.start(folder, tok.eos_token_id, tok.pad_token_id, python=sys.executable, max_model_len=256))
    try:
        times = []
        for v in range(reps):
            with torch.no_grad():
                for p in model.parameters(): p.add_(1e-3)
            with checkpoint_weights(model) as w: times.append(eng.update_weights(w, v + 1))
    finally: eng.shutdown()
    n = sum(p.numel() for p in model.parameters())
    return {"size": size, "mode": mode, "n_params": n, "mbytes": 4 * n / 2**20, "sync_s": statistics.median(times), "all_s": times}


def curve_arm(engine, steps, seed, sft_dir):
    "GRPO on arithmetic from the cached SFT start, `steps` steps: held-out greedy accuracy at the end."
    import torch
    from rlhf_nb.algos import GRPOConfig, rl_trainer_class
    torch.set_num_threads(2)
    cfg = GRPOConfig(model_name_or_path=sft_dir, rollout_engine=engine, max_steps=steps, eval_steps=steps, seed=seed,
                     output_dir=tempfile.mkdtemp(prefix=f"bench_curve_{engine}_"), disable_tqdm=True, save_final=False)
    hist = rl_trainer_class(cfg)(cfg).fit()
    evals = [(h["step"], h["eval/accuracy"]) for h in hist if "eval/accuracy" in h]
    return {"engine": engine, "seed": seed, "steps": steps, "evals": evals, "final": evals[-1][1],
            "seconds": hist[-1].get("time/elapsed")}


def run_arm(kind, **kw):
    "One arm in a fresh process -> its JSON line."
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
    r = subprocess.run([sys.executable, __file__, "--arm", json.dumps({"kind": kind, **kw})], capture_output=True, text=True, env=env,
                       timeout=3600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("ARM ")]
    if r.returncode or not lines: raise RuntimeError(f"arm {kind} {kw} failed:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][4:])


def table(rows, cols):
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    for r in rows: out.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm"); ap.add_argument("--sizes", default="demo,33.6M,0.5B"); ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--curve", action="store_true"); ap.add_argument("--curve_steps", type=int, default=60)
    ap.add_argument("--seeds", default="0,1"); ap.add_argument("--out", default=str(HERE / "results_rollout.json"))
    ap.add_argument("--report", action="store_true", help="only rewrite the .md from the .json")
    a = ap.parse_args()
    if a.arm:
        spec = json.loads(a.arm); kind = spec.pop("kind")
        print("ARM " + json.dumps({"step": step_arm, "sync": sync_arm, "curve": curve_arm}[kind](**spec)), flush=True); return
    out_path = Path(a.out)
    res = json.loads(out_path.read_text()) if out_path.exists() else {}
    if a.report: return report(res, out_path)
    import torch, vllm
    res["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__, "vllm": vllm.__version__,
                      "load_before": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M")}
    if a.curve:
        from rlhf_nb.sft import sft_warm_start
        sft = sft_warm_start(str(HERE / "_work/sft_arith"), seed=0, progress=False)
        rows = [run_arm("curve", engine=e, steps=a.curve_steps, seed=int(s), sft_dir=str(sft)) for s in a.seeds.split(",") for e in ("hf", "vllm")]
        new = {(r["engine"], r["seed"]) for r in rows}
        res["curve"] = sorted([c for c in res.get("curve", []) if (c["engine"], c["seed"]) not in new] + rows, key=lambda c: (c["seed"], c["engine"]))
    else:
        steps, syncs = [], []
        for size in a.sizes.split(","):
            for bf16 in ([False, True] if size == "0.5B" else [False]):
                for engine in ("hf", "vllm"):
                    r = run_arm("step", size=size, engine=engine, bf16=bf16, steps=a.steps)
                    steps.append({"size": size, "engine": engine, "dtype": r["dtype"], "n_params": r["n_params"],
                                  **{k: round(r[k], 3) for k in ("step_s", "rollout_s", "train_s") if r.get(k) is not None},
                                  "sync_s": round(r["sync_s"], 4) if r.get("sync_s") is not None else None,
                                  "gen_tokens_per_s": round(r["gen_tokens_per_s"], 1)})
                    print(steps[-1], flush=True)
            for mode in ("colocate", "server"):
                syncs.append(run_arm("sync", size=size, mode=mode)); print(syncs[-1], flush=True)
        res["steps"], res["sync"] = steps, syncs
    res["machine"]["load_after"] = os.getloadavg()[0]
    out_path.write_text(json.dumps(res, indent=1))
    report(res, out_path)


def report(res, out_path):
    "bench/results_rollout.md from the results."
    md = [f"# Rollout engines on this machine ({res['machine']['date']}, {res['machine']['cpus']} CPUs, vLLM {res['machine']['vllm']})", ""]
    if res.get("steps"):
        for r in res["steps"]:
            base = next((b for b in res["steps"] if b["size"] == r["size"] and b["dtype"] == r["dtype"] and b["engine"] == "hf"), None)
            r["step_vs_hf"] = round(r["step_s"] / base["step_s"], 2) if base else ""
        md += ["## One GRPO step: generate / sync / train (seconds, mean of the timed steps)", "",
               f"Load average before / after: {res['machine'].get('load_before', 0):.2f} / {res['machine'].get('load_after', 0):.2f}. "
               "Work per step: demo and 33.6M 16 prompts x 8 completions x 16 tokens, 0.5B shape 4 x 4 x 16.", "",
               table(res["steps"], ["size", "n_params", "dtype", "engine", "step_s", "rollout_s", "sync_s", "train_s", "gen_tokens_per_s", "step_vs_hf"]), ""]
    if res.get("sync"):
        md += ["## Weight sync against model size (median of 3)", "", table(res["sync"], ["size", "n_params", "mbytes", "mode", "sync_s"]), ""]
    if res.get("curve"):
        means = []
        for e in ("hf", "vllm"):
            f = [c["final"] for c in res["curve"] if c["engine"] == e]
            if f: means.append({"engine": e, "seed": f"mean of {len(f)}", "steps": res["curve"][0]["steps"], "final": statistics.mean(f),
                                "seconds": statistics.mean(c["seconds"] for c in res["curve"] if c["engine"] == e)})
        md += ["## Learning curve: GRPO on arithmetic from the SFT start, held-out greedy accuracy (256 prompts)", "",
               table(res["curve"] + means, ["engine", "seed", "steps", "final", "seconds"]), ""]
    out_path.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__": main()

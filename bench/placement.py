"""Seconds per PPO update under each placement: colocate (one process), ray split (actor+rollout+ref on one pool,
critic on another; the driver separate) and FSDP2 over 2 accelerate processes, on the tiny model and on a 33M-parameter
model (hidden 512, 8 layers). Short runs (a few steps) through the `rlhf-nb` entry point, one fresh set of processes
per arm; the machine is shared with other jobs, so read the numbers as a snapshot, with the load written beside them.

    python bench/placement.py                 # both sizes, 3 steps each
    python bench/placement.py --sizes tiny --steps 2

Writes bench/results_placement.json and bench/results_placement.md. Reported per arm: median over the steps after
the first of `time/update` (the PPO update: actor and critic epochs), `time/step`, and for Ray `time/ray_overhead`
(step time minus the longest worker time of each phase: serialisation, scheduling, driver work), plus the peak RSS
of the process that wrote summary.json (the single process, rank 0, or the Ray driver)."""
import argparse, json, os, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "placement"
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_CPU"): ENV.pop(k, None)
SPLIT = ["--placement", "ray", "--resource_pools", "actor_pool=1,critic_pool=1", "--role_pools", "ActorRolloutRef=actor_pool,Critic=critic_pool"]
ARMS = {"colocate": [], "ray_split": SPLIT,
        "fsdp2_x2": ["--placement", "accelerate", "--accelerate_config", "configs/accelerate/fsdp_cpu.yaml", "--num_processes", "2"]}


def model_33m():
    "A Qwen2 policy with hidden 512 and 8 layers (~33M parameters) saved once under bench/_work."
    out = WORK / "qwen2_33m"
    if not (out / "config.json").exists():
        from rlhf_nb.models import char_tokenizer, tiny_causal_lm
        tok = char_tokenizer()
        m = tiny_causal_lm(tok, seed=0, hidden_size=512, num_hidden_layers=8, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8)
        m.save_pretrained(out); tok.save_pretrained(out)
    return str(out)


def arm(name, size, steps):
    out = WORK / f"{size}_{name}"
    subprocess.run(["rm", "-rf", str(out)])
    model = "tiny" if size == "tiny" else model_33m()
    cmd = [sys.executable, "-m", "rlhf_nb.launch", "ppo", "--model_name_or_path", model, "--output_dir", str(out), "--max_steps", str(steps),
           "--per_device_train_batch_size", "4", "--max_completion_length", "16", "--critic", "separate", "--eval_steps", "0",
           "--save_final", "false", "--arith_train_size", "64", "--fast_paths", "false", "--ray_cpus_per_worker", "1", *ARMS[name]]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900)
    if r.returncode: return {"error": r.stderr.strip().splitlines()[-1][:300]}
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()][1:] or [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    med = lambda k: round(statistics.median(r[k] for r in rows), 3) if all(k in r for r in rows) else None
    summ = json.loads((out / "summary.json").read_text())
    return {"update_s": med("time/update"), "step_s": med("time/step"), "ray_overhead_s": med("time/ray_overhead"),
            "peak_rss_gb_main": summ.get("peak_rss_gb"), "wall_s": round(time.time() - t0, 1), "load1": round(os.getloadavg()[0], 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "33m"]); ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), help="a subset of: " + ", ".join(ARMS))
    a = ap.parse_args()
    path = ROOT / "bench" / "results_placement.json"
    res = json.loads(path.read_text()) if path.exists() else {}          # earlier arms are kept; the ones run now replace theirs
    res.update({f"{s}/{n}": arm(n, s, a.steps) for s in a.sizes for n in a.arms})
    path.write_text(json.dumps(res, indent=1))
    lines = ["| model / arm | update s | step s | Ray overhead s | peak RSS GB (main process) | load |", "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {v.get('update_s')} | {v.get('step_s')} | {v.get('ray_overhead_s')} | {v.get('peak_rss_gb_main')} | {v.get('load1')} |"
              if "error" not in v else f"| {k} | error: {v['error']} |||||" for k, v in res.items()]
    (ROOT / "bench" / "results_placement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Where the time of one RL step goes, per phase, at a model size: `python bench/profile_round.py --size 33.6M [--algo grpo|ppo]`.

Runs rlhf-nb's trainer in this process (warm-up step first), then times each phase of `RLTrainer.step` on the wall
clock and on this process's CPU clock (CPU/wall near 2 means both cores work), with the model FLOPs of each phase
counted from the shapes (bench/flops.py). Prints a table and writes JSON with --out."""
from __future__ import annotations
import argparse, json, os, sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import common as C


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="33.6M", choices=list(C.SIZES))
    ap.add_argument("--algo", default="grpo", choices=["grpo", "ppo"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="config override NAME=VALUE (python literal)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    C.set_threads(a.threads)
    import torch, ast
    import arms as A
    tok = C.tokenizer()
    model = C.policy(tok, seed=0, shape=C.SIZES[a.size])
    if a.algo == "grpo":
        p = dict(threads=a.threads, prompts=16, generations=8, max_new_tokens=16, updates_per_generation=2, lr=1e-5,
                 beta=0.0, temperature=1.0, seed=0)
        cfg, _ = A._grpo_config(p, C.WORK / f"profile_{os.getpid()}", a.steps + 1)
    else:
        from rlhf_nb.ppo import PPOConfig
        cfg = PPOConfig(output_dir=str(C.WORK / f"profile_{os.getpid()}"), per_device_train_batch_size=128, num_generations=1,
                        mini_batch_size=64, num_ppo_epochs=2, max_completion_length=16, learning_rate=1e-5, kl_coef=0.05,
                        adv_estimator="gae", ref_strategy="copy", critic="separate", max_steps=a.steps + 1, eval_steps=0,
                        save_steps=0, save_final=False, logging_steps=1, disable_tqdm=True, report_to="none",
                        lr_scheduler_type="constant")
    for kv in a.set:
        k, v = kv.split("=", 1)
        try: v = ast.literal_eval(v)
        except Exception: pass
        setattr(cfg, k, v)
    tr = A._nb_rl_trainer(cfg, tok, model)
    phases = ["generate_sequences", "compute_scores", "compute_log_probs_and_values", "compute_advantages", "update"]
    clocks = {ph: [] for ph in phases}
    for ph in phases:
        inner = getattr(tr, ph)
        def timed(*x, _inner=inner, _ph=ph, **k):
            w, c = time.perf_counter(), time.process_time()
            out = _inner(*x, **k)
            clocks[_ph].append((time.perf_counter() - w, time.process_time() - c))
            return out
        setattr(tr, ph, timed)
    steps = []
    hist = None
    for i in range(a.steps + 1):
        w, c = time.perf_counter(), time.process_time()
        m = tr.step(); tr.global_step += 1
        steps.append((time.perf_counter() - w, time.process_time() - c))
    med = lambda xs: statistics.median(xs[1:]) if len(xs) > 1 else xs[0]
    res = {"size": a.size, "algo": a.algo, "trainer": type(tr).__name__, "n_params": sum(p.numel() for p in model.parameters()),
           "step_s": med([s[0] for s in steps]), "step_cpu_s": med([s[1] for s in steps]),
           "response_length": m.get("response/length"), "phases": {}}
    for ph in phases:
        ws, cs = [x[0] for x in clocks[ph]], [x[1] for x in clocks[ph]]
        res["phases"][ph] = {"wall_s": med(ws), "cpu_s": med(cs)}
    print(f"{a.algo} {a.size} ({res['n_params']/1e6:.1f}M params) trainer {res['trainer']}: step {res['step_s']:.2f} s wall, "
          f"{res['step_cpu_s']:.2f} s CPU")
    for ph, v in res["phases"].items():
        print(f"  {ph:32s} {v['wall_s']:7.3f} s wall  {v['cpu_s']:7.3f} s CPU  (CPU/wall {v['cpu_s']/max(v['wall_s'],1e-9):.2f})")
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()

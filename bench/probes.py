"""Where rlhf-nb's trainers spend their time: the probes behind bench/README.md's "Where the time goes".

    python bench/probes.py floor           # PPO: update and scoring CPU time vs bare forward+backward passes
    python bench/probes.py shared_prefix   # GRPO: round CPU time with each prompt's K/V shared by its group
    python bench/probes.py imports         # peak RSS after each import (what every trainer process pays first)
    python bench/probes.py profile ARM     # cProfile of one bench arm (e.g. nb_grpo), top entries by cumulative time
    python bench/probes.py rollout         # GRPO rollout wall time: one batch vs row chunks side by side, per size/precision

CPU time (`time.process_time`) is used throughout: on the shared machine it moves far less than wall time."""
from __future__ import annotations
import os, sys, copy, time, json, types, statistics, subprocess
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C


def cpu(f, n=3):
    "Min and median CPU seconds of `f()` over n calls after one warm-up call."
    f(); ts = []
    for _ in range(n):
        t0 = time.process_time(); f(); ts.append(time.process_time() - t0)
    return round(min(ts), 3), round(statistics.median(ts), 3)


def _grpo_trainer(tok, p=None):
    import arms as A
    p = p or dict(prompts=16, generations=8, updates_per_generation=2, max_new_tokens=16, lr=1e-5, beta=0.0)
    cfg, _ = A._grpo_config(p, C.WORK / "probe_grpo", 10)
    return A._nb_rl_trainer(cfg, tok, C.policy(tok))


def floor():
    "PPO (128 episodes, 2 epochs x 2 minibatches, separate critic): trainer phases vs the bare passes they consist of."
    import torch, arms as A
    from rlhf_nb.ppo import PPOConfig
    C.set_threads(2); C.WORK.mkdir(parents=True, exist_ok=True)
    tok = C.tokenizer()
    cfg = PPOConfig(output_dir=str(C.WORK / "probe_ppo"), per_device_train_batch_size=128, num_generations=1, mini_batch_size=64,
                    num_ppo_epochs=2, max_completion_length=16, learning_rate=1e-5, kl_coef=0.05, max_steps=10, eval_steps=0,
                    save_final=False, disable_tqdm=True, arith_train_size=2000)
    tr = A._nb_rl_trainer(cfg, tok, C.policy(tok))
    tr.step()
    d = tr.generate_sequences(tr.next_batch()); d, _ = tr.compute_scores(d)
    d2 = tr.compute_advantages(tr.compute_log_probs_and_values(copy.copy(d)))
    out = {"batch": list(d["input_ids"].shape),
           "generate": cpu(lambda: tr.generate_sequences(tr.next_batch())),
           "compute_log_probs_and_values": cpu(lambda: tr.compute_log_probs_and_values(copy.copy(d))),
           "update": cpu(lambda: tr.update(copy.copy(d2)))}
    pol, critic = tr.unwrapped_policy, tr.accelerator.unwrap_model(tr.critic).value_model
    x, am, pos = d["input_ids"][:64], d["attention_mask"][:64], d["position_ids"][:64]
    def fb(m, **kw):
        def go():
            m(input_ids=x, attention_mask=am, position_ids=pos, **kw).logits.float().sum().backward(); m.zero_grad(set_to_none=True)
        return go
    out["bare actor fwd+bwd, 64 rows"] = cpu(fb(pol, logits_to_keep=17))
    out["bare critic fwd+bwd, 64 rows"] = cpu(fb(critic))
    with torch.no_grad():
        out["bare actor fwd, 128 rows"] = cpu(lambda: pol(input_ids=d["input_ids"], attention_mask=d["attention_mask"],
                                                          position_ids=d["position_ids"], logits_to_keep=17))
    return out


def _grpo_trainer_sharing(tok, share):
    "The probe's GRPO trainer with `share_prompt_prefix` on or off."
    import arms as A
    p = dict(prompts=16, generations=8, updates_per_generation=2, max_new_tokens=16, lr=1e-5, beta=0.0)
    cfg, _ = A._grpo_config(p, C.WORK / "probe_grpo", 10)
    cfg.share_prompt_prefix = share
    return A._nb_rl_trainer(cfg, tok, C.policy(tok))


def shared_prefix(reps=3):
    """GRPO round CPU time with each prompt run once per group (`share_prompt_prefix`, rlhf_nb.speed.shared_prefix_logits)
    against once per row (interleaved), and the log-prob agreement of the two forwards."""
    import torch
    from rlhf_nb.workers import Role
    C.set_threads(2); C.WORK.mkdir(parents=True, exist_ok=True)
    tok = C.tokenizer()
    res = {"plain": [], "shared_prefix": []}
    for _ in range(reps):
        for variant in res:
            tr = _grpo_trainer_sharing(tok, variant == "shared_prefix")
            tr.step()
            ts = []
            for _ in range(3):
                t0 = time.process_time(); tr.step(); ts.append(time.process_time() - t0)
            res[variant].append(statistics.median(ts))
    tr = _grpo_trainer_sharing(tok, True)
    d = tr.generate_sequences(tr.next_batch())
    idx, actor = torch.randperm(d["responses"].shape[0]), tr.workers[Role.ActorRollout]
    with torch.no_grad():
        a = actor.forward({**d, "prompt_group": None}, idx)[0]
        b = actor.forward(d, idx)[0]
    med = {k: round(statistics.median(v), 3) for k, v in res.items()}
    return {"round_cpu_s": med, "ratio": round(med["shared_prefix"] / med["plain"], 3),
            "max_logprob_diff": float((a - b)[d["response_mask"][idx].bool()].abs().max())}


def imports():
    "Peak RSS (MB) of a fresh interpreter after each import line."
    steps = ["import torch", "import rlhf_nb.models", "import rlhf_nb.ppo", "import rlhf_nb.algos", "from trl import GRPOTrainer"]
    code = ("import resource, sys, time\n" + "".join(
        f"t=time.time(); {s}; print({s!r}, round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024), round(time.time()-t, 1), "
        f"sorted(m for m in ('trl','peft','datasets','pandas') if m in sys.modules))\n" for s in steps))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return r.stdout.strip().splitlines()


def rollout(reps=3, sizes=("demo", "6.3M", "33.6M")):
    """Wall seconds of one GRPO rollout (16 prompts x 8 completions, 16 new tokens, each prompt prefilled once): one
    batch (`fast_rollout`) against two row chunks side by side (`split_rollout`), fp32 and bf16 autocast."""
    import torch
    from rlhf_nb.workers import make_generation_config
    from rlhf_nb.speed import fast_rollout, prompt_groups, split_rollout
    from rlhf_nb.models import set_attention
    C.set_threads(2)
    tok, out = C.tokenizer(), {}
    rows = C.arith_rows(16)
    enc = tok([tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows],
              return_tensors="pt", padding=True)
    ids, mask = enc.input_ids.repeat_interleave(8, 0), enc.attention_mask.repeat_interleave(8, 0)
    groups, gc = prompt_groups(ids, mask, 8), make_generation_config(tok, 16)
    for size in sizes:
        model = C.policy(tok, seed=0, shape=C.SIZES[size]); set_attention([model], "eager")
        for prec in ("fp32", "bf16"):
            def timed(f):
                ts = []
                for i in range(reps + 1):
                    torch.manual_seed(i); t0 = time.perf_counter()
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16"): f()
                    ts.append(time.perf_counter() - t0)
                return round(statistics.median(ts[1:]), 3)
            args = (model, ids, mask, gc, tok.eos_token_id, tok.pad_token_id)
            one = timed(lambda: fast_rollout(*args, groups=groups))
            two = timed(lambda: split_rollout(*args, groups=groups, parts=2))
            out[f"{size}/{prec}"] = {"one_batch_s": one, "two_chunks_s": two, "ratio": round(two / one, 3)}
    return out


def profile(arm, params=None):
    "cProfile one arm of bench/arms.py with small settings; returns the top lines by cumulative time."
    import cProfile, pstats, io, arms as A
    params = params or {"nb_grpo": dict(threads=2, prompts=16, generations=8, updates_per_generation=2, max_new_tokens=16,
                                        lr=1e-5, beta=0.0, warmup_rounds=1, rounds=2),
                        "nb_ppo": dict(threads=2, episodes=128, mini_batch_size=64, ppo_epochs=2, max_new_tokens=16, lr=1e-5,
                                       kl_coef=0.05, warmup_rounds=1, rounds=2)}[arm]
    C.WORK.mkdir(parents=True, exist_ok=True)
    pr = cProfile.Profile(); pr.enable(); A.ARMS[arm](params); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    return s.getvalue()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "floor"
    if what == "profile": print(profile(sys.argv[2] if len(sys.argv) > 2 else "nb_grpo"))
    elif what == "imports": print("\n".join(imports()))
    else: print(json.dumps({"floor": floor, "shared_prefix": shared_prefix, "rollout": rollout}[what](), indent=1))

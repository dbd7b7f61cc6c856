"""Benchmark arms. Each arm runs in its own fresh process: `python bench/arms.py ARM 'JSON-PARAMS'` and prints one
`@@BENCH_RESULT {json}` line (timings, tokens, peak RSS of that process). bench/run.py interleaves them."""
from __future__ import annotations
import os, sys, json, time, math, statistics, warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
warnings.filterwarnings("ignore")
import common as C
import flops as F

ARMS = {}


class Unavailable(Exception):
    "The code this arm measures does not exist yet (an rlhf_nb module still being written): reported as skipped."


def need(part, *names):
    "Fetch `rlhf_nb.<part>.<name>` objects, or raise Unavailable naming what is missing."
    got = [C.nb(part, n) for n in names]
    missing = [n for n, g in zip(names, got) if g is None]
    if missing: raise Unavailable(f"rlhf_nb.{part} has no {', '.join(missing)} yet")
    return got if len(got) > 1 else got[0]


def bf16(p):
    "Whether this arm trains in bfloat16 mixed precision (`precision: bf16`); both sides then autocast on the CPU."
    return p.get("precision", "fp32") == "bf16"


def shape_of(model):
    "The Qwen2 shape of `model` as a dict bench/flops.py reads."
    c = model.config
    return dict(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                head_dim=getattr(c, "head_dim", None), vocab_size=c.vocab_size)


def prompt_len(tok, rows):
    "Longest chat-templated prompt of `rows` in tokens (prompts are left-padded to it)."
    ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in rows]
    return max(len(x["input_ids"] if hasattr(x, "keys") else x) for x in ids)


def arm(name):
    def deco(f):
        ARMS[name] = f
        return f
    return deco


def now():
    """(wall seconds, CPU seconds of this process): CPU time counts only this process's own work, so it is far less
    disturbed than wall time when other users load the shared cores."""
    return time.perf_counter(), time.process_time()


def _round_times(stamps, steps_per_round, warmup_rounds, cpu=False):
    "Per-round seconds from the (step, wall, cpu) stamps taken at each optimizer step's end, warm-up rounds dropped."
    ends = {st[0]: st[2 if cpu else 1] for st in stamps}
    out = []
    n_rounds = max(ends) // steps_per_round if ends else 0
    for r in range(warmup_rounds, n_rounds):
        a, b = r * steps_per_round, (r + 1) * steps_per_round
        if a in ends and b in ends: out.append(ends[b] - ends[a])
    return out


def _timing(stamps, steps_per_round, warmup, key):
    "`key`_s (median wall), `key`_cpu_s (median CPU) and the per-round lists."
    w, c = _round_times(stamps, steps_per_round, warmup), _round_times(stamps, steps_per_round, warmup, cpu=True)
    return {f"{key}_s": statistics.median(w), f"{key}_cpu_s": statistics.median(c), f"{key}_times": w, f"{key}_cpu_times": c}


def _trl_timer():
    from transformers import TrainerCallback
    class Timer(TrainerCallback):
        "Time stamps at each optimizer step's end; optional wall-clock stop."
        def __init__(self, max_seconds=None):
            self.stamps, self.t0, self.max_seconds = [], None, max_seconds
        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter(); self.stamps.append((0, *now()))
        def on_step_end(self, args, state, control, **kw):
            w, c = now(); self.stamps.append((state.global_step, w, c))
            if self.max_seconds is not None and w - self.t0 >= self.max_seconds: control.should_training_stop = True
            return control
    return Timer


@arm("selftest")
def selftest(p):
    "A trivial arm for the harness's own tests: sleeps, allocates `mb` MB, reports the numbers it was given."
    buf = bytearray(b"\x01") * int(p.get("mb", 0) * 2**20)   # touched pages, so they count in RSS
    time.sleep(p.get("sleep", 0.0))
    if p.get("fail"): raise RuntimeError("selftest asked to fail")
    return dict(value=p.get("value", 1.0), n_bytes=len(buf))


# ----------------------------------------------------------------------------------------------------------------
# GRPO round: trl.GRPOTrainer (1.16)
# ----------------------------------------------------------------------------------------------------------------
def _trl_grpo_trainer(p, tok, model, max_steps, timer):
    from trl import GRPOConfig, GRPOTrainer
    reward, counter = C.trl_reward_func()
    rows = C.arith_rows(p.get("n_train", 2000), "train", seed=p.get("seed", 0))
    cfg = GRPOConfig(
        output_dir=str(C.WORK / f"trl_grpo_{os.getpid()}"), report_to="none", save_strategy="no",
        per_device_train_batch_size=p["prompts"] * p["generations"], num_generations=p["generations"],
        num_iterations=p["updates_per_generation"], max_completion_length=p["max_new_tokens"],
        learning_rate=p["lr"], beta=p.get("beta", 0.0), temperature=p.get("temperature", 1.0),
        bf16=bf16(p), fp16=False, use_cpu=True, gradient_checkpointing=False, max_steps=max_steps,
        logging_steps=1, disable_tqdm=True, seed=p.get("seed", 0), dataloader_num_workers=0, lr_scheduler_type="constant",
        warmup_steps=0, loss_type=p.get("loss_type", "dapo"), shuffle_dataset=True)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[reward], args=cfg,
                          train_dataset=C.to_trl(rows, "grpo"), callbacks=[timer])
    return trainer, counter


@arm("trl_grpo")
def trl_grpo(p):
    C.set_threads(p["threads"])
    tok = C.tokenizer()
    model = C.policy(tok, seed=p.get("seed", 0), path=p.get("init_path"), shape=p.get("shape"))
    Timer = _trl_timer(); timer = Timer()
    k = p["updates_per_generation"]
    rounds = p["warmup_rounds"] + p["rounds"]
    trainer, counter = _trl_grpo_trainer(p, tok, model, rounds * k, timer)
    t0 = time.perf_counter(); trainer.train(); total = time.perf_counter() - t0
    t = _timing(timer.stamps, k, p["warmup_rounds"], "round")
    tokens_per_round = counter["tokens"] / max(counter["calls"], 1)
    # executed FLOPs: TRL generates with a KV cache (every row prefills its prompt), runs a no-grad forward for the
    # old log-probs when it updates more than once per generation, and trains every row's whole sequence
    S, B, P, R = shape_of(model), p["prompts"] * p["generations"], prompt_len(tok, C.arith_rows(64)), p["max_new_tokens"]
    k, T = p["updates_per_generation"], P + R - 1
    fl = (F.generation(S, B, P, R) + (F.forward(S, B, T, R) if k > 1 else 0) + (F.forward(S, B, T, R) if p.get("beta") else 0)
          + k * F.train(S, B, T, R))
    return dict(**t, tokens_per_round=tokens_per_round, completion_tok_per_s=tokens_per_round / t["round_s"], total_s=total,
                flops_per_round=fl, prompt_tokens=P)


# ----------------------------------------------------------------------------------------------------------------
# PPO update: TRL 1.12 trl.experimental.ppo.PPOTrainer (runs under bench/.venv-trl112/bin/python)
# ----------------------------------------------------------------------------------------------------------------
def _tokenized_prompts(tok, rows):
    from datasets import Dataset
    ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in rows]
    ids = [x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x for x in ids]
    return Dataset.from_dict({"input_ids": ids})


@arm("trl112_ppo")
def trl112_ppo(p):
    C.set_threads(p["threads"])
    import trl
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    tok = C.tokenizer()
    seed = p.get("seed", 0)
    model = C.policy(tok, seed=seed, path=p.get("init_path"), shape=p.get("shape"))
    value = C.value_model(tok, seed=seed + 1, shape=p.get("shape"))   # the critic has the policy's shape (as rlhf-nb's)
    # TRL's PPO needs a reward *model* (rlhf-nb uses the rule reward); a random non-zero head so scores vary
    reward = C.value_model(tok, seed=seed + 2, head_std=0.02)      # the demo shape at every size: a small fixed cost
    B, mb = p["episodes"], p["mini_batch_size"]
    updates = p["warmup_rounds"] + p["rounds"]
    train = _tokenized_prompts(tok, C.arith_rows(max(B * updates, 256), "train", seed))
    evald = _tokenized_prompts(tok, C.arith_rows(64, "test", seed))
    cfg = PPOConfig(
        output_dir=str(C.WORK / f"trl112_ppo_{os.getpid()}"), report_to="none", save_strategy="no",
        per_device_train_batch_size=B, gradient_accumulation_steps=1, num_mini_batches=B // mb,
        local_rollout_forward_batch_size=B, total_episodes=B * updates, num_ppo_epochs=p["ppo_epochs"],
        response_length=p["max_new_tokens"], stop_token="eos", learning_rate=p["lr"], temperature=p.get("temperature", 1.0),
        kl_coef=p.get("kl_coef", 0.05), bf16=bf16(p), fp16=False, use_cpu=True, gradient_checkpointing=False,
        num_sample_generations=0, logging_steps=1, disable_tqdm=True, seed=seed, missing_eos_penalty=None,
        lr_scheduler_type="constant", per_device_eval_batch_size=16)
    Timer = _trl_timer(); timer = Timer()
    trainer = PPOTrainer(args=cfg, processing_class=tok, model=model, ref_model=None, reward_model=reward,
                         train_dataset=train, eval_dataset=evald, value_model=value, callbacks=[timer])
    t0 = time.perf_counter(); trainer.train(); total = time.perf_counter() - t0
    # executed FLOPs: generation; policy, reference, value and reward forwards (TRL 1.12 computes the policy's logits at
    # every position); per epoch the policy and the value model trained together on every row
    S, P, R = shape_of(model), prompt_len(tok, C.arith_rows(64)), p["max_new_tokens"]
    T = P + R
    fl = (F.generation(S, B, P, R) + 2 * F.forward(S, B, T, T) + F.forward(S, B, T, 0) + F.forward(shape_of(reward), B, T, 0)
          + p["ppo_epochs"] * (F.train(S, B, T, T) + F.train(S, B, T, 0)))
    return dict(**_timing(timer.stamps, 1, p["warmup_rounds"], "update"), total_s=total, trl_version=trl.__version__,
                flops_per_round=fl, prompt_tokens=P)


# ----------------------------------------------------------------------------------------------------------------
# DPO step: trl.DPOTrainer (1.16)
# ----------------------------------------------------------------------------------------------------------------
@arm("trl_dpo")
def trl_dpo(p):
    C.set_threads(p["threads"])
    from trl import DPOConfig, DPOTrainer
    tok = C.tokenizer()
    model = C.policy(tok, seed=p.get("seed", 0), path=p.get("init_path"), shape=p.get("shape"))
    steps = p["warmup_steps"] + p["steps"]
    rows = C.pref_rows(max(p["n_pairs"], p["batch_size"] * steps), seed=p.get("seed", 0))
    cfg = DPOConfig(
        output_dir=str(C.WORK / f"trl_dpo_{os.getpid()}"), report_to="none", save_strategy="no",
        per_device_train_batch_size=p["batch_size"], learning_rate=p["lr"], beta=p["beta"], loss_type=["sigmoid"],
        precompute_ref_log_probs=p.get("precompute_ref", True), precompute_ref_batch_size=p["batch_size"],
        bf16=bf16(p), fp16=False, use_cpu=True, gradient_checkpointing=False, max_steps=steps, logging_steps=1,
        disable_tqdm=True, seed=p.get("seed", 0), dataloader_num_workers=0, lr_scheduler_type="constant", max_length=64)
    Timer = _trl_timer(); timer = Timer()
    t0 = time.perf_counter()
    trainer = DPOTrainer(model=model, ref_model=None, args=cfg, processing_class=tok,
                         train_dataset=C.to_trl(rows, "dpo"), callbacks=[timer])
    trainer.train(); total = time.perf_counter() - t0
    # setup = trainer construction + train() up to its first step (dataset tokenisation, reference log-prob precompute)
    setup = timer.stamps[0][1] - t0
    P, T = prompt_len(tok, rows[:64]), _pair_len(tok, rows[:64])
    return dict(**_timing(timer.stamps, 1, p["warmup_steps"], "step"), setup_s=setup, total_s=total,
                flops_per_round=F.train(shape_of(model), 2 * p["batch_size"], T - 1, T - 1), prompt_tokens=P)


def _pair_len(tok, rows):
    "Longest prompt + completion (+ eos) of the preference rows, in tokens."
    P = prompt_len(tok, rows)
    return P + max(len(tok(x, add_special_tokens=False)["input_ids"]) for r in rows for x in (r["chosen"], r["rejected"])) + 1


# ----------------------------------------------------------------------------------------------------------------
# rlhf-nb arms: the RL trainer (PPO / GRPO) and the DPO loop
# ----------------------------------------------------------------------------------------------------------------
def _stamp_calls(obj, attr, stamps):
    "Wrap obj.attr so each call appends (n, wall, cpu) at its end (a per-step clock like TRL's on_step_end)."
    inner = getattr(obj, attr)
    def wrapped(*a, **k):
        out = inner(*a, **k); stamps.append((len(stamps), *now())); return out
    setattr(obj, attr, wrapped)


def _phase_medians(history, warmup):
    "Medians of the trainer's own per-phase timers (time/rollout, time/reward, ...) after warm-up."
    rows = [h for h in history if h.get("step", 0) > warmup]
    keys = sorted({k for h in rows for k in h if k.startswith("time/") and k != "time/elapsed"})
    return {k: statistics.median([h[k] for h in rows if k in h]) for k in keys}


def _grpo_config(p, out_dir, max_steps, max_seconds=None, timing=True):
    "rlhf-nb's GRPO config for the bench settings (GRPOConfig from rlhf_nb.algos; PPOConfig(adv_estimator='grpo') if absent)."
    G = C.nb("algos", "GRPOConfig")
    P = need("ppo", "PPOConfig")
    Cfg, src = (G, "rlhf_nb.algos.GRPOConfig") if G is not None else (P, "rlhf_nb.ppo.PPOConfig(adv_estimator='grpo')")
    import dataclasses
    names = {f.name for f in dataclasses.fields(Cfg)}
    kw = dict(output_dir=str(out_dir), per_device_train_batch_size=p["prompts"], num_generations=p["generations"],
              num_ppo_epochs=p["updates_per_generation"], mini_batch_size=p["prompts"] * p["generations"],
              max_completion_length=p["max_new_tokens"], learning_rate=p["lr"], temperature=p.get("temperature", 1.0),
              max_steps=max_steps, max_seconds=max_seconds, eval_steps=0, save_steps=0, save_final=False,
              logging_steps=1, disable_tqdm=True, seed=p.get("seed", 0), report_to="none", lr_scheduler_type="constant",
              arith_train_size=p.get("n_train", 2000), bf16=bf16(p))
    if G is None: kw.update(adv_estimator="grpo", critic="none", use_kl_loss=True)
    if timing:
        # same work as TRL's round: no dropping of all-equal groups (it would skip updates), beta as given
        for k in ("filter_groups", "drop_zero_signal_groups", "filter_zero_std_groups", "skip_zero_signal"):
            if k in names: kw[k] = False
    beta = p.get("beta")
    if beta is not None:
        kw["kl_coef"] = beta
        if beta == 0 and "ref_strategy" in names: kw["ref_strategy"] = "none"
    kw = {k: v for k, v in kw.items() if k in names}
    return Cfg(**kw), src


def _nb_rl_trainer(cfg, tok, model):
    "rlhf-nb's RL trainer for `cfg`: the class `rlhf-nb ppo|grpo` runs (rlhf_nb.algos.rl_trainer_class), on the bench's model."
    return need("algos", "rl_trainer_class")(cfg)(cfg, policy=model, tokenizer=tok).init_workers()


@arm("nb_grpo")
def nb_grpo(p):
    C.set_threads(p["threads"])
    tok = C.tokenizer()
    model = C.policy(tok, seed=p.get("seed", 0), path=p.get("init_path"), shape=p.get("shape"))
    rounds = p["warmup_rounds"] + p["rounds"]
    cfg, src = _grpo_config(p, C.WORK / f"nb_grpo_{os.getpid()}", rounds)
    trainer = _nb_rl_trainer(cfg, tok, model)
    stamps = [(0, *now())]
    _stamp_calls(trainer, "step", stamps)
    t0 = time.perf_counter(); hist = trainer.fit(); total = time.perf_counter() - t0
    t = _timing(stamps, 1, p["warmup_rounds"], "round")
    lens = [h["response/length"] for h in hist if "response/length" in h][p["warmup_rounds"]:]
    tokens = statistics.mean(lens) * p["prompts"] * p["generations"] if lens else None
    return dict(**t, tokens_per_round=tokens, completion_tok_per_s=tokens / t["round_s"] if tokens else None, total_s=total,
                flops_per_round=_nb_rl_flops(trainer, tok, p["prompts"], p["generations"], p["max_new_tokens"]),
                phases=_phase_medians(hist, p["warmup_rounds"]), config_source=src,
                info=f"config: {src}, trainer {type(trainer).__name__}, kl_coef={getattr(cfg, 'kl_coef', None)}, "
                     f"ref={getattr(cfg, 'ref_strategy', None)}, filter_groups={getattr(cfg, 'filter_groups', None)}")


def _nb_rl_flops(tr, tok, prompts, G, R):
    """Executed FLOPs of one step of rlhf-nb's RL trainer, from its settings: generation (every row prefills), the
    reference and critic forwards, the old-policy forward of the rows the first mini-batch does not cover (deferred
    into the update) and, per epoch, the actor and critic trained, a group's shared prompt run once when
    `share_prompt_prefix`."""
    S, B, P = shape_of(tr.unwrapped_policy), prompts * G, prompt_len(tok, C.arith_rows(64))
    T, cfg = P + R - 1, tr.config
    share = dict(prefix=P, prefix_rows=prompts) if G > 1 and cfg.share_prompt_prefix else {}
    deferred = type(tr).__name__ == "FastRLTrainer" and tr.critic_mode != "shared" and not tr._kl_in_reward()
    old_rows = B - tr.mini_batch_size if deferred else B
    critic = tr.critic is not None
    fl = F.generation(S, B, P, R) + F.forward(S, old_rows, T, R, **share) * (old_rows > 0)
    fl += F.forward(S, B, T, R, **share) if tr.reference.active else 0
    fl += F.forward(S, B, T, 0) if critic else 0
    fl += cfg.num_ppo_epochs * (F.train(S, B, T, R, **share) + (F.train(S, B, T, 0) if critic else 0))
    return fl


@arm("nb_ppo")
def nb_ppo(p):
    C.set_threads(p["threads"])
    PPOConfig = need("ppo", "PPOConfig")
    tok = C.tokenizer()
    model = C.policy(tok, seed=p.get("seed", 0), path=p.get("init_path"), shape=p.get("shape"))
    updates = p["warmup_rounds"] + p["rounds"]
    import dataclasses
    names = {f.name for f in dataclasses.fields(PPOConfig)}
    kw = dict(output_dir=str(C.WORK / f"nb_ppo_{os.getpid()}"), per_device_train_batch_size=p["episodes"], num_generations=1,
              mini_batch_size=p["mini_batch_size"], num_ppo_epochs=p["ppo_epochs"], max_completion_length=p["max_new_tokens"],
              learning_rate=p["lr"], temperature=p.get("temperature", 1.0), kl_coef=p.get("kl_coef", 0.05),
              adv_estimator="gae", ref_strategy="copy", critic=p.get("critic", "separate"), max_steps=updates, eval_steps=0, save_steps=0, save_final=False,
              logging_steps=1, disable_tqdm=True, seed=p.get("seed", 0), report_to="none", lr_scheduler_type="constant",
              arith_train_size=max(2000, p["episodes"] * updates), bf16=bf16(p))
    cfg = PPOConfig(**{k: v for k, v in kw.items() if k in names})
    trainer = _nb_rl_trainer(cfg, tok, model)
    stamps = [(0, *now())]
    _stamp_calls(trainer, "step", stamps)
    t0 = time.perf_counter(); hist = trainer.fit(); total = time.perf_counter() - t0
    return dict(**_timing(stamps, 1, p["warmup_rounds"], "update"), total_s=total,
                flops_per_round=_nb_rl_flops(trainer, tok, p["episodes"], 1, p["max_new_tokens"]),
                phases=_phase_medians(hist, p["warmup_rounds"]),
                info=f"critic={getattr(cfg, 'critic', None)} ({getattr(trainer, 'critic_mode', None)}), ref={cfg.ref_strategy}, "
                     f"kl_coef={cfg.kl_coef}, mini_batch_size={cfg.mini_batch_size}")


@arm("nb_dpo")
def nb_dpo(p):
    C.set_threads(p["threads"])
    DPOConfig = need("dpo", "DPOConfig")
    pick = C.nb("dpo", "dpo_trainer_class")                 # the class `rlhf-nb dpo` runs (older checkouts: DPOLoop)
    tok = C.tokenizer()
    model = C.policy(tok, seed=p.get("seed", 0), path=p.get("init_path"), shape=p.get("shape"))
    steps = p["warmup_steps"] + p["steps"]
    rows = C.pref_rows(max(p["n_pairs"], p["batch_size"] * steps), seed=p.get("seed", 0))
    import dataclasses
    names = {f.name for f in dataclasses.fields(DPOConfig)}
    kw = dict(output_dir=str(C.WORK / f"nb_dpo_{os.getpid()}"), per_device_train_batch_size=p["batch_size"],
              learning_rate=p["lr"], beta=p["beta"], loss_type="sigmoid", max_steps=steps, eval_steps=10**9,
              logging_steps=1, seed=p.get("seed", 0), report_to="none", warmup_steps=0, max_length=64,
              ref_strategy="precompute" if p.get("precompute_ref", True) else "peft", precompute_ref_batch_size=p["batch_size"],
              num_eval_prompts=0, num_eval_pairs=0, bf16=bf16(p), share_prompt_prefix=p.get("share_prompt_prefix", True))
    cfg = DPOConfig(**{k: v for k, v in kw.items() if k in names})
    os.environ["TQDM_DISABLE"] = "1"
    t0 = time.perf_counter()
    loop = (pick(cfg) if pick else need("dpo", "DPOLoop"))(cfg, model, tok, rows)
    loop.prepare_reference()
    stamps = [(0, *now())]
    t_ref = stamps[0][1]
    _stamp_calls(loop.scheduler, "step", stamps)
    loop.fit(); total = time.perf_counter() - t0
    S, P, T = shape_of(model), prompt_len(tok, rows[:64]), _pair_len(tok, rows[:64])
    share = dict(prefix=P, prefix_rows=p["batch_size"]) if getattr(cfg, "share_prompt_prefix", False) else {}
    return dict(**_timing(stamps, 1, p["warmup_steps"], "step"), setup_s=t_ref - t0, total_s=total, prompt_tokens=P,
                flops_per_round=F.train(S, 2 * p["batch_size"], T - 1, T - P, **share), bf16_in_config="bf16" in names)


# ----------------------------------------------------------------------------------------------------------------
# GRPO accuracy after equal wall time (from the same SFT start)
# ----------------------------------------------------------------------------------------------------------------
def _accuracy(model, tok, rows):
    ga = need("sft", "greedy_accuracy")
    was = model.training; model.eval()
    acc = ga(model, tok, rows)["accuracy"]
    model.train(was)
    return acc


@arm("nb_grpo_acc")
def nb_grpo_acc(p):
    C.set_threads(p["threads"])
    tok = C.tokenizer()
    model = C.policy(tok, path=p["init_path"])
    test = C.arith_rows(p["n_eval"], "test", seed=0)
    acc0 = _accuracy(model, tok, test)
    cfg, src = _grpo_config(p, C.WORK / f"nb_grpo_acc_{os.getpid()}", 10**6, max_seconds=p["wall_seconds"], timing=False)
    trainer = _nb_rl_trainer(cfg, tok, model)
    t0 = time.perf_counter(); hist = trainer.fit(); wall = time.perf_counter() - t0
    acc1 = _accuracy(trainer.unwrapped_policy if hasattr(trainer, "unwrapped_policy") else model, tok, test)
    return dict(accuracy_start=acc0, accuracy_end=acc1, accuracy_gain=acc1 - acc0, rounds_done=trainer.global_step,
                wall_s=wall, config_source=src)


@arm("trl_grpo_acc")
def trl_grpo_acc(p):
    C.set_threads(p["threads"])
    tok = C.tokenizer()
    model = C.policy(tok, path=p["init_path"])
    test = C.arith_rows(p["n_eval"], "test", seed=0)
    acc0 = _accuracy(model, tok, test)
    Timer = _trl_timer(); timer = Timer(max_seconds=p["wall_seconds"])
    trainer, _ = _trl_grpo_trainer(p, tok, model, 10**6, timer)
    t0 = time.perf_counter(); trainer.train(); wall = time.perf_counter() - t0
    acc1 = _accuracy(trainer.model, tok, test)
    return dict(accuracy_start=acc0, accuracy_end=acc1, accuracy_gain=acc1 - acc0,
                rounds_done=trainer.state.global_step / p["updates_per_generation"], wall_s=wall)


# ----------------------------------------------------------------------------------------------------------------
# Reference strategies: bytes of weights resident for copy / peft / none
# ----------------------------------------------------------------------------------------------------------------
def resident_bytes(*objs):
    "Bytes of distinct tensor storages held by the parameters and buffers of these modules (shared storage counted once)."
    import torch
    seen, total = set(), 0
    for o in objs:
        if o is None: continue
        for t in list(o.parameters()) + list(o.buffers()):
            if t.device.type == "meta":
                total += t.numel() * t.element_size(); continue
            st = t.untyped_storage()
            if st.data_ptr() in seen: continue
            seen.add(st.data_ptr()); total += st.nbytes()
    return total


def _lora_config(r=8, alpha=16):
    from peft import LoraConfig
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


def _ref_strategies_generic(model_fn):
    "Policy + reference for each strategy, built the textbook way; returns {strategy: (policy, reference)}."
    import copy
    from peft import get_peft_model
    out = {}
    pol = model_fn(); ref = copy.deepcopy(pol).eval().requires_grad_(False); out["copy"] = (pol, ref)
    pol = get_peft_model(model_fn(), _lora_config()); out["peft"] = (pol, None)   # reference = pol with adapter disabled
    out["none"] = (model_fn(), None)
    return out


@arm("ref_strategies")
def ref_strategies(p):
    """Weight bytes resident for the reference per strategy. Tiny model: measured with rlhf_nb.ppo.reference_memory_table
    (the trainer's own Reference objects) when it exists; 0.5B shape: counted on the meta device (bf16)."""
    C.set_threads(p["threads"])
    tok = C.tokenizer()
    res = {}
    table_fn = C.nb("ppo", "reference_memory_table")
    if table_fn is not None:
        t = table_fn(lambda: C.policy(tok), lora_r=8, lora_alpha=16)
        base = resident_bytes(C.policy(tok))
        for s in ("copy", "peft", "none"):
            res[f"{s}_bytes"] = t[s]["reference_extra_bytes"]                 # what the reference itself adds
            res[f"{s}_total_bytes"] = t[s]["total_bytes"]
        res["peft_adapter_bytes"] = t["peft"]["policy_bytes"] - base
        res["policy_bytes_tiny"], src = base, "rlhf_nb.ppo.reference_memory_table (Reference objects of the trainer)"
    else:
        models, base = _ref_strategies_generic(lambda: C.policy(tok)), resident_bytes(C.policy(tok))
        for s, (pol, ref) in models.items():
            res[f"{s}_bytes"] = resident_bytes(pol, ref) - resident_bytes(pol)
            res[f"{s}_total_bytes"] = resident_bytes(pol, ref)
        res["peft_adapter_bytes"] = resident_bytes(models["peft"][0]) - base
        res["policy_bytes_tiny"], src = base, "the bench's textbook construction (deepcopy / LoRA r=8 adapter disabled / nothing)"
    base = resident_bytes(_meta_qwen05())
    for s, (pol, ref) in _ref_strategies_generic(_meta_qwen05).items():
        res[f"{s}_bytes_0.5b_bf16"] = resident_bytes(pol, ref) - resident_bytes(pol)
        res[f"{s}_total_bytes_0.5b_bf16"] = resident_bytes(pol, ref)
    res["peft_adapter_bytes_0.5b_bf16"] = res["peft_total_bytes_0.5b_bf16"] - base
    res["policy_bytes_0.5b_bf16"] = base
    res["info"] = ("*_bytes = weight bytes the reference adds beyond the policy (peft: 0, the policy's own base is the "
                   "reference; the LoRA adapter it trains is peft_adapter_bytes); *_total_bytes = policy (+adapter) + "
                   f"reference. Tiny model from {src}; 0.5b_bf16 counted on the meta device from Qwen2.5-0.5B's shape "
                   "(LoRA r=8 on all linear layers).")
    return res


def _meta_qwen05():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**QWEN05_SHAPE, bos_token_id=None, eos_token_id=None, pad_token_id=0, dtype="bfloat16")
    with torch.device("meta"): return Qwen2ForCausalLM(cfg).to(torch.bfloat16)


# ----------------------------------------------------------------------------------------------------------------
# Reward throughput: bench/bench_rewards.py (owned by the rewards engineer), called as it is
# ----------------------------------------------------------------------------------------------------------------
@arm("rewards")
def rewards(p):
    path = C.BENCH_DIR / "bench_rewards.py"
    if not path.exists(): raise Unavailable("bench/bench_rewards.py does not exist yet (rewards engineer)")
    import importlib, io, contextlib
    C.set_threads(p.get("threads", 1))
    mod = importlib.import_module("bench_rewards")
    for fname in ("run_bench", "bench", "run", "benchmark"):
        f = getattr(mod, fname, None)
        if callable(f):
            # always 10,000 completions for the RewardManager figure; --quick only shortens math-verify. The JSON goes to
            # bench/_work so the rewards engineer's own bench/results_rewards.json is left alone.
            try: out = f(quick=bool(p.get("quick")), n=10_000, out=str(C.WORK / "results_rewards.json"))
            except TypeError:
                try: out = f(quick=bool(p.get("quick")))
                except TypeError: out = f()
            if isinstance(out, dict): return _flatten_rewards(out, f"bench_rewards.{fname}()")
    # no function returning a dict: run its command line and take the last JSON object it prints
    import subprocess
    cmd = [sys.executable, str(path)] + (["--quick"] if p.get("quick") else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=p.get("timeout", 900))
    if r.returncode != 0 and p.get("quick"):
        cmd = cmd[:-1]; r = subprocess.run(cmd, capture_output=True, text=True, timeout=p.get("timeout", 900))
    for line in r.stdout.splitlines()[::-1]:
        line = line.strip()
        if line.startswith("{"):
            try: return _flatten_rewards(json.loads(line), " ".join(cmd[1:]))
            except json.JSONDecodeError: pass
    raise RuntimeError(f"bench_rewards.py printed no JSON result (rc={r.returncode}): {(r.stderr or r.stdout)[-500:]}")


def _flatten_rewards(d, source):
    "Keep numeric results; map the usual names onto the two headline metrics."
    flat = {}
    def walk(x, pre=""):
        for k, v in x.items():
            if isinstance(v, dict): walk(v, f"{pre}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool): flat[f"{pre}{k}"] = v
    walk(d)
    def pick(*subs):
        for k, v in flat.items():
            if all(s in k.lower() for s in subs): return v
    out = dict(flat)
    out["reward_manager_completions_per_s"] = pick("manager", "per_s") or pick("rm", "per_s") or pick("completions", "per_s")
    out["math_verify_calls_per_s"] = pick("verify", "per_s") or pick("math", "per_s")
    out["info"] = f"from {source}"
    return out


# ----------------------------------------------------------------------------------------------------------------
# --gpu: the 0.5B-shaped model (Qwen2.5-0.5B's config shape, random init, no download) in bf16
# ----------------------------------------------------------------------------------------------------------------
# The shapes and the peak-FLOPs table live in bench/throughput.py (one table for both GPU benches).
from throughput import QWEN25_05B_SHAPE as QWEN05_SHAPE, DRY_SHAPE, PEAK_BF16_TFLOPS, peak_tflops  # noqa: E402


@arm("gpu_model")
def gpu_model(p):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    dry = bool(p.get("dry_run"))
    if not torch.cuda.is_available() and not dry:
        raise Unavailable("no CUDA device here: --gpu skipped (run `python bench/run.py --gpu --dry_run` to test the logic on CPU)")
    C.set_threads(p["threads"])
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    shape = DRY_SHAPE if dry else QWEN05_SHAPE
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16
    cfg = Qwen2Config(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(dev): model = Qwen2ForCausalLM(cfg).to(dtype)
    n_params = sum(t.numel() for t in model.parameters())           # tied embedding counted once
    g = torch.Generator(device="cpu").manual_seed(0)
    if cuda: torch.cuda.reset_peak_memory_stats()

    # generation: B prompts of P random tokens, exactly NEW sampled tokens each (no eos)
    B, P, NEW = (4, 8, 8) if dry else (p.get("gen_batch", 64), p.get("prompt_len", 64), p.get("new_tokens", 128))
    prompts = torch.randint(10, cfg.vocab_size, (B, P), generator=g).to(dev)
    kw = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, eos_token_id=None, pad_token_id=0)
    model.eval()
    with torch.no_grad():
        model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        sync(); t0 = time.perf_counter()
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=NEW, min_new_tokens=NEW, **kw)
        sync(); gen_s = time.perf_counter() - t0
    gen_tokens = (out.shape[1] - P) * B
    gen_mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    # training: AdamW steps on B x T tokens (next-token loss), bf16 weights and optimizer state
    model.train()
    TB, T = (2, 32) if dry else (p.get("train_batch", 8), p.get("train_len", 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **({"fused": True} if cuda else {}))
    x = torch.randint(10, cfg.vocab_size, (TB, T), generator=g).to(dev)
    warm, steps = (1, 2) if dry else (p.get("warmup_steps", 3), p.get("steps", 10))
    times = []
    for i in range(warm + steps):
        sync(); t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        sync(); dt = time.perf_counter() - t0
        if i >= warm: times.append(dt)
    step_s = statistics.median(times)
    tok = TB * T
    name = torch.cuda.get_device_name(0) if cuda else C.cpu_model()
    peak, peak_src = peak_tflops(name if cuda else "", p.get("peak_tflops"))
    flops = 6 * n_params * tok / step_s
    return dict(device=name, dry_run=dry, n_params=n_params, shape=shape, dtype="bfloat16",
                gen_batch=B, prompt_len=P, new_tokens=NEW, gen_s=gen_s, gen_tok_per_s=gen_tokens / gen_s,
                train_batch=TB, train_len=T, train_step_s=step_s, train_step_times=times, train_tok_per_s=tok / step_s,
                achieved_tflops=flops / 1e12, peak_tflops=peak, peak_source=peak_src,
                mfu=(flops / (peak * 1e12)) if peak else None,
                peak_gpu_mem_gb=torch.cuda.max_memory_allocated() / 2**30 if cuda else None, gen_peak_gpu_mem_gb=gen_mem,
                info=f"{name}; N={n_params/1e6:.1f}M params; MFU uses 6*N*tokens (attention FLOPs not counted) over "
                     f"{peak if peak else '?'} TFLOP/s ({peak_src})")


@arm("matmul_peak")
def matmul_peak(p):
    "This machine's measured matmul throughput (GFLOP/s), fp32 and bf16, at the arms' thread count: MFU's denominator."
    C.set_threads(p["threads"])
    return {f"{dt}_gflops": max(F.measure_matmul_peak(dt, n, seconds=p.get("seconds", 1.5)) for n in (1024, 2048))
            for dt in ("float32", "bfloat16")}


# ----------------------------------------------------------------------------------------------------------------
def main(argv):
    name, params = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    if name not in ARMS: raise SystemExit(f"unknown arm {name!r}; known: {', '.join(sorted(ARMS))}")
    C.WORK.mkdir(parents=True, exist_ok=True)
    try: res = ARMS[name](params)
    except Unavailable as e: res = {"unavailable": str(e)}
    res.update(arm=name)
    C.emit(res)


if __name__ == "__main__":
    main(sys.argv[1:])

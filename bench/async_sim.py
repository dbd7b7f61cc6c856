"""Seconds per RL step of synchronous, one-step-off and fully asynchronous training on a cluster, on paper: a small
discrete-event simulator with long-tailed response lengths, checked against this machine's measured step and against
verl's published one-step-off and fully-async figures.

    python bench/async_sim.py                      # every scenario (< 30 s on 2 cores)
    python bench/async_sim.py --measured_ratio 1.7 # put the measured Ray ratio beside the 2-core prediction

Writes bench/results_async_sim.json, bench/results_async_sim.md and bench/results_async_sim.png.

The model, in one paragraph. A sampler pool is `sampler_engines` inference engines of `engine_gpus` GPUs each; an
engine runs at most `slots` sequences at once (continuous batching: a freed slot takes the next waiting sequence).
One decode step costs `step_base_s + step_per_seq_s * active`, so an engine's time for a set of sequences is
`makespan_steps * step_base_s + step_per_seq_s * tokens`: the first term is the straggler (an engine waits for its
longest sequence however few others are left), the second the throughput. Response lengths are lognormal, capped at
`max_len`. Training costs seconds per token, divided by the trainer's GPUs (`train_scaling` = 1: proportional).
Colocated runs use every GPU for each phase in turn and pay `switch_s` per step; split runs pay `sync_s` per weight
sync and run each pool `split_slowdown` times slower than the whole machine would (1 on a GPU cluster; about 1.6-2 on
a 2-core CPU split 1+1).

`predict_partial` models rlhf_nb's partial rollouts (max_staleness 1, two batches in flight, chunked decoding) on
this machine's 1+1 Ray split at chunk granularity, from a measured synchronous step; bench/async_ray.py --partial
puts it beside the measured arms (bench/results_partial.md)."""
import argparse, heapq, json, math, textwrap, time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@dataclass(frozen=True)
class Cluster:
    "One setup: the pools, the batch, the length distribution and the cost of each phase."
    name: str = "toy"
    sampler_engines: int = 1          # engines in the split sampler pool
    engine_gpus: int = 1              # GPUs per engine (tensor parallel)
    trainer_gpus: int = 1             # GPUs of the split trainer pool
    colocated_gpus: int = 0           # GPUs of a colocated run; 0 = sampler GPUs + trainer GPUs
    prompts: int = 8                  # B prompts per step
    samples: int = 4                  # n samples per prompt (a group: trained on together)
    slots: int = 256                  # sequences an engine runs at once
    len_median: float = 100.0         # response tokens, median of the lognormal
    len_sigma: float = 0.0            # 0 = every response has len_median tokens
    max_len: int = 1000               # responses are cut at this length
    prompt_len: int = 0               # prompt tokens per sequence (trained on, not generated)
    prefill_steps: float = 1.0        # decode-step equivalents a sequence's prompt costs
    step_base_s: float = 0.01         # decode step with one sequence running
    step_per_seq_s: float = 0.0       # extra decode-step cost per running sequence
    train_tok_s: float = 1e-4         # policy update, seconds per token on train_ref_gpus GPUs
    logprob_tok_s: float = 0.0        # old log-prob recomputation, seconds per token on train_ref_gpus GPUs
    train_ref_gpus: int = 1           # the GPU count the two costs above were measured on
    train_scaling: float = 1.0        # training time ~ (train_ref_gpus / gpus) ** train_scaling
    overhead_s: float = 0.0           # trainer-side work per step that no mode hides (rewards, advantages, driver)
    sync_s: float = 0.0               # one weight sync between split pools
    switch_s: float = 0.0             # a colocated step's switch between generating and training
    split_slowdown: float = 1.0       # each split pool's compute, against the whole machine's
    async_logprob: bool = True        # fully async recomputes old log-probs (False: it trains on the sampler's)

    @property
    def colocated(self):
        "GPUs of the colocated run."
        return self.colocated_gpus or self.sampler_engines * self.engine_gpus + self.trainer_gpus


def draw_lengths(c, groups, rng):
    "Response lengths in tokens, shape (groups, samples): lognormal around len_median, cut at max_len."
    z = rng.standard_normal((groups, c.samples))
    return np.clip(np.rint(c.len_median * np.exp(c.len_sigma * z)), 1, c.max_len)


def makespan(lens, slots):
    "Decode steps an engine needs for `lens` (in arrival order) with `slots` sequences at a time."
    if len(lens) <= slots: return max(lens)
    free = list(lens[:slots]); heapq.heapify(free)
    for n in lens[slots:]: heapq.heapreplace(free, free[0] + n)   # the slot that frees first takes the next one
    return max(free)


def gen_parts(lens, c, engines):
    "Per engine: decode steps to finish its share of a batch and the decode work (steps x sequences) it does."
    steps = lens + c.prefill_steps
    mk = np.array([makespan(steps[e::engines].ravel().tolist(), c.slots) for e in range(engines)])
    return mk, np.array([steps[e::engines].sum() for e in range(engines)])


def engine_times(lens, c, engines, slow=1.0):
    "Seconds each engine spends on its share of a batch (groups dealt round-robin to the engines)."
    mk, work = gen_parts(lens, c, engines)
    return slow * (mk * c.step_base_s + work * c.step_per_seq_s)


def train_time(lens, c, gpus, slow=1.0, logprob=True):
    "Seconds to train on the sequences `lens` with `gpus` trainer GPUs."
    tokens = float((lens + c.prompt_len).sum())
    per_tok = c.train_tok_s + (c.logprob_tok_s if logprob else 0.0)
    return slow * tokens * per_tok * (c.train_ref_gpus / gpus) ** c.train_scaling


def _result(mode, ends, warmup, gen_busy, train_busy, engines, stale, **extra):
    "Seconds per step after warm-up, each pool's busy share of that time, and the staleness of the batches."
    ends = np.asarray(ends); w = max(1, min(warmup, len(ends) - 1))
    wall = ends[-1] - ends[w - 1]
    st = [np.atleast_1d(np.asarray(s, float)) for s in stale]      # per step: one staleness, or one per group
    after = np.concatenate(st[w:])
    return {"mode": mode, "step_s": float(wall / (len(ends) - w)), "sampler_util": float(np.sum(gen_busy[w:]) / engines / wall),
            "trainer_util": float(np.sum(train_busy[w:]) / wall), "staleness_mean": float(after.mean()),
            "staleness_max": int(np.concatenate(st).max()), "steps": len(ends), "warmup": w, **extra}


def simulate_sync(c, steps=30, seed=0, colocated=True, warmup=2):
    "Synchronous steps: generate a batch, then train on it; colocated on every GPU in turn, or on split pools."
    lens = draw_lengths(c, steps * c.prompts, np.random.default_rng(seed))
    engines = max(1, c.colocated // c.engine_gpus) if colocated else c.sampler_engines
    slow = 1.0 if colocated else c.split_slowdown
    gpus = c.colocated if colocated else c.trainer_gpus
    pause = c.switch_s if colocated else c.sync_s
    t, ends, gen_busy, gen_wall, train_busy = 0.0, [], [], [], []
    for j in range(steps):
        b = lens[j * c.prompts:(j + 1) * c.prompts]
        et = engine_times(b, c, engines, slow)
        tt = train_time(b, c, gpus, slow) + c.overhead_s
        t += (pause if j else 0.0) + et.max() + tt       # no weights to move before the first batch
        ends.append(t); gen_busy.append(et.sum()); gen_wall.append(et.max()); train_busy.append(tt)
    return _result("sync_colocated" if colocated else "sync_split", ends, warmup, gen_busy, train_busy, engines,
                   [0] * steps, gen_s=float(np.mean(gen_wall)), train_s=float(np.mean(train_busy)))


def simulate_one_step_off(c, steps=30, seed=0, warmup=2):
    "Split pools, the batch of step j sampled with weights j-1 while step j-1 trains; one sync per step on both sides."
    lens = draw_lengths(c, steps * c.prompts, np.random.default_rng(seed))
    batch = lambda j: lens[j * c.prompts:(j + 1) * c.prompts]
    et = [engine_times(batch(j), c, c.sampler_engines, c.split_slowdown) for j in range(steps)]
    tt = [train_time(batch(j), c, c.trainer_gpus, c.split_slowdown) + c.overhead_s for j in range(steps)]
    gen_end, train_end, ends = et[0].max(), 0.0, []
    for j in range(steps):
        # the trainer has batch j and the sampler is free: both take part in the sync, then the sampler starts
        # batch j+1 with the weights the trainer had before this step while the trainer trains step j
        start = max(gen_end, train_end) + (c.sync_s if j else 0.0)
        if j + 1 < steps: gen_end = start + et[j + 1].max()
        train_end = start + tt[j]; ends.append(train_end)
    return _result("one_step_off", ends, warmup, [e.sum() for e in et], tt, c.sampler_engines,
                   [min(j, 1) for j in range(steps)], gen_s=float(np.mean([e.max() for e in et])), train_s=float(np.mean(tt)))


def _chunk_cost(rows, tokens, per_row):
    "Seconds-free cost of decoding `tokens` tokens for `rows` rows (+ one step of prefill): per row, or per step."
    return (tokens + 1) * (rows if per_row else 1)


def _partial_sampler(lens, chunk, per_row, start_ok):
    """The partial-rollout producer of rlhf_nb.async_rl at chunk granularity (max_staleness 1, two batches in flight):
    -> per batch, its finish time in cost units given `start_ok(version, t)` (the time version `version` is published)."""
    t, pool, done, j, n = 0.0, [], {}, 0, len(lens)
    while pool or j < n:
        if not pool or (len(pool) == 1 and 2 * sum(pool[0][1] > 0) <= len(lens[pool[0][0]]) and j < n):
            pool.append([j, np.array(lens[j], float)]); j += 1
        t = max(t, start_ok(max(0, pool[-1][0] - 1), t))                 # the version the newest batch needs (0-based steps)
        for b in pool:
            left = b[1]
            if (left > 0).any():
                step = min(chunk, left[left > 0].max()); t += _chunk_cost(int((left > 0).sum()), step, per_row)
                b[1] = np.where(left > 0, np.maximum(left - step, 0), 0)
        while pool and not (pool[0][1] > 0).any(): done[pool.pop(0)[0]] = t
    return done


def predict_partial(t_gen, t_train, lens, chunk):
    """Seconds per step of synchronous, one-step-off and one-step-off + partial rollouts on a 1+1 split, from the
    synchronous arm's T_gen (sampling wait) and T_train, for the response lengths `lens` (one array per step). A
    static batch decodes all its rows to its longest; decode cost is either per row and token (`per_row`) or per
    token step; the two give a range, each calibrated so the static batches cost T_gen on average."""
    out = {}
    for per_row in (True, False):
        static = [_chunk_cost(len(L), max(L), per_row) for L in lens]
        unit = t_gen / np.mean(static)
        g = [x * unit for x in static]
        sync = np.mean(g) + t_train
        t_gen_end, t_tr, ends = g[0], 0.0, []                             # one-step-off, as simulate_one_step_off
        for j in range(len(lens)):
            start = max(t_gen_end, t_tr)
            if j + 1 < len(lens): t_gen_end = start + g[j + 1]
            t_tr = start + t_train; ends.append(t_tr)
        pub = {}                                                          # partial: when the trainer publishes each version
        for _ in range(len(lens) + 2):                                    # a fixed point of: batch done -> step ends -> version out
            done = _partial_sampler(lens, chunk, per_row, lambda v, t: pub.get(v, 0.0) / unit)
            tr, pub_new = 0.0, {}
            for j in range(len(lens)):
                tr = max(tr, done[j] * unit) + t_train; pub_new[j + 1] = tr
            if pub_new == pub: break
            pub = pub_new
        w = min(2, len(lens) - 1)
        per = lambda e: (e[-1] - e[w - 1]) / (len(e) - w)
        key = "per_row" if per_row else "per_step"
        out[key] = {"synchronous": float(sync), "one-step-off": float(per(ends)), "one-step-off + partial": float(per([pub[j + 1] for j in range(len(lens))]))}
    return out

class _Stream:
    "A fully asynchronous run as events: engines decoding, a queue of finished groups, a trainer and weight syncs."

    def __init__(self, c, lens, steps, k, partial, updates, strict=False):
        "Engines idle and empty, no group admitted, weights version 0 everywhere."
        if c.prompts % updates: raise ValueError(f"prompts {c.prompts} is not a multiple of updates_per_sync {updates}")
        E = c.sampler_engines
        self.c, self.lens, self.steps, self.k, self.K, self.partial, self.u = c, lens, steps, k, math.ceil(k - 1e-9), partial, updates
        self.base, self.per = c.split_slowdown * c.step_base_s, c.split_slowdown * c.step_per_seq_s
        self.prog, self.t_last, self.active, self.busy = [0.0] * E, [0.0] * E, [0] * E, [0.0] * E
        self.runs, self.stamp, self.n_active = [[] for _ in range(E)], [0] * E, 0
        # plain lists: these are touched once per event, where numpy scalars cost more than they save
        self.ver, self.left, self.span = [0] * len(lens), [c.samples] * len(lens), [0] * len(lens)
        self.rows = lens.tolist()
        self.adm_by_ver, self.con_by_ver = [0] * (steps + 2), [0] * (steps + 2)
        self.w = self.admitted = self.period = self.chunk = self.pending = 0
        self.paused = self.draining = False
        self.trainer, self.train_busy, self.blocked, self.strict = "idle", 0.0, False, strict
        self.done, self.events, self.n_ev = [], [], 0
        self.ends, self.gen_at, self.train_at, self.stale, self.spans = [], [], [], [[] for _ in range(steps)], []

    def push(self, t, kind, a=0, b=0):
        "Queue an event: 0 a sequence finishes on engine a (valid while its stamp is b), 1 a chunk trained, 2 a sync done."
        heapq.heappush(self.events, (t, self.n_ev, kind, a, b)); self.n_ev += 1

    def advance(self, e, t):
        "Bring engine e's decode progress up to time t."
        if self.active[e] and not self.paused:
            dt = t - self.t_last[e]
            self.prog[e] += dt / (self.base + self.per * self.active[e]); self.busy[e] += dt
        self.t_last[e] = t

    def schedule(self, e):
        "Queue engine e's next finishing sequence (an earlier event for e becomes stale)."
        self.stamp[e] += 1
        if self.active[e] and not self.paused:
            need = max(0.0, self.runs[e][0][0] - self.prog[e])
            self.push(self.t_last[e] + need * (self.base + self.per * self.active[e]), 0, e, self.stamp[e])

    def admit(self, t):
        "Start whole groups on the engines with the most free slots, up to the staleness cap of the weights held."
        if self.paused or self.draining: return
        c, touched = self.c, set()
        cap = min(len(self.lens), int(math.floor((self.w + 1 + self.k) * c.prompts + 1e-9)))
        while self.admitted < cap:
            e = min(range(c.sampler_engines), key=self.active.__getitem__)
            if c.slots - self.active[e] < c.samples: break
            if e not in touched: self.advance(e, t); touched.add(e)
            g = self.admitted; self.ver[g] = self.w; self.adm_by_ver[self.w] += 1; self.admitted += 1
            for n in self.rows[g]: heapq.heappush(self.runs[e], (self.prog[e] + n + c.prefill_steps, g))
            self.active[e] += c.samples; self.n_active += c.samples
        for e in touched: self.schedule(e)

    def on_seq(self, t, e, stamp):
        "Sequences finishing on engine e: a group whose last sequence ends joins the queue."
        if stamp != self.stamp[e]: return
        self.advance(e, t); runs = self.runs[e]
        while runs and runs[0][0] <= self.prog[e] + 1e-6:
            g = heapq.heappop(runs)[1]; self.active[e] -= 1; self.n_active -= 1; self.left[g] -= 1
            if not self.left[g]:
                self.span[g] = self.w - self.ver[g]          # weight versions its tokens span (partial rollout)
                heapq.heappush(self.done, (self.ver[g], t, g))
                self.blocked &= self.ver[g] == self.w        # only an older group can unblock the trainer
        self.schedule(e)
        if self.draining and not self.n_active: self.start_sync(t)
        self.admit(t); self.train(t)

    def bound_ok(self, pick):
        "Whether taking `pick` now still lets every older group be trained on within k versions of its weights."
        j, ci, B, u, K = self.period, self.chunk % self.u, self.c.prompts, self.u, self.K
        con, unc = list(self.con_by_ver), 0
        for v, _, _ in pick: con[v] += 1
        for x in range(self.w):                              # versions no group can be started with any more
            unc += self.adm_by_ver[x] - con[x]
            # groups of versions <= x must be trained on by period x+K: what is left must fit the chunks until then
            if x >= j - K and unc * u > ((x + K - j) * u + (u - 1 - ci)) * B: return False
        return True

    def train(self, t):
        "Train on the next chunk of finished groups (oldest weights first) when the trainer is free and the bound allows."
        size = self.c.prompts // self.u
        if self.trainer != "idle" or self.blocked or self.period >= self.steps or len(self.done) < size: return
        pick = [heapq.heappop(self.done) for _ in range(size)]
        if self.strict and not self.bound_ok(pick):          # an older group still runs: wait for it
            for p in pick: heapq.heappush(self.done, p)
            self.blocked = True
            return
        for v, _, g in pick:
            self.con_by_ver[v] += 1; self.stale[self.period].append(self.period - v); self.spans.append(self.span[g])
        c = self.c
        dt = train_time(self.lens[[g for _, _, g in pick]], c, c.trainer_gpus, c.split_slowdown, c.async_logprob) + c.overhead_s / self.u
        self.train_busy += dt; self.trainer = "train"; self.push(t + dt, 1)

    def on_trained(self, t):
        "A chunk is trained: after updates_per_sync chunks the new weights go to the sampler."
        self.chunk += 1
        if self.chunk % self.u: self.trainer = "idle"; self.train(t); return
        self.trainer, self.pending = "sync", self.period + 1
        if self.partial: self.start_sync(t)                  # interrupt: in-flight sequences go on with new weights
        else:
            self.draining = True                             # finish what runs (the straggler) before loading weights
            if not self.n_active: self.start_sync(t)

    def start_sync(self, t):
        "Pause every engine for the weight sync."
        for e in range(self.c.sampler_engines): self.advance(e, t)
        self.paused, self.draining = True, False
        self.stamp = [s + 1 for s in self.stamp]
        self.push(t + self.c.sync_s, 2)

    def on_synced(self, t):
        "The sampler holds the new weights: resume the engines, admit, train."
        self.paused, self.w, self.blocked = False, self.pending, False
        self.period += 1; self.ends.append(t); self.gen_at.append(sum(self.busy)); self.train_at.append(self.train_busy)
        for e in range(self.c.sampler_engines): self.t_last[e] = t; self.schedule(e)
        self.trainer = "idle"; self.admit(t); self.train(t)

    def run(self):
        "Run events until `steps` weight versions have been trained and synced."
        self.admit(0.0)
        handlers = (lambda t, a, b: self.on_seq(t, a, b), lambda t, a, b: self.on_trained(t), lambda t, a, b: self.on_synced(t))
        while self.period < self.steps:
            if not self.events: raise RuntimeError("the simulated run stalled")
            t, _, kind, a, b = heapq.heappop(self.events)
            handlers[kind](t, a, b)
        return self


def simulate_fully_async(c, steps=30, seed=0, k=1, partial=True, updates_per_sync=1, strict=False, warmup=None):
    "Samplers stream groups to a queue; the trainer takes B groups per weight version, k bounding how far ahead they run."
    # The sampler holding weights w starts at most (w + 1 + k) * B groups in all (verl's staleness_threshold, AReaL's
    # cap). strict: besides, no group is trained on more than ceil(k) versions after the weights it started with, so
    # the trainer waits for an old straggler; not strict: only the cap, and a partial rollout can go older.
    groups = (steps + math.ceil(k) + 2) * c.prompts
    lens = draw_lengths(c, groups, np.random.default_rng(seed))
    s = _Stream(c, lens, steps, k, partial, updates_per_sync, strict).run()
    warmup = max(2, math.ceil(k) + 1) if warmup is None else warmup
    gen = np.diff([0.0] + s.gen_at); tr = np.diff([0.0] + s.train_at)
    spans = np.asarray(s.spans)
    mode = "fully_async_partial" if partial else "fully_async"
    return _result(mode, s.ends, warmup, gen, tr, c.sampler_engines, s.stale, k=k, updates_per_sync=updates_per_sync, strict=strict,
                   span_mean=float(spans.mean()), span_max=int(spans.max()))


def calibrate(c, gen_s, update_s, logprob_s=0.0, steps=20, seed=0):
    "Fit step_per_seq_s and the trainer's per-token costs so a colocated sync run takes the measured gen and train times."
    lens = draw_lengths(c, steps * c.prompts, np.random.default_rng(seed))       # the batches simulate_sync draws
    engines = max(1, c.colocated // c.engine_gpus)
    parts = [gen_parts(lens[j * c.prompts:(j + 1) * c.prompts], c, engines) for j in range(steps)]
    gen = lambda per: float(np.mean([(mk * c.step_base_s + wk * per).max() for mk, wk in parts]))
    lo, hi = 0.0, 1.0
    if gen(0.0) >= gen_s: hi = 0.0                     # the straggler alone is already this slow: no throughput term
    for _ in range(60 if hi else 0):                     # gen() grows with the per-sequence cost: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gen(mid) < gen_s else (lo, mid)
    tokens = float((lens + c.prompt_len).sum()) / steps
    return replace(c, step_per_seq_s=hi, train_tok_s=update_s / tokens, logprob_tok_s=logprob_s / tokens,
                   train_ref_gpus=c.colocated)


def run_mode(c, spec, steps, seed):
    "One mode of a scenario: spec is (label, kind, options); options may override cluster fields under 'cluster'."
    label, kind, kw = spec
    kw = dict(kw); c = replace(c, **kw.pop("cluster", {}))
    if kind == "sync": r = simulate_sync(c, steps, seed, **kw)
    elif kind == "one_step_off": r = simulate_one_step_off(c, steps, seed, **kw)
    else: r = simulate_fully_async(c, steps, seed, **kw)
    return {"label": label, **r}


# What verl's docs report (docs/advance/one_step_off.md and docs/advance/fully_async.md, volcengine/verl at the
# commit below). Step times are seconds per step (means over the run); totals are the runs' wall times.
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
VERL = {
    "one_step_off_fsdp2": {
        "doc": "docs/advance/one_step_off.md", "model": "Qwen2.5-Math-7B", "hardware": "2 nodes x 8 H20 = 16 GPUs",
        "split": "4 GPUs generate, 12 train (colocated baseline: all 16)", "max_response_length": 20480,
        "algorithm": "DAPO", "engines": "vLLM + FSDP2",
        "colocated": {"step_s": 749, "gen_s": 321, "generate_sequences_s": 247, "old_log_prob_s": 88, "update_actor_s": 286, "total": "19h18m"},
        "one_step_off": {"step_s": 520, "wait_prev_gen_s": 45, "generate_sequences_s": 458, "old_log_prob_s": 108, "update_actor_s": 337, "total": "15h34m"},
        "speedup_total": round((19 * 60 + 18) / (15 * 60 + 34), 3), "speedup_step": round(749 / 520, 3), "reported": "1.24x (+23%)"},
    "one_step_off_megatron": {
        "doc": "docs/advance/one_step_off.md", "model": "Qwen2.5-Math-7B", "hardware": "2 nodes x 8 H20 = 16 GPUs",
        "split": "4 GPUs generate, 12 train (colocated baseline: all 16)", "max_response_length": 8192,
        "algorithm": "DAPO", "engines": "vLLM + Megatron",
        "colocated": {"step_s": 699, "gen_s": 207, "generate_sequences_s": 162, "old_log_prob_s": 119, "update_actor_s": 344, "total": "18h21m"},
        "one_step_off": {"step_s": 566, "wait_prev_gen_s": 59, "generate_sequences_s": 501, "old_log_prob_s": 120, "update_actor_s": 347, "total": "13h06m"},
        "speedup_total": round((18 * 60 + 21) / (13 * 60 + 6), 3), "speedup_step": round(699 / 566, 3), "reported": "1.40x (+40%)"},
    "fully_async_128": {
        "doc": "docs/advance/fully_async.md", "model": "Qwen2.5-Math-7B", "hardware": "128 H20",
        "split": "64 GPUs generate, 64 train (colocated baseline: all 128)", "max_response_length": 28 * 1024,
        "algorithm": "DAPO", "engines": "vLLM + FSDP2", "rollout_n": 16, "ppo_mini_batch_size": 32,
        "require_batches": 4, "trigger_parameter_sync_step": 4, "staleness_threshold": 0.5, "partial_rollout": True,
        "colocated": {"step_s": 356.30, "gen_s": 177.85, "old_log_prob_s": 53.92, "update_actor_s": 113.81, "total_400": "1d16h48m"},
        "colocated_64": {"step_s": 365.28, "gen_s": 150.72, "old_log_prob_s": 70.26, "update_actor_s": 133.41},
        "stream_k0": {"step_s": 231.34, "gen_s": 128.47, "update_actor_s": 98.77},
        "partial_k0.1": {"step_s": 171.30, "gen_s": 58.17, "update_actor_s": 109.12},
        "partial_k0.3": {"step_s": 146.11, "gen_s": 38.88, "update_actor_s": 103.22},
        "partial_k0.5": {"step_s": 150.63, "gen_s": 33.14, "update_actor_s": 113.16, "total_400": "17h22m"},
        "speedup_total": [2.35, 2.67], "speedup_step": round(356.30 / 150.63, 3), "reported": "2.35x (400 steps) to 2.67x (100 steps)"},
}

# Assumptions the verl scenarios share where the docs give no number (each is written into the results).
ASSUME_7B = {
    "prompts": "512 prompts per step (train_batch_size in the fully-async doc and in verl's one-step-off recipe scripts)",
    "slots": "256 sequences per engine at once (verl's rollout default max_num_seqs)",
    "lengths": "response lengths lognormal, median 1,500 tokens, sigma 1.0 (mean ~2,500), cut at max_response_length",
    "prompt_len": "256 prompt tokens per sequence",
    "step_base_s": "5 ms per decode step with one sequence running (a 7B engine on H20, weights read from HBM plus launch overhead)",
    "step_per_seq_s": "fitted so the colocated run's simulated generation time equals the published one",
    "train": "update and old-log-prob costs per token fitted to the published colocated times; time ~ 1/GPUs",
}


def machine_scenario(split_slowdown=1.8):
    "This 2-core machine at the demo size: bench/results_rollout.md's hf step, split 1+1 for the asynchronous modes."
    gen_s, train_s, tokens = 0.211, 0.222, 16 * 8 * 16
    c = Cluster(name="machine_2core", sampler_engines=1, engine_gpus=1, trainer_gpus=1, colocated_gpus=1, prompts=16,
                samples=8, slots=1024, len_median=16, len_sigma=0.0, max_len=16, prefill_steps=1.0,
                step_base_s=gen_s / 17, train_tok_s=train_s / tokens, train_ref_gpus=1, sync_s=0.0416,
                split_slowdown=split_slowdown)
    return {"name": c.name, "title": "This machine: 2 CPU cores, demo size (16 prompts x 8 x 16 tokens, hf engine)",
            "cluster": c, "modes": [("sync_colocated", "sync", {"colocated": True}),
                                    # on a CPU the waiting side's core can go to the working side: no slowdown
                                    ("sync_split core lent", "sync", {"colocated": False, "cluster": {"split_slowdown": 1.0}}),
                                    ("sync_split", "sync", {"colocated": False}),
                                    ("one_step_off", "one_step_off", {}),
                                    ("fully_async_partial k=1", "async", {"k": 1, "partial": True})],
            "published": {"sync_colocated": 0.434}, "published_source": "bench/results_rollout.md (hf, demo, step_s)",
            "assumptions": {"units": "one unit = the whole machine; a split pool gets 1 core and runs split_slowdown x slower",
                            "lengths": "every completion runs to its 16-token limit (random init), prefill = one decode step",
                            "sync_s": "0.0416 s: the measured weight load into another process at demo size ('server' row)",
                            "split_slowdown": f"{split_slowdown} (1 core instead of 2 for each side; 1.6-2 plausible)"}}


def _verl_7b(name, doc, engines, tp, trainer, colocated, samples, max_len, sync_s, switch_s, **kw):
    "A verl 7B setup calibrated to its published colocated row."
    d = VERL[name]["colocated"]
    gen = d.get("generate_sequences_s", d["gen_s"])
    overhead = d["step_s"] - d["gen_s"] - d["old_log_prob_s"] - d["update_actor_s"]
    c = Cluster(name=f"verl_{name}", sampler_engines=engines, engine_gpus=tp, trainer_gpus=trainer, colocated_gpus=colocated,
                prompts=512, samples=samples, slots=256, len_median=1500, len_sigma=1.0, max_len=max_len, prompt_len=256,
                prefill_steps=1.0, step_base_s=0.005, sync_s=sync_s, switch_s=switch_s, overhead_s=overhead, **kw)
    return calibrate(c, gen, d["update_actor_s"], d["old_log_prob_s"])


def verl_scenarios():
    "verl's one-step-off (16 H20, FSDP2 and Megatron) and fully-async (128 H20) setups, calibrated to their baselines."
    out = []
    for name, max_len in (("one_step_off_fsdp2", 20480), ("one_step_off_megatron", 8192)):
        d = VERL[name]
        c = _verl_7b(name, d["doc"], engines=2, tp=2, trainer=12, colocated=16, samples=12, max_len=max_len, sync_s=0.3,
                     switch_s=d["colocated"]["gen_s"] - d["colocated"]["generate_sequences_s"])
        out.append({"name": c.name, "title": f"verl one-step-off, {d['engines']}, 16 H20 (4 generate + 12 train), 7B", "cluster": c,
                    "modes": [("sync_colocated", "sync", {"colocated": True}), ("one_step_off", "one_step_off", {}),
                              ("fully_async k=1", "async", {"k": 1, "partial": False}),
                              ("fully_async_partial k=1", "async", {"k": 1, "partial": True}),
                              ("fully_async_partial k=1 strict", "async", {"k": 1, "partial": True, "strict": True})],
                    "published": {"sync_colocated": d["colocated"]["step_s"], "one_step_off": d["one_step_off"]["step_s"]},
                    "published_gen": {"one_step_off": d["one_step_off"]["generate_sequences_s"]},
                    "assumptions": {**ASSUME_7B, "n": "12 samples per prompt, tensor parallel 2 (verl's 4_12 recipe scripts)",
                                    "sync_s": "0.3 s (the doc's upper figure for its NCCL weight sync)",
                                    "switch_s": "colocated gen minus generate_sequences, paid only when colocated",
                                    "overhead_s": "colocated step minus gen, old_log_prob and update_actor, paid in every mode"}})
    d = VERL["fully_async_128"]
    alpha = math.log(d["colocated_64"]["update_actor_s"] / d["colocated"]["update_actor_s"]) / math.log(2)
    base = _verl_7b("fully_async_128", d["doc"], engines=16, tp=4, trainer=64, colocated=128, samples=16, max_len=28 * 1024,
                    sync_s=0.1, switch_s=0.0, async_logprob=False)
    a = {"updates_per_sync": 4}
    modes = [("sync_colocated", "sync", {"colocated": True}), ("one_step_off", "one_step_off", {}),
             ("stream k=0", "async", {"k": 0, "partial": False, **a}), ("fully_async k=0.5", "async", {"k": 0.5, "partial": False, **a}),
             ("fully_async_partial k=0.1", "async", {"k": 0.1, "partial": True, **a}),
             ("fully_async_partial k=0.3", "async", {"k": 0.3, "partial": True, **a}),
             ("fully_async_partial k=0.5", "async", {"k": 0.5, "partial": True, **a})]
    pub = {"sync_colocated": d["colocated"]["step_s"], "stream k=0": d["stream_k0"]["step_s"],
           "fully_async_partial k=0.1": d["partial_k0.1"]["step_s"], "fully_async_partial k=0.3": d["partial_k0.3"]["step_s"],
           "fully_async_partial k=0.5": d["partial_k0.5"]["step_s"]}
    assume = {**ASSUME_7B, "n": "16 samples per prompt (the doc), tensor parallel 4 (verl's fully-async 7B recipe scripts)",
              "sync_s": "0.1 s (the doc's checkpoint-engine table: 0.02-0.12 s for 7B on 4+4 GPUs)",
              "updates": "4 updates of 128 prompts per weight sync (require_batches 4 x ppo_mini_batch_size 32, trigger_parameter_sync_step 4)",
              "logprob": "the asynchronous modes train on the sampler's log-probs (use_rollout_log_probs): no old-log-prob pass",
              "switch_s": "0: the doc gives no generate_sequences split of gen for this run",
              "overhead_s": "colocated step minus gen, old_log_prob and update_actor, paid in every mode"}
    title = "verl fully async, 128 H20 (64 generate + 64 train), 7B"
    out.append({"name": base.name, "title": title + ", trainer time ~ 1/GPUs", "cluster": base, "modes": modes,
                "published": pub, "assumptions": assume})
    slow = replace(base, name=base.name + "_alpha", train_scaling=round(alpha, 3))
    out.append({"name": slow.name, "title": title + f", trainer time ~ 1/GPUs^{alpha:.2f} (the doc's 64- vs 128-GPU colocated rows)",
                "cluster": slow, "modes": [*modes[:4], modes[6], ("fully_async_partial k=0.5 strict", "async", {"k": 0.5, "partial": True, "strict": True, **a})],
                "published": pub,
                "assumptions": {**assume, "train": f"as above, but training time ~ (128/GPUs)^{alpha:.2f}: update_actor took "
                                f"{d['colocated_64']['update_actor_s']} s on 64 colocated GPUs and {d['colocated']['update_actor_s']} s on 128"}})
    return out


def run_scenario(sc, steps, seed):
    "Every mode of one scenario, its speedup over the colocated synchronous run, and the published figures beside it."
    c, pub = sc["cluster"], sc.get("published", {})
    rows = [run_mode(c, m, steps, seed) for m in sc["modes"]]
    base, pbase = rows[0]["step_s"], pub.get("sync_colocated")
    for r in rows:
        p = pub.get(r["label"])
        r.update(speedup=base / r["step_s"], published_step_s=p,
                 published_speedup=pbase / p if p and pbase else None,
                 published_gen_s=sc.get("published_gen", {}).get(r["label"]))
    return {"name": sc["name"], "title": sc["title"], "cluster": asdict(c), "assumptions": sc["assumptions"],
            "published_source": sc.get("published_source", "verl " + VERL_COMMIT[:10]), "results": rows}


def machine_check(split_slowdown, steps, seed, measured_ratio):
    "This machine: sync against one-step-off on a 1+1 split, the ideal ratio, and how the split's slowdown moves them."
    def ratios(s):
        "Sync over one-step-off step times at split_slowdown s."
        r = {row["label"]: row["step_s"] for row in run_scenario(machine_scenario(s), steps, seed)["results"]}
        return {"sync_colocated_over_one_step_off": r["sync_colocated"] / r["one_step_off"],
                "sync_split_lent_over_one_step_off": r["sync_split core lent"] / r["one_step_off"],
                "sync_split_over_one_step_off": r["sync_split"] / r["one_step_off"],
                "one_step_off_over_sync_split_lent": r["one_step_off"] / r["sync_split core lent"],
                "one_step_off_over_sync_split": r["one_step_off"] / r["sync_split"]}
    out = run_scenario(machine_scenario(split_slowdown), steps, seed)
    tg, tt = 0.211, 0.222
    out["check"] = {"T_gen_s": tg, "T_train_s": tt, "ideal_ratio": (tg + tt) / max(tg, tt), "split_slowdown": split_slowdown,
                    **ratios(split_slowdown), "range": {str(s): ratios(s) for s in (1.6, 2.0)},
                    "measured_ratio": measured_ratio,
                    "measured_ratio_means": "one-step-off / sync seconds per step, both on the same Ray 1+1 split of this "
                                            "machine (the measured_ratio of bench/results_async.md)"}
    return out


def headline(res):
    "Predicted against published speedups for verl's setups, one row each."
    rows = []
    for sc in res:
        if not sc["name"].startswith("verl"): continue
        key = "one_step_off" if "one_step_off" in sc["name"] else "fully_async_partial k=0.5"
        r = next(r for r in sc["results"] if r["label"] == key)
        d = VERL[sc["name"].replace("verl_", "").replace("_alpha", "")]
        rows.append({"scenario": sc["name"], "mode": key, "predicted_step_s": r["step_s"], "published_step_s": r["published_step_s"],
                     "predicted_speedup": r["speedup"], "published_speedup_step": d["speedup_step"],
                     "published_speedup_total": d["speedup_total"], "published_reported": d["reported"]})
    return rows


def fit_base_to_split(c, split_gen_s, steps=20, seed=0):
    "The decode-step cost (and refitted per-sequence cost) at which the split pool's batch takes split_gen_s."
    lens = draw_lengths(c, steps * c.prompts, np.random.default_rng(seed))
    batches = [lens[j * c.prompts:(j + 1) * c.prompts] for j in range(steps)]
    col = [gen_parts(b, c, max(1, c.colocated // c.engine_gpus)) for b in batches]
    split = [gen_parts(b, c, c.sampler_engines) for b in batches]
    target = float(np.mean([(mk * c.step_base_s + wk * c.step_per_seq_s).max() for mk, wk in col]))
    mean_max = lambda parts, b, p: float(np.mean([(mk * b + wk * p).max() for mk, wk in parts]))

    def per_seq(b):
        "The per-sequence cost that keeps the colocated time at its published value for a base cost b."
        lo, hi = 0.0, 1.0
        for _ in range(50): lo, hi = ((lo + hi) / 2, hi) if mean_max(col, b, (lo + hi) / 2) < target else (lo, (lo + hi) / 2)
        return hi
    lo, hi = 0.0, target / float(np.mean([mk.max() for mk, _ in col]))   # base at most the whole colocated time
    for _ in range(40):                                  # the split time falls as more of the colocated time is straggler
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_max(split, mid, per_seq(mid)) * c.split_slowdown > split_gen_s else (lo, mid)
    return replace(c, name=c.name + "_fit", step_base_s=lo, step_per_seq_s=per_seq(lo))


def sampler_fit(sc, steps, seed):
    "For a one-step-off setup: refit the sampler to the published split-pool generate time and predict again."
    c = fit_base_to_split(sc["cluster"], sc["published_gen"]["one_step_off"], steps, seed)
    base, osp = simulate_sync(c, steps, seed)["step_s"], simulate_one_step_off(c, steps, seed)
    return {"step_base_s": c.step_base_s, "step_per_seq_s": c.step_per_seq_s, "one_step_off_step_s": osp["step_s"],
            "one_step_off_gen_s": osp["gen_s"], "one_step_off_train_s": osp["train_s"], "speedup": base / osp["step_s"]}


def _pct(a, b):
    "How far a is from b, in percent of b."
    return f"{abs(a - b) / b * 100:.0f} %"


def sentences(res):
    "One sentence per verl setup: how close the prediction comes to the published figure, and why it differs."
    by = {sc["name"]: {r["label"]: r for r in sc["results"]} | {"_fit": sc.get("sampler_fit")} for sc in res}
    out = {}
    for key in ("one_step_off_fsdp2", "one_step_off_megatron"):
        d, r, fit = VERL[key], by["verl_" + key]["one_step_off"], by["verl_" + key]["_fit"]
        col, osd = d["colocated"], d["one_step_off"]
        tr16 = col["old_log_prob_s"] + col["update_actor_s"]
        out[key] = (f"Predicted {r['speedup']:.2f}x against {d['speedup_step']:.2f}x (means of the step times) and "
                    f"{d['speedup_total']:.2f}x (total time, the doc's {d['reported'].split()[-1].strip('()')}). The 4-GPU sampler is predicted at "
                    f"{r['gen_s']:.0f} s per batch against {osd['generate_sequences_s']} s published; fitted to that figure "
                    f"(a {fit['step_base_s'] * 1e3:.1f} ms decode step) the prediction becomes {fit['speedup']:.2f}x, and what "
                    f"is left is the trainer: the simulator scales old_log_prob + update_actor from {tr16} s on 16 GPUs to "
                    f"{tr16 * 16 / 12:.0f} s on 12, where verl measured {osd['old_log_prob_s'] + osd['update_actor_s']} s.")
    d = VERL["fully_async_128"]
    r, ra = by["verl_fully_async_128"]["fully_async_partial k=0.5"], by["verl_fully_async_128_alpha"]["fully_async_partial k=0.5"]
    s0, s0a = by["verl_fully_async_128"]["stream k=0"], by["verl_fully_async_128_alpha"]["stream k=0"]
    c64, c128 = d["colocated_64"], d["colocated"]
    alpha = math.log(c64["update_actor_s"] / c128["update_actor_s"]) / math.log(2)
    out["fully_async_128"] = (
        f"Predicted {r['speedup']:.2f}x against {d['speedup_step']:.2f}x (step means) and {d['speedup_total'][0]}-"
        f"{d['speedup_total'][1]}x (total time over 400 and 100 steps), {_pct(r['speedup'], d['speedup_step'])} short: with "
        f"training time proportional to 1/GPUs the 64-GPU trainer is the bottleneck ({r['trainer_util']:.0%} busy), but "
        f"verl's update took {d['partial_k0.5']['update_actor_s']} s on 64 GPUs, no longer than the {c128['update_actor_s']} s "
        f"of the 128-GPU colocated run (its own colocated rows: {c64['update_actor_s']} s on 64 GPUs, {c128['update_actor_s']} s "
        f"on 128). Scaling training as those two rows do (time ~ GPUs^-{alpha:.2f}) gives {ra['speedup']:.2f}x, "
        f"{_pct(ra['speedup'], d['speedup_step'])} short of the step ratio; then the sampler is the bottleneck "
        f"({ra['sampler_util']:.0%} busy), the same under-estimate of a small pool's generation speed as in the FSDP2 "
        f"one-step-off run. Streaming alone (k=0, 4 updates per sync) is predicted at {s0['speedup']:.2f}x / {s0a['speedup']:.2f}x "
        f"against {c128['step_s'] / d['stream_k0']['step_s']:.2f}x published.")
    return out


def _f(x, nd=3):
    "A number for a table: rounded, or a dash."
    if x is None: return "-"
    if isinstance(x, (list, tuple)): return "-".join(_f(v, nd) for v in x)
    return f"{x:.{nd}g}" if isinstance(x, float) else str(x)


def machine_md(m):
    "The 2-core table: predictions at split_slowdown, their range over 1.6-2.0, the measured figures beside them."
    ck, r = m["check"], {row["label"]: row for row in m["results"]}
    rg = ck["range"]
    span = lambda k: "{:.2f}-{:.2f}".format(*sorted((rg["1.6"][k], rg["2.0"][k])))
    meas = "(--measured_ratio)" if ck["measured_ratio"] is None else f"{ck['measured_ratio']:.3g} (Ray)"
    return [f"Inputs (bench/results_rollout.md, hf engine, demo size, both cores): T_gen = {ck['T_gen_s']} s, "
            f"T_train = {ck['T_train_s']} s, sync 0 (same process). Split 1+1 each side runs x{ck['split_slowdown']} slower "
            f"(`--split_slowdown`), a weight sync to the other process costs {m['cluster']['sync_s']} s.", "",
            "| quantity | predicted | over split_slowdown 1.6-2.0 | measured |", "|---|---|---|---|",
            f"| sync, colocated on 2 cores (s/step) | {r['sync_colocated']['step_s']:.3f} | | {r['sync_colocated']['published_step_s']} (hf step_s) |",
            f"| sync, 1+1 split, the waiting side's core lent to the working one (s/step) | {r['sync_split core lent']['step_s']:.3f} | | |",
            f"| sync, 1+1 split, each side held to its core (s/step) | {r['sync_split']['step_s']:.3f} | | |",
            f"| one-step-off, 1+1 split (s/step) | {r['one_step_off']['step_s']:.3f} | | |",
            f"| ideal ratio (T_gen + T_train) / max(T_gen, T_train) | {ck['ideal_ratio']:.2f} | | |",
            f"| sync colocated / one-step-off | {ck['sync_colocated_over_one_step_off']:.2f} | {span('sync_colocated_over_one_step_off')} | |",
            f"| sync / one-step-off, same split, core lent | {ck['sync_split_lent_over_one_step_off']:.2f} | {span('sync_split_lent_over_one_step_off')} | |",
            f"| sync / one-step-off, same split, cores held | {ck['sync_split_over_one_step_off']:.2f} | {span('sync_split_over_one_step_off')} | |",
            f"| **one-step-off / sync, same split** (core lent; cores held) | {ck['one_step_off_over_sync_split_lent']:.2f}; "
            f"{ck['one_step_off_over_sync_split']:.2f} | {span('one_step_off_over_sync_split_lent')}; {span('one_step_off_over_sync_split')} | {meas} |",
            "", "The measured figure to set beside the bold row is one-step-off / sync on the same Ray 1+1 split "
            "(bench/results_async.md's measured_ratio). Each Ray worker runs one torch thread (ray_cpus_per_worker 1), so the "
            "side that waits in a synchronous step does not lend its core to the side that works: the 'cores held' "
            "prediction applies. The measured ratio sits a little above it (0.55 without a correction, 0.62 with bypass, in "
            "results_async_nocorrection.md and results_async.md): the driver's bookkeeping and Ray's calls, which the "
            "simulator does not model, stay on the critical path. Were the threads free to move (one process, two "
            "threads), the 'core lent' row would apply instead, and one-step-off would gain little over a synchronous "
            "step that uses both cores for each phase."]


def scenario_md(sc):
    "One scenario's table: every mode, predicted and published."
    lines = [f"### {sc['title']}", "", "Assumptions: " + "; ".join(f"{k}: {v}" for k, v in sc["assumptions"].items()) + ".", "",
             "| mode | s/step | speedup | published (measured) s/step | published speedup | gen s/batch (published) | sampler busy | trainer busy | staleness mean / max | span max |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sc["results"]:
        gen = f"{r['gen_s']:.4g}" + (f" ({r['published_gen_s']})" if r.get("published_gen_s") else "") if r.get("gen_s") else "-"
        lines.append(f"| {r['label']} | {r['step_s']:.4g} | {r['speedup']:.2f} | {_f(r['published_step_s'], 5)} | "
                     f"{_f(r['published_speedup'])} | {gen} | {r['sampler_util']:.0%} | {r['trainer_util']:.0%} | "
                     f"{r['staleness_mean']:.2f} / {r['staleness_max']} | {_f(r.get('span_max'))} |")
    if sc.get("sampler_fit"):
        f = sc["sampler_fit"]
        lines += ["", f"Sampler refitted to the published split generate time: decode step {f['step_base_s'] * 1e3:.2f} ms "
                      f"+ {f['step_per_seq_s'] * 1e6:.3g} us per running sequence; one-step-off {f['one_step_off_step_s']:.4g} s/step "
                      f"(gen {f['one_step_off_gen_s']:.4g} s, train {f['one_step_off_train_s']:.4g} s), speedup {f['speedup']:.2f}."]
    return lines + [""]


NOT_IN_DOCS = [
    "batch size and samples per prompt of the one-step-off runs (taken from verl's 4_12 recipe scripts: 512 prompts x 12)",
    "tensor parallelism of the rollout engines (recipe scripts: 2 for one-step-off, 4 for fully async) and max_num_seqs",
    "the response-length distribution: only the maximum is given, never the mean, median or tail",
    "the decode speed of a 7B engine on H20, and the prompt lengths",
    "the weight-sync time at 64+64 GPUs (the checkpoint-engine table stops at 4+4 GPUs for 7B)",
    "how much of the fully-async colocated run's 'gen' is generation and how much reward or resharding",
    "step times of the staleness-0.5 mode without partial rollout: that row of the doc's table is empty",
    "why the one-step-off totals and the step means disagree: FSDP2 +23 % total but 749 / 520 = 1.44x per step, "
    "Megatron +40 % total but 699 / 566 = 1.24x per step",
]


def write_md(res, path, seconds):
    "bench/results_async_sim.md: the 2-core check, predicted against published for verl, then every scenario."
    m, verl = res["machine"], res["scenarios"]
    lines = ["# Asynchronous RL on paper: a discrete-event simulator", "",
             f"`python bench/async_sim.py` ({time.strftime('%Y-%m-%d %H:%M')}, {seconds:.1f} s; seed {res['seed']}, "
             f"{res['steps']} steps per run on this machine, {res['steps_verl']} for verl's setups, the first ones not timed).",
             "", "Engines decode up to `slots` sequences at once; a decode step costs a base plus a little per running sequence, "
             "so an engine waits for its longest sequence (the straggler). Lengths are lognormal and capped. Training costs "
             "seconds per token over the trainer's GPUs. `sync` generates then trains; `one_step_off` samples batch j+1 with "
             "weights one update old while step j trains, one weight sync per step on the critical path; `fully_async` streams "
             "groups of samples to a queue from which the trainer takes B groups per weight version, the sampler holding "
             "weights w starting at most (w + 1 + k) B groups; at a weight sync it first finishes what runs, or with partial "
             "rollout pauses and continues its sequences with the new weights. `strict` adds: no group trained on more than "
             "ceil(k) versions after the weights it started with (the trainer waits for such a straggler). Staleness = the "
             "trainer's weight version minus the version a group started with; span = versions a partial rollout's tokens cross.",
             "", "## This machine (2 CPU cores, demo size)", "", *machine_md(m), "",
             "## verl: predicted against published", "", f"verl's `docs/advance/one_step_off.md` and `docs/advance/fully_async.md` "
             f"at commit {VERL_COMMIT[:10]}; each setup is calibrated to its published colocated synchronous row, then the "
             "asynchronous modes are predicted.", "",
             "| setup | mode | predicted s/step | published s/step | predicted speedup | published (step means) | published (total time) |",
             "|---|---|---|---|---|---|---|"]
    for h in res["headline"]:
        lines.append(f"| {h['scenario']} | {h['mode']} | {h['predicted_step_s']:.4g} | {h['published_step_s']} | "
                     f"{h['predicted_speedup']:.2f} | {h['published_speedup_step']:.2f} | {h['published_reported']} |")
    lines += [""] + [f"- **{k}**: {v}" for k, v in res["sentences"].items()] + ["", "## Every scenario", ""]
    for sc in [m] + verl: lines += scenario_md(sc)
    lines += ["## What verl's docs do not give (the assumptions above stand in)", ""] + [f"- {x}" for x in NOT_IN_DOCS]
    Path(path).write_text("\n".join(lines) + "\n")


def plot(res, path):
    "Seconds per step by mode (published as black ticks) and staleness, one column per scenario."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scs = [res["machine"]] + res["scenarios"]
    fig, ax = plt.subplots(2, len(scs), figsize=(4.2 * len(scs), 7.5), gridspec_kw={"height_ratios": [3, 2]})
    for i, sc in enumerate(scs):
        rows = sc["results"]; y = np.arange(len(rows)); labels = [r["label"] for r in rows]
        ax[0, i].barh(y, [r["step_s"] for r in rows], color="tab:blue", label="predicted")
        pub = [(j, r["published_step_s"]) for j, r in enumerate(rows) if r["published_step_s"]]
        if pub: ax[0, i].plot([p for _, p in pub], [j for j, _ in pub], "k|", ms=18, mew=3, label="published / measured")
        ax[0, i].set_yticks(y, labels, fontsize=7); ax[0, i].invert_yaxis(); ax[0, i].set_xlabel("seconds per step")
        ax[0, i].set_title(textwrap.fill(sc["title"], 48), fontsize=8)
        ax[1, i].barh(y - 0.2, [r["staleness_mean"] for r in rows], 0.4, color="tab:orange", label="mean")
        ax[1, i].barh(y + 0.2, [r["staleness_max"] for r in rows], 0.4, color="tab:red", label="max")
        ax[1, i].set_yticks(y, labels, fontsize=7); ax[1, i].invert_yaxis(); ax[1, i].set_xlabel("staleness (weight versions)")
    handles = ax[0, 0].get_legend_handles_labels()[0] + ax[1, 0].get_legend_handles_labels()[0]
    fig.legend(handles, ["predicted", "published / measured", "staleness mean", "staleness max"], loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1)); fig.savefig(path, dpi=90); plt.close(fig)


def _jsonable(x):
    "numpy scalars to plain numbers for json."
    if isinstance(x, dict): return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)): return [_jsonable(v) for v in x]
    return x.item() if isinstance(x, np.generic) else x


def main(argv=None):
    "Run every scenario and write the json, md and png results."
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per run on this machine's setup")
    ap.add_argument("--steps_verl", type=int, default=20, help="steps per run for verl's setups (8192 sequences each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split_slowdown", type=float, default=1.8, help="each side of a 1+1 core split, against both cores")
    ap.add_argument("--measured_ratio", type=float, default=None, help="measured sync / one-step-off ratio (Ray, this machine)")
    ap.add_argument("--out", default=str(BENCH / "results_async_sim"), help="path of the results, without .json/.md/.png")
    ap.add_argument("--no_plot", action="store_true")
    ap.add_argument("--machine_only", action="store_true", help="only this machine's check (well under a second)")
    a = ap.parse_args(argv)
    t0, out = time.time(), Path(a.out)
    old = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    measured = old.get("measured_ratio") if a.measured_ratio is None else a.measured_ratio   # a ratio filled in by hand stays
    machine = machine_check(a.split_slowdown, a.steps, a.seed, measured)
    scenarios = []
    for sc in [] if a.machine_only else verl_scenarios():
        r = run_scenario(sc, a.steps_verl, a.seed)
        if sc.get("published_gen"): r["sampler_fit"] = sampler_fit(sc, a.steps_verl, a.seed)
        scenarios.append(r)
    if a.machine_only: scenarios = old.get("scenarios", [])      # keep verl's results from the last full run
    res = {"seed": a.seed, "steps": a.steps, "steps_verl": old.get("steps_verl", a.steps_verl) if a.machine_only else a.steps_verl,
           "measured_ratio": measured, "machine": machine, "scenarios": scenarios, "verl_published": VERL,
           "verl_commit": VERL_COMMIT, "not_in_verl_docs": NOT_IN_DOCS}
    res["headline"], res["sentences"] = (headline(scenarios), sentences(scenarios)) if scenarios else ([], {})
    out.with_suffix(".json").write_text(json.dumps(_jsonable(res), indent=1))
    write_md(res, out.with_suffix(".md"), time.time() - t0)
    if not a.no_plot: plot(res, out.with_suffix(".png"))
    for h in res["headline"]:
        print(f"{h['scenario']:32s} predicted {h['predicted_speedup']:.2f}x  published {h['published_speedup_step']:.2f}x "
              f"(step means), {h['published_reported']} (total time)")
    ck = machine["check"]
    print(f"this machine: one-step-off / sync on the 1+1 split {ck['one_step_off_over_sync_split_lent']:.2f} (core lent), "
          f"{ck['one_step_off_over_sync_split']:.2f} (cores held); ideal (T_gen+T_train)/max {ck['ideal_ratio']:.2f}"
          f"  ({time.time() - t0:.1f} s)")
    return res


if __name__ == "__main__":
    main()

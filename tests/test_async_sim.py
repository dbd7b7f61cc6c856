"The asynchronous-training simulator (bench/async_sim.py) against cases with closed-form answers."
import json, math, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import async_sim as S  # noqa: E402


def const(**kw):
    "Constant lengths, no per-sequence decode cost, no sync: every phase has a closed-form time."
    base = dict(sampler_engines=2, engine_gpus=1, trainer_gpus=2, colocated_gpus=4, prompts=8, samples=4, slots=64,
                len_median=50, len_sigma=0.0, max_len=50, prefill_steps=1.0, step_base_s=0.01, train_tok_s=1e-3,
                train_ref_gpus=2)
    return S.Cluster(**{**base, **kw})


def tail(**kw):
    "Long-tailed lengths, few slots, a per-sequence decode cost and a sync cost: the cases that have no closed form."
    return S.replace(const(len_sigma=1.0, max_len=2000, slots=16, step_per_seq_s=2e-4, train_tok_s=2e-4, sync_s=0.05,
                           prompts=16), **kw)


# const(): T_gen = (50 tokens + 1 prefill step) x 10 ms = 0.51 s; T_train = 8 x 4 x 50 tokens x 1 ms = 1.6 s on 2 GPUs
T_GEN, T_TRAIN = 0.51, 1.6


def test_makespan_fills_free_slots_first():
    assert S.makespan([3, 3, 3, 3], 2) == 6                      # two waves of two
    assert S.makespan([5, 1, 1, 1, 1, 1], 2) == 5                # the short ones go through the other slot
    assert S.makespan([7, 2], 8) == 7                            # fewer sequences than slots: the longest


def test_sync_is_gen_plus_train():
    assert S.simulate_sync(const(), colocated=False)["step_s"] == pytest.approx(T_GEN + T_TRAIN)
    # colocated: 4 GPUs = 4 engines (2 groups each, same 0.51 s) and a trainer twice as wide
    assert S.simulate_sync(const())["step_s"] == pytest.approx(T_GEN + T_TRAIN / 2)
    assert S.simulate_sync(const(sync_s=0.2), colocated=False)["step_s"] == pytest.approx(T_GEN + T_TRAIN + 0.2)
    assert S.simulate_sync(const(switch_s=0.3))["step_s"] == pytest.approx(T_GEN + T_TRAIN / 2 + 0.3)


@pytest.mark.parametrize("train_tok_s", [1e-3, 1e-4, 0.51 / 1600])
def test_one_step_off_is_the_slower_phase(train_tok_s):
    t_train = 1600 * train_tok_s
    r = S.simulate_one_step_off(const(train_tok_s=train_tok_s))
    assert r["step_s"] == pytest.approx(max(T_GEN, t_train))
    r = S.simulate_one_step_off(const(train_tok_s=train_tok_s, sync_s=0.05))
    assert r["step_s"] == pytest.approx(max(T_GEN, t_train) + 0.05)   # the sync sits on the critical path once per step


def test_ideal_ratio_when_phases_match():
    c = const(train_tok_s=T_GEN / 1600)                          # T_train = T_gen
    ratio = S.simulate_sync(c, colocated=False)["step_s"] / S.simulate_one_step_off(c)["step_s"]
    assert ratio == pytest.approx(2.0)


def test_one_step_off_staleness_is_one_after_the_first_step():
    r = S.simulate_one_step_off(tail(), steps=12, warmup=1)
    assert r["staleness_max"] == 1 and r["staleness_mean"] == 1.0
    assert S.simulate_sync(tail())["staleness_max"] == 0


def test_streaming_matches_the_batch_modes_on_constant_lengths():
    c = const()
    assert S.simulate_fully_async(c, k=0, partial=False)["step_s"] == pytest.approx(T_GEN + T_TRAIN)
    assert S.simulate_fully_async(c, k=1, partial=True)["step_s"] == pytest.approx(T_TRAIN)   # trainer-bound
    fast = const(train_tok_s=1e-4)                               # sampler-bound: k=1 runs two batches side by side
    assert S.simulate_fully_async(fast, k=0, partial=True)["step_s"] == pytest.approx(T_GEN + 0.16)
    assert S.simulate_fully_async(fast, k=1, partial=True)["step_s"] < S.simulate_one_step_off(fast)["step_s"]


@pytest.mark.parametrize("k", [0, 0.5, 1, 2])
def test_fully_async_staleness_never_exceeds_k(k):
    for seed in range(3):
        for partial, strict in ((False, False), (True, True)):
            r = S.simulate_fully_async(tail(), 16, seed, k=k, partial=partial, strict=strict, updates_per_sync=2)
            assert 0 <= r["staleness_mean"] <= k + 1e-9
            assert r["staleness_max"] <= math.ceil(k)
    slow_trainer = tail(train_tok_s=1e-3)                        # the sampler runs the full k versions ahead
    for partial, strict in ((False, False), (True, True)):
        assert S.simulate_fully_async(slow_trainer, 16, 0, k=k, partial=partial, strict=strict)["staleness_max"] == math.ceil(k)


def test_partial_rollout_never_slower():
    faster = 0
    for seed in range(3):
        for k in (0.5, 1, 2):
            a = S.simulate_fully_async(tail(), 16, seed, k=k, partial=True)["step_s"]
            b = S.simulate_fully_async(tail(), 16, seed, k=k, partial=False)["step_s"]
            assert a <= b + 1e-9
            faster += a < 0.95 * b
    assert faster >= 3                                           # and clearly faster where the straggler bites


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "fully_async", "fully_async_partial"])
def test_more_samplers_never_slower(mode):
    run = {"sync": lambda c: S.simulate_sync(c, 16, 1, colocated=False),
           "one_step_off": lambda c: S.simulate_one_step_off(c, 16, 1),
           "fully_async": lambda c: S.simulate_fully_async(c, 16, 1, k=1, partial=False),
           "fully_async_partial": lambda c: S.simulate_fully_async(c, 16, 1, k=1, partial=True)}[mode]
    steps = [run(tail(sampler_engines=e))["step_s"] for e in (1, 2, 4, 8)]
    assert all(b <= a + 1e-9 for a, b in zip(steps, steps[1:]))
    assert steps[-1] < steps[0]


def test_calibrate_reproduces_the_measured_phases():
    c = S.calibrate(tail(step_per_seq_s=0.0, colocated_gpus=4), gen_s=8.0, update_s=2.0, logprob_s=0.5, steps=10)
    r = S.simulate_sync(c, steps=10, warmup=1)
    assert r["gen_s"] == pytest.approx(8.0, rel=1e-6)
    assert r["train_s"] == pytest.approx(2.5, rel=1e-6)
    assert c.step_per_seq_s > 0


def test_machine_check_and_measured_ratio(tmp_path):
    out = tmp_path / "res"
    res = S.main(["--machine_only", "--no_plot", "--out", str(out)])
    ck = res["machine"]["check"]
    assert res["machine"]["results"][0]["step_s"] == pytest.approx(0.433)          # 0.211 + 0.222, measured 0.434
    assert ck["ideal_ratio"] == pytest.approx(0.433 / 0.222)
    assert ck["sync_split_over_one_step_off"] == pytest.approx((1.8 * 0.433 + 0.0416) / (1.8 * 0.222 + 0.0416))
    assert json.loads(out.with_suffix(".json").read_text())["measured_ratio"] is None
    S.main(["--machine_only", "--no_plot", "--out", str(out), "--measured_ratio", "1.7"])
    S.main(["--machine_only", "--no_plot", "--out", str(out)])                     # a later run keeps the figure
    assert json.loads(out.with_suffix(".json").read_text())["measured_ratio"] == 1.7
    assert "| 1.7 (Ray) |" in out.with_suffix(".md").read_text()

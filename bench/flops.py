"""Model FLOPs counted from the shapes, and the machine's measured matmul peak: the two halves of MFU.

For a decoder with L layers, hidden size h, MLP size f, q heads of size d (n_q·d = h), n_kv key/value heads and an output
head of V rows, one token's forward through the weights costs

    F_w = 2·L·(h·n_q·d + 2·h·n_kv·d + n_q·d·h + 3·h·f)   (q, k, v, o projections and the gated MLP)
    F_head = 2·h·V                                      (only for positions whose logits are computed)
    F_attn(c) = 4·L·n_q·d·c                              (scores q·kᵀ and the weighted sum of values over c keys)

so a forward over a sequence of T tokens is T·F_w + n_logits·F_head + F_attn summed over its positions (position t of a
causal sequence sees t keys: Σ t = T(T+1)/2). A backward costs twice its forward. Decoding one token with a KV cache of
c tokens costs F_w + F_head + F_attn(c). Every count below is of work actually done (an implementation that runs a
shared prompt once is charged once), so FLOPs / time / measured peak is the fraction of the machine a run used."""
from __future__ import annotations
import time


def dims(shape: dict):
    "(L, h, f, n_q·d, n_kv·d, V) from a Qwen2Config-like dict (defaults of rlhf_nb.models.TINY_DEFAULTS where absent)."
    h = shape.get("hidden_size", 128); nq = shape.get("num_attention_heads", 4)
    d = shape.get("head_dim") or h // nq
    return (shape.get("num_hidden_layers", 4), h, shape.get("intermediate_size", 512), nq * d,
            shape.get("num_key_value_heads", 2) * d, shape.get("vocab_size", 106))


def weight_flops(shape):
    "F_w: forward FLOPs per token through the layers' weights."
    L, h, f, q, kv, _ = dims(shape)
    return 2 * L * (h * q + 2 * h * kv + q * h + 3 * h * f)


def head_flops(shape):
    "F_head: forward FLOPs per position whose logits (or value) are computed."
    _, h, _, _, _, V = dims(shape)
    return 2 * h * V


def attn_flops(shape, keys):
    "F_attn summed over positions: `keys` = total number of (query, key) pairs."
    L, _, _, q, _, _ = dims(shape)
    return 4 * L * q * keys


def forward(shape, rows, T, n_logits, prefix=0, prefix_rows=None):
    """Forward FLOPs of `rows` sequences of T tokens with logits at `n_logits` positions each. With `prefix` > 0 the
    first `prefix` tokens are run once per `prefix_rows` groups (a shared prompt) and the rest per row."""
    pr = rows if prefix_rows is None else prefix_rows
    own = T - prefix
    toks = pr * prefix + rows * own
    keys = pr * prefix * (prefix + 1) // 2 + rows * (own * prefix + own * (own + 1) // 2)
    return toks * weight_flops(shape) + rows * n_logits * head_flops(shape) + attn_flops(shape, keys)


def generation(shape, rows, P, R, prefill_rows=None):
    "FLOPs of sampling R tokens for `rows` prompts of P tokens (prefill once per `prefill_rows` prompts, then R-1 decode steps)."
    pre = forward(shape, rows if prefill_rows is None else prefill_rows, P, 1)
    dec = sum(rows * (weight_flops(shape) + head_flops(shape)) + attn_flops(shape, rows * (P + i)) for i in range(1, R))
    return pre + dec


def train(shape, rows, T, n_logits, **kw):
    "Forward + backward (3× the forward)."
    return 3 * forward(shape, rows, T, n_logits, **kw)


def measure_matmul_peak(dtype="float32", n=2048, threads=None, seconds=2.0):
    "Measured GFLOP/s of an n×n×n matmul in `dtype` on this machine's CPU (or GPU when `device`='cuda')."
    import torch
    if threads: torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
    for _ in range(3): a @ b
    k, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b; k += 1
    return 2 * n ** 3 * k / (time.perf_counter() - t0) / 1e9

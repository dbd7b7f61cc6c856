"""Partial rollouts (`partial_rollout`, `rlhf_nb.async_rl`): responses decoded in chunks continue under newer weights.

- across a weight swap every token keeps the version that sampled it, and its behaviour log-prob equals a fresh fp32
  forward pass of those weights;
- with long-tailed (lognormal) lengths no token is older than `max_staleness` versions at the step that trains on it;
- a producer resumed from the batches a checkpoint keeps (and their `overlap`) replays the uninterrupted schedule;
- a run killed while saving a checkpoint and resumed equals the run never stopped (the CLI in a process of its own);
- `partial_rollout` with `max_staleness 0` is refused in one line.
"""
import math, random, signal

import pytest
import torch

from rlhf_nb.async_rl import (PartialBatch, PartialRolloutProducer, decode_chunk, partial_result, published_weights,
                              sampler_copy, token_age_metrics)
from rlhf_nb.rollout import Completion, SamplingParams
from test_resume import Run, cmd, checkpoints, assert_same_metrics, assert_same_weights, assert_same_samples
from test_async import rows


def fresh_logprobs(model, out, temperature=1.0):
    "Log-probs of `out`'s response tokens under `model` at `temperature`: one forward pass over prompt and response."
    ids, mask = torch.cat([out["prompts"], out["responses"]], 1), torch.cat([out["prompt_mask"], out["response_mask"]], 1)
    with torch.no_grad(): logits = model(ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    P = out["prompts"].shape[1]
    return torch.log_softmax(logits[:, P - 1:-1].float() / temperature, -1).gather(-1, out["responses"][..., None])[..., 0]


def test_versions_and_behaviour_logprobs_across_a_weight_swap():
    from rlhf_nb.models import char_tokenizer, tiny_causal_lm
    tok = char_tokenizer()
    a, b = tiny_causal_lm(tok, seed=1).eval(), tiny_causal_lm(tok, seed=2).eval()
    eng = sampler_copy(a, tok.eos_token_id, tok.pad_token_id)
    prompts = [tok(p)["input_ids"] for p in ("1+2=", "13*4=", "7-5=")]
    pb = decode_chunk(eng, PartialBatch(1, prompts, SamplingParams(5, temperature=0.9, seed=11)), 3)
    eng.update_weights(published_weights(b).items(), 1)              # a publish lands mid-response
    while not pb.finished: decode_chunk(eng, pb, 3)
    out, ver = partial_result(pb, tok.eos_token_id, tok.pad_token_id)
    m = out["response_mask"].bool()
    assert (ver[:, :3][m[:, :3]] == 0).all() and (ver[:, 3:][m[:, 3:]] == 1).all() and (ver[~m] == -1).all()
    assert (ver[m] == 1).any(), "no response continued past the swap"
    for v, model in ((0, a), (1, b)):
        sel = m & (ver == v)
        assert torch.allclose(out["rollout_log_probs"][sel], fresh_logprobs(model, out, 0.9)[sel], atol=1e-5, rtol=0)
    other = fresh_logprobs(a, out, 0.9)[m & (ver == 1)]                     # the old weights would give other numbers
    assert not torch.allclose(out["rollout_log_probs"][m & (ver == 1)], other, atol=1e-3)


class LognormalEngine:
    "A stand-in engine: the response of row r of step j ([j, r] as prompt) ends after a lognormal number of tokens."
    name, weight_version = "stand-in", 0
    def __init__(self, max_tokens, sigma=1.0):
        self.len = lambda j, r: max(1, min(max_tokens, round(math.exp(random.Random(j * 1000 + r).gauss(1.0, sigma)))))
    def generate(self, prompts, params):
        out = []
        for p in prompts:
            left = self.len(p[0], p[1]) - (len(p) - 2)
            n = min(params.max_tokens, left)
            out.append(Completion([100 + self.weight_version] * n, [-0.1 * self.weight_version] * n,
                                  "stop" if n == left else "length", self.weight_version))
        return out


def stand_in(s, first=1, last=10, ready=None, hold=0, loaded=0, rows=8, max_tokens=24, chunk=2):
    eng = LognormalEngine(max_tokens)
    def load(w, v): eng.weight_version = v
    begin = lambda j: PartialBatch(j, [[j, r] for r in range(rows)], SamplingParams(max_tokens))
    finish = lambda pb, overlap: {"step": pb.step, "tokens": pb.tokens, "versions": pb.versions, "overlap": overlap}
    eng.weight_version = loaded
    return PartialRolloutProducer(begin, lambda pb: decode_chunk(eng, pb, chunk), finish, load, s, hold=hold,
                                  first=first, last=last, loaded_version=loaded, ready=ready).start()


@pytest.mark.parametrize("s", [1, 2, 3])
def test_no_token_older_than_the_bound(s):
    p, got = stand_in(s), []
    for j in range(1, 11): got.append(p.take(j)); p.publish(j, f"w{j}")
    p.stop()
    assert [b["step"] for b in got] == list(range(1, 11))
    fresher = 0
    for b in got:
        ages = [(b["step"] - 1) - v for row in b["versions"] for v in row]
        assert min(ages) >= 0 and max(ages) <= s, (b["step"], sorted(set(ages)))
        fresher += min(ages) < min(s, b["step"] - 1)
    assert fresher >= 3, "the tails should run one version fresher beside the next batch"
    vs = torch.tensor([[3, 3, 4]]); assert token_age_metrics(5, vs, torch.ones(1, 3), 1) == {"async/token_age_0": 1 / 3, "async/token_age_1": 2 / 3}


def run_through(p, first, last):
    got = {}
    for j in range(first, last + 1): got[j] = p.take(j); p.publish(j, f"w{j}")
    return got


def test_resumed_producer_replays_the_schedule():
    "Stop after step n, keep `in_flight(n)` (with its overlap), resume: the same tokens and versions as never stopped."
    s, last = 1, 10
    p = stand_in(s, last=last); ref = run_through(p, 1, last); p.stop()
    held = 0
    for n in range(2, last - 1):
        p = stand_in(s, last=last); run_through(p, 1, n); ready = p.in_flight(n); p.stop()
        hold = ready[max(ready)]["overlap"]
        q = stand_in(s, first=n + 1 + len(ready), last=last, ready=ready, hold=hold, loaded=n)
        got = run_through(q, n + 1, last); q.stop()
        assert {j: (b["tokens"], b["versions"]) for j, b in got.items()} == \
               {j: (b["tokens"], b["versions"]) for j, b in ref.items() if j > n}, f"resumed after step {n}"
        held += hold > 0
    assert held, "no checkpoint had the next batch in flight: the test would not check `overlap`"


def eos_prone_policy(folder, k=1.8):
    "The tiny policy with its eos logit raised along the mean hidden state: responses of many lengths (a random one runs to the cap)."
    from rlhf_nb.models import char_tokenizer, tiny_causal_lm
    tok = char_tokenizer(); m = tiny_causal_lm(tok, seed=0).eval()
    ids = tok(["1+2=", "34*5=", "7-15=", "9+9="], return_tensors="pt", padding=True)
    with torch.no_grad():
        h = m(**ids, output_hidden_states=True).hidden_states[-1][ids["attention_mask"].bool()].mean(0)
        m.lm_head.weight[tok.eos_token_id] = 3 * k * h / h.norm() ** 2
    m.save_pretrained(folder); tok.save_pretrained(folder)
    return folder


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    "SIGKILL while checkpoint-2 is written, resume from checkpoint-1 and the batch it had in flight == never stopped."
    policy = eos_prone_policy(tmp_path / "policy")
    part = ["--model_name_or_path", policy, "--max_staleness", 1, "--partial_rollout", "true", "--partial_rollout_chunk", 2,
            "--max_completion_length", 8, "--max_steps", 4]
    ref_out, out = tmp_path / "ref", tmp_path / "run"
    ref = Run(cmd("grpo", ref_out, *part, "--save_total_limit", 100), ref_out)
    killed = Run(cmd("grpo", out, *part, "--save_total_limit", 2, kill_at=2), out)
    rc = killed.wait()
    assert rc == -signal.SIGKILL, f"the run was meant to die while saving checkpoint-2, exited {rc}:\n{killed.tail()}"
    assert checkpoints(out)[-1].name == "checkpoint-1" and (checkpoints(out)[-1] / "rollouts_in_flight.pt").exists()
    Run(cmd("grpo", out, *part, "--save_total_limit", 2, "--resume_from_checkpoint", "latest"), out).ok()
    ref.ok()
    got = [r for r in rows(ref_out) if r["step"] >= 1]
    assert all(r["async/token_age_0"] + r["async/token_age_1"] == pytest.approx(1.0) for r in got)
    assert any(0 < r["async/token_age_0"] < 1 for r in got[1:]), "no batch's tail continued under newer weights"
    assert_same_metrics(ref_out, out)
    assert_same_weights(ref_out, out)
    assert_same_samples(ref_out, out)


def test_partial_rollout_needs_staleness(tmp_path, capsys, monkeypatch):
    from rlhf_nb import launch
    monkeypatch.setenv("TQDM_DISABLE", "1"); monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
    out = tmp_path / "out"
    rc = launch.main(["grpo", "--output_dir", str(out), "--max_steps", "1", "--per_device_train_batch_size", "2",
                      "--num_generations", "2", "--max_completion_length", "2", "--eval_steps", "0",
                      "--arith_train_size", "4", "--partial_rollout", "true"])
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert rc == 2 and len(err) == 1 and "partial_rollout needs max_staleness >= 1" in err[0], (rc, err)
    assert not out.exists() or not any(out.iterdir())

"""The chunked LM head (rlhf_nb.chunked_head) inside the RL trainer gives the plain head's numbers.

Worker level: the actor's log-probs, entropies and parameter gradients (tied embeddings, a shared value head, a LoRA
policy) and the reference's log-probs (frozen copy, LoRA with the adapter disabled) with `logprob_chunk_size` equal
the plain forward's in float32 (1e-5). Trainer level: one GRPO step of the plain trainer gives the same metrics with
and without it. The option's refusals (with the fast paths, a bad size, a model that changes logits after the head)
are one line each."""
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from rlhf_nb.config import ConfigError
from rlhf_nb.models import char_tokenizer, tiny_causal_lm, wrap_lora
from rlhf_nb.workers import ActorRolloutWorker, Reference, RefPolicyWorker, sequence_positions
from rlhf_nb.rl_config import GRPOConfig

EPS = 1e-5


@pytest.fixture(scope="module")
def tok(): return char_tokenizer()


def rows(vocab, B=4, P=5, R=7, seed=0):
    "Left-padded prompts with right-padded responses, as the trainer's batches hold them."
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, vocab, (B, P + R), generator=g)
    mask = torch.ones(B, P + R, dtype=torch.long); mask[1, :2] = 0; mask[2, P + 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": sequence_positions(mask), "responses": ids[:, P:]}


def wcfg(chunk, entropy_coef=0.1):
    return SimpleNamespace(learning_rate=1e-3, weight_decay=0.0, lr_scheduler_type="constant", warmup_steps=0, max_steps=2,
                           max_completion_length=7, temperature=0.8, top_k=0, top_p=1.0, num_generations=2,
                           share_prompt_prefix=False, entropy_coef=entropy_coef, max_grad_norm=1.0, logprob_chunk_size=chunk)


def actor_out(policy, tok, chunk, value_head=False):
    w = ActorRolloutWorker(policy, tok, wcfg(chunk), Accelerator(cpu=True), value_head=value_head)
    d = rows(len(tok))
    lp, ent, v = w.forward(d, with_entropy=True)
    ((lp * torch.linspace(-1, 1, lp.shape[1])).sum() + 0.1 * ent.sum() + (0 if v is None else v.sum())).backward()
    grads = [p.grad.clone() for p in w.module.parameters() if p.grad is not None]
    return [lp.detach(), ent.detach()] + ([] if v is None else [v.detach()]), grads


@pytest.mark.parametrize("value_head,lora", [(False, False), (True, False), (False, True)])
def test_actor_forward_and_gradients_equal_plain(tok, value_head, lora):
    make = lambda: wrap_lora(tiny_causal_lm(tok, seed=0), r=4, alpha=8) if lora else tiny_causal_lm(tok, seed=0)
    torch.manual_seed(0); want, gw = actor_out(make(), tok, None, value_head)
    torch.manual_seed(0); got, gg = actor_out(make(), tok, 3, value_head)
    assert len(gw) == len(gg) > 0
    for a, b in zip(want + gw, got + gg): torch.testing.assert_close(b, a, atol=EPS, rtol=EPS)


def test_head_is_back_after_the_forward(tok):
    pol = tiny_causal_lm(tok, seed=0)
    w = ActorRolloutWorker(pol, tok, wcfg(4), Accelerator(cpu=True))
    w.compute_log_prob(rows(len(tok)))
    assert isinstance(pol.lm_head, torch.nn.Linear) and pol.lm_head.weight is pol.model.embed_tokens.weight


@pytest.mark.parametrize("strategy", ["copy", "peft"])
def test_reference_log_probs_equal_plain(tok, strategy):
    pol = tiny_causal_lm(tok, seed=1)
    if strategy == "peft": pol = wrap_lora(pol, r=4, alpha=8)
    ref, d = Reference(pol, strategy), rows(len(tok), seed=2)
    want = RefPolicyWorker(ref, wcfg(None), Accelerator(cpu=True)).compute_ref_log_prob(d)
    got = RefPolicyWorker(ref, wcfg(5), Accelerator(cpu=True)).compute_ref_log_prob(d)
    torch.testing.assert_close(got, want, atol=EPS, rtol=EPS)


def test_option_refusals(tok):
    with pytest.raises(ConfigError, match="logprob_chunk_size runs on the plain trainer's workers: set fast_paths false"):
        GRPOConfig(logprob_chunk_size=256)
    assert GRPOConfig(logprob_chunk_size=256, fast_paths=False).logprob_chunk_size == 256
    assert GRPOConfig().logprob_chunk_size is None                      # off by default: golden runs unchanged
    from rlhf_nb.chunked_head import checked_head
    pol = tiny_causal_lm(tok, seed=0); pol.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"): checked_head(pol)


def test_one_grpo_step_equal_plain(tmp_path):
    from rlhf_nb.ppo import RLTrainer
    def step(chunk):
        cfg = GRPOConfig(output_dir=str(tmp_path / f"run{chunk}"), per_device_train_batch_size=2, num_generations=2,
                         max_completion_length=4, arith_train_size=8, eval_steps=0, disable_tqdm=True, save_final=False,
                         seed=0, max_steps=1, fast_paths=False, logprob_chunk_size=chunk, kl_coef=0.05, use_kl_loss=True)
        return RLTrainer(cfg).fit()[-1]
    a, b = step(None), step(3)
    keys = [k for k in a if k.startswith(("actor/", "reward/", "response/")) and isinstance(a[k], float)]
    assert "actor/pg_loss" in keys
    for k in keys: assert b[k] == pytest.approx(a[k], abs=1e-5), k

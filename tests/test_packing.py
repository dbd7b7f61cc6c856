"""Padding-free forwards and token-budget micro-batches give the padded, row-count numbers.

Worker level: the actor's log-probs and entropies (with and without a shared value head), the critic's values and the
reference's log-probs (frozen copy and LoRA with the adapter disabled) equal the padded forward's on the valid
positions in float32 (1e-5), for a tiny Qwen2 and a tiny Llama. Loss level: token-budget micro-batches weighted by
`loss_weights` give the gradient of one big batch for every loss aggregation mode. Trainer level: one PPO step with
a critic, padded with one micro-batch against packed with a token budget (plain and fast trainers, and the plain one with
the chunked LM head), gives the same
gradients and metrics; SFT and DPO with `padding_free` log the padded losses; the options, verl's alias and the refusal of
other architectures are checked at build time."""
import copy, math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, GPT2Config, GPT2LMHeadModel

from rlhf_nb.core import logprobs_and_entropy, actor_loss, AGG_MODES
from rlhf_nb.models import char_tokenizer, tiny_causal_lm, value_model_from_policy, wrap_lora, load_tokenizer, load_causal_lm
from rlhf_nb.packing import set_padding_free, token_budget_micro_batches, padding_fraction
from rlhf_nb.workers import ActorModule, TokenValueModel, Reference, causal_lm_logits, sequence_positions
from rlhf_nb.ppo import RLTrainer, loss_weights
from rlhf_nb.fast import FastRLTrainer
from rlhf_nb.rl_config import PPOConfig, GRPOConfig

EPS = 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rl_rows(vocab, B=6, P=7, R=9, seed=0):
    "Left-padded prompts and right-padded responses of random lengths (row 0 has the longest response)."
    g = torch.Generator().manual_seed(seed)
    pl, rl = torch.randint(1, P + 1, (B,), generator=g), torch.randint(0, R + 1, (B,), generator=g)
    rl[0] = R
    cols = torch.arange(P + R)
    mask = ((cols >= P - pl[:, None]) & (cols < P + rl[:, None])).long()
    ids = torch.randint(6, vocab, (B, P + R), generator=g).masked_fill(mask == 0, 0)
    return ids, mask, sequence_positions(mask), R


def models():
    tok = char_tokenizer()
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=5))
    return {"qwen2": tiny_causal_lm(tok, seed=1), "llama": llama}


def close(a, b, mask):
    "a == b where `mask` is 1, to EPS relative to the largest value (absolute below 1)."
    a, b = a.detach(), b.detach()
    assert float(((a - b).abs() * mask).max()) <= EPS * max(1.0, float((a.abs() * mask).max()))


def close_grads(ga, gb):
    "Two lists of gradients agree to EPS relative to the largest entry."
    top = max(1.0, max(float(x.abs().max()) for x in ga))
    assert max(float((x - y).abs().max()) for x, y in zip(ga, gb)) <= EPS * top, top


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_worker_forwards_equal_padded(arch):
    policy = models()[arch]
    ids, mask, pos, R = rl_rows(policy.config.vocab_size)
    rmask, resp = mask[:, -R:].float(), ids[:, -R:]
    padded, packed = ActorModule(policy, value_head=True), None
    torch.nn.init.normal_(padded.v_head.weight)
    packed = copy.deepcopy(padded); set_padding_free(packed.policy)
    (la, va), (lb, vb) = padded(ids, mask, pos, R), packed(ids, mask, pos, R)
    (lpa, ea), (lpb, eb) = logprobs_and_entropy(la, resp), logprobs_and_entropy(lb, resp)
    close(lpa, lpb, rmask); close(ea, eb, rmask); close(va, vb, rmask)
    ga = torch.autograd.grad((lpa * rmask).sum() + (va * rmask).sum(), list(padded.parameters()))
    gb = torch.autograd.grad((lpb * rmask).sum() + (vb * rmask).sum(), list(packed.parameters()))
    close_grads(ga, gb)
    critic = TokenValueModel(value_model_from_policy(policy, head_std=1.0, pad_token_id=0))
    critic_packed = copy.deepcopy(critic); set_padding_free(critic_packed.value_model)
    close(critic(ids, mask, pos, R), critic_packed(ids, mask, pos, R), rmask)


def test_reference_log_probs_equal_padded():
    policy = models()["qwen2"]
    ids, mask, pos, R = rl_rows(policy.config.vocab_size, seed=1)
    rmask = mask[:, -R:].float()
    lora = wrap_lora(copy.deepcopy(policy), r=4, alpha=8)
    for strategy, pol in (("copy", policy), ("peft", lora)):
        want = Reference(pol, strategy).log_probs(ids, mask, pos, ids[:, -R:])
        got = Reference(set_padding_free(copy.deepcopy(pol)), strategy).log_probs(ids, mask, pos, ids[:, -R:])
        close(want, got, rmask)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_token_budget_micro_batches_give_the_big_batch_gradient(mode):
    policy = set_padding_free(models()["qwen2"])
    ids, mask, pos, R = rl_rows(policy.config.vocab_size, B=8, seed=2)
    rmask = mask[:, -R:].float()
    old = torch.randn(rmask.shape) * 0.1 - 3
    adv = torch.randn(rmask.shape)
    params = list(policy.parameters())
    def loss(rows):
        lp, ent = logprobs_and_entropy(causal_lm_logits(policy, ids[rows], mask[rows], pos[rows], R), ids[rows, -R:],
                                       entropy_grad=True)
        return actor_loss(lp, old[rows], adv[rows], rmask[rows], entropy=ent, entropy_coef=0.01, loss_agg_mode=mode,
                          norm_const=R)[0]
    big = torch.autograd.grad(loss(torch.arange(8)), params)
    chunks = token_budget_micro_batches(torch.arange(8), mask.sum(-1), max_tokens=20)
    assert len(chunks) == math.ceil(int(mask.sum()) / 20) and len(chunks) > 2
    ws = loss_weights(chunks, rmask, mode)
    acc = [torch.zeros_like(p) for p in params]
    for c, w in zip(chunks, ws):
        for a, g in zip(acc, torch.autograd.grad(loss(c) * w, params)): a += g
    close_grads(big, acc)


class TokenSumReward:
    "A deterministic dense-enough score: the response's token-id sum mod 7, on its last token."
    def __call__(self, data):
        s = torch.zeros(data["responses"].shape)
        m = data["response_mask"]
        last = (m * torch.arange(m.shape[1])).argmax(-1)
        s[torch.arange(len(s)), last] = ((data["responses"] * m).sum(-1) % 7).float() / 7
        return s, {}


def eos_prone_policy(tok, seed=3, bonus=3.0):
    "The tiny policy with `bonus` added to its eos logit (a forward hook), so responses end at varied lengths."
    pol = load_causal_lm("tiny", seed=seed)
    bias = torch.zeros(pol.config.vocab_size); bias[tok.eos_token_id] = bonus
    pol.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    return pol


def one_step(tmp_path, cls, **kw):
    "One PPO step (critic, one epoch) of a tiny run: -> (metrics, the actor's and critic's gradients at the step)."
    cfg = PPOConfig(output_dir=str(tmp_path / f"{cls.__name__}{len(kw)}"), max_steps=1, per_device_train_batch_size=8,
                    max_completion_length=8, arith_train_size=32, eval_steps=0, save_final=False, seed=3,
                    num_ppo_epochs=1, parallel_roles="off", rollout_threads=1, disable_tqdm=True, **kw)
    tok = load_tokenizer("tiny", padding_side="left")
    tr = cls(cfg, policy=eos_prone_policy(tok), tokenizer=tok, reward_manager=TokenSumReward()).init_workers()
    grads = {}
    for name, w in tr.workers.items():
        if hasattr(w, "step"):
            def step(w=w, orig=w.step, name=name):
                grads.setdefault(name, []).append(torch.cat([p.grad.flatten() for p in w.module.parameters()
                                                              if p.grad is not None]))
                return orig()
            w.step = step
    m = tr.step()
    return m, {k: torch.stack(v) for k, v in grads.items()}


def test_packed_token_budget_step_equals_padded_step(tmp_path):
    plain = one_step(tmp_path, RLTrainer)
    assert plain[0]["perf/padding_fraction"] > 0.1
    chunked = dict(fast_paths=False, logprob_chunk_size=5)                # the chunked LM head, against itself padded
    for cls, extra, (m0, g0) in ((RLTrainer, {}, plain), (FastRLTrainer, {}, plain),
                                 (RLTrainer, chunked, one_step(tmp_path, RLTrainer, **chunked))):
        m1, g1 = one_step(tmp_path, cls, padding_free=True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40, **extra)
        assert g0.keys() == g1.keys() and len(g0) == 2                    # actor and critic
        for k in g0: assert float((g0[k] - g1[k]).abs().max()) <= EPS * max(1.0, float(g0[k].abs().max()))
        for k, v in m0.items():
            if k.startswith("time/") or k == "perf/padding_fraction": continue
            assert abs(v - m1[k]) <= EPS * max(1.0, abs(v)), (cls.__name__, k, v, m1[k])
        assert m1["perf/padding_fraction"] < m0["perf/padding_fraction"]


def test_options_alias_and_refusal():
    assert not PPOConfig().padding_free and not PPOConfig().use_dynamic_bsz and PPOConfig().share_prompt_prefix
    c = GRPOConfig(use_remove_padding=True)
    assert c.padding_free and not c.share_prompt_prefix
    assert not GRPOConfig(padding_free=True, use_remove_padding=False).padding_free
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"^padding_free \(use_remove_padding\) holds for model_type llama and qwen2, "
                                         r"not 'gpt2': unset padding_free$"):
        set_padding_free(gpt2)
    assert padding_fraction(torch.ones(3, 4)) == 0


def test_sft_padding_free_gives_the_padded_losses():
    from rlhf_nb.prep import load_split
    from rlhf_nb.sft import sft_train, SFTArgs
    tok = char_tokenizer()
    rows = load_split("arith", "train", "sft", 64, 0)
    runs = [sft_train(tiny_causal_lm(tok, seed=0), tok, rows, learning_rate=1e-3, batch_size=16, max_steps=3, eval_steps=0,
                      warmup_steps=0, progress=False, padding_free=pf) for pf in (False, True)]
    losses = [[r["loss"] for r in h if "loss" in r] for h in runs]
    assert len(losses[0]) == len(losses[1]) >= 1
    for a, b in zip(*losses): assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), losses
    assert not SFTArgs().padding_free


def test_dpo_padding_free_gives_the_padded_run(tmp_path):
    from rlhf_nb.dpo import DPOConfig, dpo_trainer_class
    from rlhf_nb.golden import DPO_RUN
    runs = []
    for pf in (False, True):
        kw = {**DPO_RUN, "max_steps": 2, "output_dir": str(tmp_path / f"dpo{pf}"), "padding_free": pf}
        tr = dpo_trainer_class(DPOConfig(**kw)).from_config(DPOConfig(**kw)).prepare_reference()
        runs.append([r for r in tr.fit() if "loss" in r])
    assert DPOConfig(padding_free=True).share_prompt_prefix is False
    for a, b in zip(*runs):
        for k in ("loss", "rewards/margins", "grad_norm", "logps/chosen", "logps/rejected"):
            if k in a: assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), (k, a[k], b[k])
    assert len(runs[0]) == len(runs[1]) >= 1


def test_cli_refuses_padding_free_for_another_architecture(tmp_path, capsys):
    from rlhf_nb import launch
    tok = char_tokenizer()
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, pad_token_id=0, eos_token_id=5,
                               bos_token_id=5)).save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    rc = launch.main(["grpo", "--model_name_or_path", str(tmp_path / "gpt2"), "--use_remove_padding", "true", "--output_dir",
                      str(tmp_path / "out"), "--max_steps", "1", "--eval_steps", "0", "--arith_train_size", "32",
                      "--per_device_train_batch_size", "2", "--num_generations", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1] == ("rlhf-nb grpo: error: padding_free (use_remove_padding) holds for model_type llama "
                                   "and qwen2, not 'gpt2': unset padding_free"), err

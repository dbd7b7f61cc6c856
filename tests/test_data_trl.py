"""Rows converted by `rlhf_nb.dataset.to_trl_*` feed TRL 1.16's trainers directly: one step of SFTTrainer,
DPOTrainer and GRPOTrainer each, on a tiny model, offline (the notebook's slow cell, run in CI)."""
import copy, math, os

import pytest
import torch

from rlhf_nb import arith, data, dataset
from rlhf_nb.models import char_tokenizer, tiny_causal_lm

trl = pytest.importorskip("trl")


@pytest.fixture(scope="module")
def tok(): return char_tokenizer()


def args(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to=[], save_strategy="no",
               use_cpu=True, **kw)


PAIRS = [("\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant: 4", "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant: 5"),
         ("\n\nHuman: name a color\n\nAssistant: blue", "\n\nHuman: name a color\n\nAssistant: no")]


def test_sft_trainer_takes_to_trl_sft(tok, tmp_path):
    rows = arith.make_arith(8)
    tr = trl.SFTTrainer(model=tiny_causal_lm(tok), args=args(trl.SFTConfig, tmp_path), train_dataset=dataset.to_trl_sft(rows),
                        processing_class=tok)
    # TRL tokenizes the prompt exactly as RLHFDataset does and trains only on `81 #### 81<|end|>`
    ex, item = tr.train_dataset[0], dataset.RLHFDataset(rows[:1], tok)[0]
    P = len(item["input_ids"])
    assert ex["input_ids"][:P] == item["input_ids"].tolist() and ex["labels"][:P] == [-100] * P
    assert tok.decode(ex["labels"][P:]) == rows[0]["completion"] + "<|end|>"
    assert math.isfinite(tr.train().training_loss)


def test_dpo_trainer_takes_to_trl_dpo(tok, tmp_path):
    rows = [data.hh_row({"chosen": c, "rejected": r}, i, "train", "pairs") for i, (c, r) in enumerate(PAIRS * 2)]
    model = tiny_causal_lm(tok)
    tr = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args(trl.DPOConfig, tmp_path),
                        train_dataset=dataset.to_trl_dpo(rows), processing_class=tok)
    loss = tr.train().training_loss
    assert abs(loss - math.log(2)) < 1e-3  # policy == reference at step 0: DPO's sigmoid loss is exactly log 2


def test_grpo_trainer_takes_to_trl_grpo(tok, tmp_path):
    seen = []
    def reward(prompts, completions, ground_truth, data_source, extra_info, **kw):
        seen.append((ground_truth, data_source, extra_info))
        return [float(data.gsm8k_ground_truth(c[0]["content"]) == g) for c, g in zip(completions, ground_truth)]
    rows = arith.make_arith(8)
    tr = trl.GRPOTrainer(model=tiny_causal_lm(tok), reward_funcs=reward, train_dataset=dataset.to_trl_grpo(rows), processing_class=tok,
                         args=args(trl.GRPOConfig, tmp_path, num_generations=2, generation_batch_size=4, max_completion_length=8))
    assert math.isfinite(tr.train().training_loss)
    gts, sources, infos = seen[0]
    assert set(gts) <= {r["reward_model"]["ground_truth"] for r in rows} and sources == ["arith"] * 4
    assert all(i["split"] == "train" and i["form"] == "short" for i in infos)

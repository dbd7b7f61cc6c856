"""Worker of tests/test_distributed.py (not a test itself): runs `rlhf_nb.launch.main(sys.argv[1:])` in this process
-- one rank under `accelerate launch`, or a lone process -- with instrumentation, then writes what this rank saw
to $RLHF_NB_TEST_RECORD/rank{R}.json and its final parameters to rank{R}_params.pt:
world size, the prompt (or pair) indices it trained on at every step, its local mean score, the metrics it logged,
its parameter checksum.

The instrumentation only observes, except for two test conveniences:
- a reward registered as data_source "test_digits" (the fraction of digits in the answer), which a random tiny
  model already earns sometimes, so a few steps from a fresh model move the weights;
- with RLHF_NB_TEST_SEEDED_ROLLOUT=1, sampling is a function of (step, prompt index, sample number) only, so the same
  prompts get the same completions whichever rank, batch or number of processes -- what makes a 2-process run
  comparable step by step with a 1-process run of the same global batch.
"""
import json, os, sys
from pathlib import Path

import torch

REC = Path(os.environ["RLHF_NB_TEST_RECORD"]); REC.mkdir(parents=True, exist_ok=True)
SEEDED = os.environ.get("RLHF_NB_TEST_SEEDED_ROLLOUT") == "1"

from rlhf_nb import launch, ppo, rewards, dist, workers
import rlhf_nb.dpo as dg


@rewards.register_reward("test_digits")
def digit_fraction(solution_str, ground_truth=None, extra_info=None):
    s = solution_str or ""
    return sum(c.isdigit() for c in s) / max(len(s), 1)


rec = {"steps": [], "local_scores": []}
captured = {}

_init, _next, _scores, _gen = (ppo.RLTrainer.init_workers, ppo.RLTrainer.next_batch, ppo.RLTrainer.compute_scores,
                               ppo.RLTrainer.generate_sequences)

def init_workers(self):
    captured["trainer"] = self
    return _init(self)

def next_batch(self):
    b = _next(self)
    rec["steps"].append([int(i) for i in dict.fromkeys(b["index"])])       # each prompt once (groups repeat it)
    return b

def compute_scores(self, data):
    data, m = _scores(self, data)
    rec["local_scores"].append(float(data["token_level_scores"].sum(-1).mean()))
    return data, m

def seeded_generate_sequences(self, batch):
    "Generate row by row, each from a seed that depends only on (step, prompt index, sample number)."
    G, outs = self.config.num_generations, []
    for i, ix in enumerate(batch["index"]):
        one = {k: (v[i:i + 1] if torch.is_tensor(v) else [v[i]]) for k, v in batch.items()}
        torch.manual_seed(1_000_003 * self.global_step + 1_009 * int(ix) + i % G)
        outs.append(_gen(self, one))
    R = max(o["responses"].shape[1] for o in outs)
    pad = lambda t, v: torch.nn.functional.pad(t, (0, R - t.shape[1]), value=v)
    responses = torch.cat([pad(o["responses"], self.tokenizer.pad_token_id) for o in outs])
    response_mask = torch.cat([pad(o["response_mask"], 0) for o in outs])
    prompts, prompt_mask = torch.cat([o["prompts"] for o in outs]), torch.cat([o["prompt_mask"] for o in outs])
    full = torch.cat([prompt_mask, response_mask], 1)
    out = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask", "position_ids")}
    out.update(input_ids=torch.cat([prompts, responses], 1), attention_mask=full, position_ids=workers.sequence_positions(full),
               prompts=prompts, prompt_mask=prompt_mask, responses=responses, response_mask=response_mask,
               has_eos=torch.cat([o["has_eos"] for o in outs]))
    return out

ppo.RLTrainer.init_workers, ppo.RLTrainer.next_batch, ppo.RLTrainer.compute_scores = init_workers, next_batch, compute_scores
if SEEDED: ppo.RLTrainer.generate_sequences = seeded_generate_sequences

_dpo_loss, _dpo_fit = dg.DPOTrainer.compute_loss, dg.DPOTrainer.fit
def dpo_compute_loss(self, idx, split="train"):
    if split == "train": rec["steps"].append([int(i) for i in idx])     # this rank's slice of the global batch
    return _dpo_loss(self, idx, split)
def dpo_fit(self):
    captured["dpo"] = self
    out = _dpo_fit(self)
    (REC / f"rank{self.rank}_dpo.json").write_text(json.dumps({"model_wrapped": type(self.model_wrapped).__name__}))
    return out
dg.DPOTrainer.compute_loss, dg.DPOTrainer.fit = dpo_compute_loss, dpo_fit

rc = launch.main(sys.argv[1:])

state = dist.process_state()
if "trainer" in captured:
    t = captured["trainer"]
    modules = [t.accelerator.unwrap_model(t.actor), t.accelerator.unwrap_model(t.critic) if t.critic is not None else None]
    history = t.history
else:
    modules, history = [captured["dpo"].model], captured["dpo"].history           # the plain policy (DDP unwrapped)
params = torch.cat([p.detach().float().flatten() for m in modules if m is not None
                    for _, p in sorted(m.named_parameters(), key=lambda x: x[0])])
torch.save(params, REC / f"rank{state.process_index}_params.pt")
clean = lambda h: {k: v for k, v in h.items() if isinstance(v, (int, float)) and not k.startswith("time")}
(REC / f"rank{state.process_index}.json").write_text(json.dumps({
    "rc": rc, "rank": state.process_index, "world": state.num_processes, "steps": rec["steps"],
    "local_scores": rec["local_scores"], "history": [clean(h) for h in history],
    "checksum": dist.param_checksum(*modules)}))
dist.exit_process(rc)                                                  # a launched rank: no C++ teardown (it can abort)

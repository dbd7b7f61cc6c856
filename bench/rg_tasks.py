"""Which reasoning-gym tasks the tiny model can learn: SFT each candidate for a fixed time, then greedy held-out
accuracy under the task's own verifier (rlhf_nb.rewards' reasoning_gym reward). A task worth RL is one SFT leaves
partly right (some accuracy, far from all): RL has right answers to reinforce and room to improve.

    python bench/rg_tasks.py                      # small: 45 s of SFT per candidate
    python bench/rg_tasks.py --seconds 180        # full size
Writes bench/results_rg_tasks.{json,md}."""
import argparse, json, time
from pathlib import Path
import torch
from rlhf_nb.environments import prep_reasoning_gym
from rlhf_nb.models import char_tokenizer, tiny_causal_lm
from rlhf_nb.sft import sft_train, greedy_accuracy

CANDIDATES = ["chain_sum:max_terms=2:max_digits=2", "spell_backward:max_word_len=5", "letter_counting:max_words=5",
              "basic_arithmetic:max_terms=2:max_digits=2", "gcd:max_value=100", "lcm:max_value=20"]

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=45.0, help="SFT seconds per candidate")
    p.add_argument("--tasks", default=";".join(CANDIDATES), help="candidates, ';' separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=64, help="SFT examples per step")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    out, here = [], Path(__file__).parent
    for spec in a.tasks.split(";"):
        s = prep_reasoning_gym(spec, n=3000, n_test=200, seed=0)
        if len(s.get("test", [])) < 50:                              # a small question space: no held-out questions left
            out.append(dict(task=spec, n_test=len(s.get("test", [])), note="too few distinct questions to hold out")); continue
        tok = char_tokenizer(); model = tiny_causal_lm(tok, seed=0)
        before = greedy_accuracy(model, tok, s["test"], batch_size=200)["accuracy"]
        t = time.time()
        hist = sft_train(model, tok, s["train"], s["test"][:100], batch_size=a.batch_size, max_steps=100000, eval_steps=100, max_seconds=a.seconds, progress=False)
        acc = greedy_accuracy(model, tok, s["test"], batch_size=200)
        out.append(dict(task=spec, n_test=acc["n"], accuracy_start=before, accuracy_after_sft=acc["accuracy"],
                        mean_score_after_sft=round(acc["mean_score"], 3), sft_steps=hist[-1]["step"], sft_seconds=round(time.time() - t, 1)))
        print(json.dumps(out[-1]), flush=True)
    (here / "results_rg_tasks.json").write_text(json.dumps(dict(seconds=a.seconds, results=out), indent=1))
    lines = ["| task | SFT steps | SFT s | held-out accuracy after SFT | mean score |", "|---|---|---|---|---|"]
    lines += [f"| `{r['task']}` | {r['sft_steps']} | {r['sft_seconds']} | {r['accuracy_after_sft']:.3f} (n={r['n_test']}) | {r['mean_score_after_sft']} |"
              if "note" not in r else f"| `{r['task']}` | - | - | {r['note']} | - |" for r in out]
    (here / "results_rg_tasks.md").write_text(f"SFT for {a.seconds:g} s per task (batch {a.batch_size}), tiny model, {a.threads} threads.\n\n" + "\n".join(lines) + "\n")

if __name__ == "__main__": main()

"""Which reasoning-gym tasks the tiny model can learn: SFT each candidate for a fixed time, then greedy held-out
accuracy under the task's own verifier (rlhf_nb.rewards' reasoning_gym reward). A task worth RL is one SFT leaves
partly right (some accuracy, far from all): RL has right answers to reinforce and room to improve.

    python bench/rg_tasks.py                      # small: 45 s of SFT per candidate
    python bench/rg_tasks.py --seconds 90         # the size of the table in bench/results_rg_tasks.md
    python bench/rg_tasks.py --seconds 90 --tasks 'gcd:max_value=50' --append   # one more row in the table
    python bench/rg_tasks.py --tasks '' --append  # only rewrite the table from the results there
Writes bench/results_rg_tasks.{json,md} (--append: rows added to those there, a re-probed task replaced)."""
import argparse, collections, json, time
from pathlib import Path
import torch
from rlhf_nb.environments import prep_reasoning_gym
from rlhf_nb.models import char_tokenizer, tiny_causal_lm
from rlhf_nb.sft import sft_train, greedy_accuracy

CANDIDATES = ["chain_sum:max_terms=2:max_digits=2", "basic_arithmetic:max_terms=2:max_digits=2:operators=+-",
              "chain_sum:min_terms=3:max_terms=3:max_digits=1", "letter_counting:min_words=1:max_words=3",
              "spell_backward:max_word_len=4", "leg_counting:min_animals=1:max_animals=2:max_instances=3"]

def majority_share(rows):
    "Share of held-out rows whose answer is the most common answer: the accuracy of always giving it."
    counts = collections.Counter(r["reward_model"]["ground_truth"] for r in rows)
    return round(counts.most_common(1)[0][1] / max(len(rows), 1), 3) if rows else None

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=45.0, help="SFT seconds per candidate")
    p.add_argument("--tasks", default=";".join(CANDIDATES), help="candidates, ';' separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=64, help="SFT examples per step")
    p.add_argument("--n", type=int, default=3000, help="train rows per candidate")
    p.add_argument("--n_test", type=int, default=200, help="held-out rows asked for (those also in train are dropped)")
    p.add_argument("--append", action="store_true", help="add to the results there (a re-probed task replaced)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    out, here = [], Path(__file__).parent
    for spec in [t for t in a.tasks.split(";") if t.strip()]:
        s = prep_reasoning_gym(spec, n=a.n, n_test=a.n_test, seed=0)
        if len(s.get("test", [])) < 50:                              # a small question space: no held-out questions left
            out.append(dict(task=spec, n_test=len(s.get("test", [])), note="too few distinct questions to hold out")); continue
        tok = char_tokenizer(); model = tiny_causal_lm(tok, seed=0)
        before = greedy_accuracy(model, tok, s["test"], batch_size=200)["accuracy"]
        t = time.time()
        hist = sft_train(model, tok, s["train"], s["test"][:100], batch_size=a.batch_size, max_steps=100000, eval_steps=100, max_seconds=a.seconds, progress=False)
        acc = greedy_accuracy(model, tok, s["test"], batch_size=200)
        out.append(dict(task=spec, n_test=acc["n"], majority_share=majority_share(s["test"]), accuracy_start=before,
                        accuracy_after_sft=acc["accuracy"],
                        mean_score_after_sft=round(acc["mean_score"], 3), sft_steps=hist[-1]["step"], sft_seconds=round(time.time() - t, 1)))
        print(json.dumps(out[-1]), flush=True)
    for r in out: r.update(seconds=a.seconds, batch_size=a.batch_size)
    old = json.loads((here / "results_rg_tasks.json").read_text())["results"] if a.append else []
    for r in old:                                           # rows from before the column: the same held-out rows again
        if "majority_share" not in r and "note" not in r:
            r["majority_share"] = majority_share(prep_reasoning_gym(r["task"], n=a.n, n_test=a.n_test, seed=0).get("test", []))
    out = [r for r in old if r["task"] not in {o["task"] for o in out}] + out
    (here / "results_rg_tasks.json").write_text(json.dumps(dict(results=out), indent=1))
    lines = ["| task | SFT steps | SFT s | held-out accuracy after SFT | mean score | most common answer's share |",
             "|---|---|---|---|---|---|"]
    lines += [f"| `{r['task']}` | {r['sft_steps']} | {r['sft_seconds']} | {r['accuracy_after_sft']:.3f} (n={r['n_test']}) "
              f"| {r['mean_score_after_sft']} | {r['majority_share']} |"
              if "note" not in r else f"| `{r['task']}` | - | - | {r['note']} | - | - |" for r in out]
    head = (f"Each candidate alone: SFT of the tiny model from scratch for a fixed time (batch {a.batch_size}, {a.threads} threads, "
            "on a shared machine: steps per second vary), then greedy held-out accuracy under the task's own verifier. "
            "The last column is the accuracy of always giving the most common held-out answer.\n\n")
    (here / "results_rg_tasks.md").write_text(head + "\n".join(lines) + "\n")

if __name__ == "__main__": main()

"""tinker-cookbook's own minimal RL loop (`tinker_cookbook.recipes.rl_loop.main`) on the arithmetic task, offline.

The recipe's code runs unchanged; what it would fetch from the hosted service and the hub is supplied locally:
  - the service              -> with --server, the SDK's own `tinker.ServiceClient` talking to `rlhf-nb tinker-serve`
                                (started in this process on a free port, passed as the recipe's `base_url`); without
                                it, `tinker.ServiceClient` is `rlhf_nb.tinker_api.ServiceClient` (the same backend
                                in-process, no HTTP);
  - the tokenizer            -> the tiny model's character tokenizer (`get_tokenizer`);
  - the renderer             -> `ArithRenderer`: the last user turn through the tiny model's chat template, with the
                                recipe's GSM8K instruction (`Provide a numerical answer ... \\boxed{}`) left out, since the
                                tiny model was trained on bare `Q: 23+58=` prompts; eos is the stop token;
  - the dataset              -> `make_arith` rows as GSM8K-shaped {question, answer} rows (`datasets.load_dataset`);
  - the reward               -> rlhf-nb's arithmetic grader (`#### N` must equal the sum) in place of `\\boxed{}` grading.
The policy starts from rlhf-nb's SFT warm start ($RLHF_NB_CACHE/sft_arith, about 30% greedy accuracy) so that
groups carry signal from the first step. Writes bench/results_tinker.json and .md (--server: results_tinker_server.*).

    pip install tinker==0.38.0 && pip install --no-deps tinker-cookbook==0.6.1 && pip install chz termcolor blobfile pylatexenc
    python bench/tinker_cookbook_rl.py [--steps 20] [--server]
"""
import argparse, json, os, sys, tempfile, time
from pathlib import Path
from types import SimpleNamespace

import datasets
from rlhf_nb.arith import make_arith
from rlhf_nb.dataset import render_prompt
from rlhf_nb.models import load_tokenizer
from rlhf_nb.rewards import gsm8k_strict_reward
from rlhf_nb.sft import sft_warm_start
from rlhf_nb.tinker_api import ServiceClient, types
from rlhf_nb.tinker_serve import start_server

OUT = Path(__file__).resolve().parent


class ArithRenderer:
    "The part of a cookbook renderer the recipe calls: prompt tokens, stop tokens, and the parsed reply."
    def __init__(self, tokenizer): self.tokenizer = tokenizer
    def build_generation_prompt(self, convo):
        question = convo[-1]["content"].split(" Provide a numerical answer")[0]
        ids = self.tokenizer(render_prompt(self.tokenizer, [{"role": "user", "content": question}]), add_special_tokens=False)["input_ids"]
        return types.ModelInput.from_ints(ids)
    def get_stop_sequences(self): return [self.tokenizer.eos_token_id]
    def parse_response(self, tokens): return {"role": "assistant", "content": self.tokenizer.decode(tokens, skip_special_tokens=True)}, True


def arith_gsm8k(n, seed=0):
    "`make_arith` rows in GSM8K's columns: question and an answer that ends with '#### N'."
    rows = make_arith(n, "train", seed=seed)
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(
        [{"question": r["prompt"][0]["content"], "answer": f"#### {r['reward_model']['ground_truth']}"} for r in rows])})


def patch_recipe(rl_loop, model_dir, root, in_process=True):
    "Point the recipe's module-level names at the tiny tokenizer, the arithmetic task and (in-process) the local backend."
    tok = load_tokenizer(model_dir, verbose=False)
    if in_process:
        rl_loop.tinker = SimpleNamespace(ServiceClient=lambda **kw: ServiceClient(root=root, **kw), types=rl_loop.types,
                                         APIFuture=object)
    rl_loop.get_tokenizer = lambda name: tok
    rl_loop.model_info = SimpleNamespace(get_recommended_renderer_name=lambda name: "arith")
    rl_loop.renderers = SimpleNamespace(get_renderer=lambda name, tokenizer: ArithRenderer(tokenizer),
                                        get_text_content=lambda message: message["content"])
    rl_loop.datasets = SimpleNamespace(load_dataset=lambda *a, **kw: arith_gsm8k(4096), DatasetDict=datasets.DatasetDict)
    rl_loop.get_reward = lambda response, answer: gsm8k_strict_reward(response, answer.split("####")[-1].strip())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=64, help="prompts per step")
    p.add_argument("--group_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--lora_rank", type=int, default=32)
    p.add_argument("--log_path", default=None)
    p.add_argument("--server", action="store_true", help="the SDK's own client over HTTP to tinker-serve (else in-process)")
    a = p.parse_args(argv)
    import tinker_cookbook.recipes.rl_loop as rl_loop            # optional: only this bench needs the cookbook
    model_dir = sft_warm_start(progress=False)
    log_path = a.log_path or tempfile.mkdtemp(prefix="tinker_rl_")
    patch_recipe(rl_loop, model_dir, Path(log_path) / "checkpoints", in_process=not a.server)
    base_url = None
    if a.server:
        httpd = start_server(port=0, root=Path(log_path) / "checkpoints")
        base_url = f"http://127.0.0.1:{httpd.server_port}"
        os.environ.setdefault("TINKER_API_KEY", "tml-local")
    cfg = rl_loop.Config(base_url=base_url, log_path=log_path, model_name=model_dir, batch_size=a.batch_size, group_size=a.group_size,
                         learning_rate=a.learning_rate, lora_rank=a.lora_rank, max_tokens=16, loss_fn="importance_sampling",
                         max_steps=a.steps, save_every=0)
    t0 = time.time()
    rl_loop.main(cfg)
    seconds = time.time() - t0
    rows = [json.loads(l) for l in (Path(log_path) / "metrics.jsonl").read_text().splitlines()]
    curve = [round(r["reward/total"], 4) for r in rows if "reward/total" in r]
    result = dict(recipe="tinker_cookbook.recipes.rl_loop (tinker-cookbook 0.6.1)", backend="the tinker SDK over HTTP to rlhf-nb tinker-serve" if a.server else "rlhf_nb.tinker_api (in-process)",
                  model=f"$RLHF_NB_CACHE/sft_arith (rlhf-nb SFT warm start, tiny Qwen2) + LoRA rank {a.lora_rank}", task="arith 2-digit addition",
                  loss_fn="importance_sampling", steps=len(curve), batch_size=a.batch_size, group_size=a.group_size,
                  learning_rate=a.learning_rate, max_tokens=16, seconds=round(seconds, 1), reward_curve=curve,
                  first5_mean=round(sum(curve[:5]) / len(curve[:5]), 4), last5_mean=round(sum(curve[-5:]) / len(curve[-5:]), 4),
                  command="python bench/tinker_cookbook_rl.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    name = "results_tinker_server" if a.server else "results_tinker"
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / f"{name}.md").write_text(
        f"# tinker-cookbook's RL loop on the offline backend\n\n`{result['command'].strip()}` ({seconds:.0f} s on a 2-core CPU)\n\n"
        f"{result['recipe']}, run unchanged against {result['backend']}: {result['model']}, {a.batch_size} arithmetic "
        f"prompts x {a.group_size} samples per step, `{result['loss_fn']}`, Adam lr {a.learning_rate}.\n\n"
        "| step | " + " | ".join(str(i) for i in range(len(curve))) + " |\n|---|" + "---|" * len(curve) + "\n"
        "| mean reward | " + " | ".join(f"{c:.3f}" for c in curve) + " |\n\n"
        f"Mean reward over the first five steps {result['first5_mean']:.3f}, over the last five {result['last5_mean']:.3f}.\n")
    print(json.dumps({k: result[k] for k in ("steps", "seconds", "first5_mean", "last5_mean", "reward_curve")}))


if __name__ == "__main__":
    main()

"""Shared pieces of the benchmark arms: the tiny model, tokenizer and data (from rlhf_nb when its modules exist,
else a local stand-in with the same shape), peak-RSS, timing and machine description helpers.

Every arm runs in a fresh subprocess, so nothing here keeps global state across arms."""
from __future__ import annotations
import os, sys, time, json, re, random, resource, platform, subprocess, importlib.util
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
WORK = BENCH_DIR / "_work"          # git-ignored scratch (SFT checkpoint, TRL output dirs)
RESULT_TAG = "@@BENCH_RESULT "      # an arm prints one line starting with this, followed by JSON


def have(module: str) -> bool:
    "True when `module` can be imported (without importing it)."
    try: return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError): return False


def peak_rss_mb() -> float:
    "Peak resident set size of this process in MB (Linux reports ru_maxrss in KiB)."
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def vm_hwm_mb():
    """Peak RSS of this process image from /proc/self/status (VmHWM); unlike ru_maxrss it does not inherit the RSS the
    forking parent had, so it cross-checks ru_maxrss when the parent is large (e.g. under pytest)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"): return int(line.split()[1]) / 1024
    except OSError: return None


def set_threads(n: int):
    import torch
    torch.set_num_threads(n)
    try: torch.set_num_interop_threads(1)
    except RuntimeError: pass


def emit(result: dict):
    "Print the arm's result line (JSON) for the parent runner, with the arm's peak RSS added."
    result = dict(result)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    result.setdefault("vm_hwm_mb", vm_hwm_mb())
    print(RESULT_TAG + json.dumps(result, default=float), flush=True)


# ----------------------------------------------------------------------------------------------------------------
# Tiny model / tokenizer / data. rlhf_nb.models, rlhf_nb.arith and rlhf_nb.dataset are the source of truth; the
# stand-ins below follow the CONTRACT (character tokenizer, <|end|> as eos, ~1M-param Qwen2) so the TRL arms can run
# before them.
# ----------------------------------------------------------------------------------------------------------------
SPECIAL = ["<|pad|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def using_rlhf_nb(part: str) -> bool:
    "Whether the rlhf_nb module `part` (models, arith, dataset, sft, rewards, ppo, algos, dpo) is available."
    return have(f"rlhf_nb.{part}")


def nb(part: str, name: str):
    "`rlhf_nb.<part>.<name>` when that module exists and defines it (modules land piece by piece), else None."
    if not using_rlhf_nb(part): return None
    import importlib
    try: mod = importlib.import_module(f"rlhf_nb.{part}")
    except Exception as e:
        print(f"[bench] rlhf_nb.{part} failed to import ({type(e).__name__}: {e}); using the bench stand-in", file=sys.stderr)
        return None
    return getattr(mod, name, None)


def tokenizer():
    if nb("models", "char_tokenizer"): return nb("models", "char_tokenizer")()
    import string
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, Regex
    from transformers import PreTrainedTokenizerFast
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIAL + chars)}, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>", unk_token="<|unk|>",
                                   padding_side="left", model_max_length=512, chat_template=TEMPLATE)


def _fallback_config(tok, **kw):
    from transformers import Qwen2Config
    d = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
             eos_token_id=tok.eos_token_id, bos_token_id=None)
    d.update(kw)
    return Qwen2Config(**d)


def policy(tok, seed=0, path=None, shape=None):
    "The tiny causal LM (fresh, or loaded from `path`, e.g. the SFT start); `shape` overrides Qwen2Config fields (SIZES)."
    import torch
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM
    if path is not None: return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if nb("models", "tiny_causal_lm"): return nb("models", "tiny_causal_lm")(tok, seed=seed, **(shape or {}))
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(_fallback_config(tok, **(shape or {})))


def value_model(tok, seed=0, path=None, head_std=None, shape=None):
    "A tiny sequence-classification model (num_labels=1): TRL 1.12 PPO's critic and reward model."
    import torch
    from transformers import AutoModelForSequenceClassification, Qwen2ForSequenceClassification
    if path is not None:
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    if nb("models", "tiny_value_model"):
        return nb("models", "tiny_value_model")(tok, seed=seed, **({} if head_std is None else {"head_std": head_std}), **(shape or {}))
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(_fallback_config(tok, num_labels=1, **(shape or {})))


# Model sizes of the scaling benches (Qwen2 shape, character vocabulary): `demo` is the default tiny model; the others
# use full multi-head attention and a 4x MLP, as measured in the issue that set the targets.
SIZES = {
    "demo": {},
    "6.3M": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4),
    "33.6M": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8),
}


# The SFT start of the accuracy arm at each size: keyword arguments of rlhf_nb.sft.sft_warm_start beyond the bench's
# own (seed 0, --sft_seconds). Every size stops at the same held-out accuracy (its default target, 0.3), so both RL
# sides start where some completions are right and some wrong (a group needs both to carry a GRPO signal).
# 6.3M: AdamW at 1e-3 instead of the demo's 3e-3 (the usual rate for a 6-layer, 256-wide model; 3e-3 with a 50-step
# warm-up invites loss spikes at that depth), up to 4000 steps, and a longer wall limit: each step is ~6x the demo's
# work (6.3M vs ~1M parameters), and the demo needs ~400 steps (~110 s here) to reach the target.
SFT_SETTINGS = {
    "demo": {},
    "6.3M": dict(learning_rate=1e-3, max_steps=4000),
    "33.6M": dict(learning_rate=5e-4, max_steps=4000),
}
SFT_SECONDS = {"demo": 600, "6.3M": 1500, "33.6M": 3600}   # wall limit of each SFT start unless --sft_seconds is given


def sft_dir(size="demo"):
    "Cache folder of the SFT start at `size` (the demo's keeps its old name, so earlier caches and results still match)."
    return WORK / ("sft_start" if size == "demo" else f"sft_start_{size}")


def sft_kwargs(size="demo"):
    "rlhf_nb.sft.sft_warm_start keyword arguments that make the SFT start at `size` (model shape + per-size settings)."
    if size not in SIZES: raise ValueError(f"unknown model size {size!r}: the sizes are {', '.join(SIZES)}")
    return {**({"model_kw": SIZES[size]} if SIZES[size] else {}), **SFT_SETTINGS.get(size, {})}


def arith_rows(n, split="train", seed=0):
    "Rows of the built-in arithmetic task in verl's schema (prompt `Q: 23+58=`, completion `81 #### 81`)."
    if nb("arith", "make_arith"): return nb("arith", "make_arith")(n, split=split, seed=seed)
    rng = random.Random(f"{split}-{seed}")
    rows, seen = [], set()
    while len(rows) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if ((a + b) % 2 == 0) != (split == "train") or (a, b) in seen: continue   # disjoint train/test
        seen.add((a, b))
        rows.append(dict(data_source="arith", prompt=[{"role": "user", "content": f"Q: {a}+{b}="}], ability="math",
                         reward_model={"style": "rule", "ground_truth": str(a + b)}, completion=f"{a+b} #### {a+b}",
                         extra_info={"split": split, "index": len(rows)}))
    return rows


def strict_score(solution_str, ground_truth):
    "GSM8K strict score (fallback when rlhf_nb.rewards is absent): 1.0 if the `#### N` answer equals the truth."
    m = re.findall(r"#### (\-?[0-9\.\,]+)", solution_str)
    if not m: return 0.0
    return float(m[-1].replace(",", "").replace("$", "").rstrip(".") == ground_truth)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if nb("rewards", "compute_score"): return nb("rewards", "compute_score")(data_source, solution_str, ground_truth, extra_info)
    return strict_score(solution_str, ground_truth)


def trl_reward_func():
    "A `reward_func(prompts, completions, **columns)` for trl.GRPOTrainer; counts completion tokens on the side."
    counter = {"tokens": 0, "calls": 0}
    if nb("rewards", "trl_reward_func"):
        inner = nb("rewards", "trl_reward_func")()
    else:
        def inner(prompts, completions, ground_truth, data_source=None, **kw):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [strict_score(t, g) for t, g in zip(texts, ground_truth)]
    def reward(prompts, completions, **kw):
        ids = kw.get("completion_ids")
        if ids is not None: counter["tokens"] += sum(len(x) for x in ids)
        counter["calls"] += 1
        return inner(prompts, completions, **kw)
    reward.__name__ = "arith_reward"
    return reward, counter


def to_trl(rows, kind):
    "rlhf_nb rows -> the datasets.Dataset TRL expects (`grpo`: prompt + ground_truth; `dpo`: prompt/chosen/rejected)."
    f = nb("dataset", f"to_trl_{kind}")
    if f: return f(rows)
    from datasets import Dataset
    if kind == "grpo":
        return Dataset.from_list([dict(prompt=r["prompt"], ground_truth=r["reward_model"]["ground_truth"],
                                       data_source=r["data_source"]) for r in rows])
    if kind == "dpo":
        return Dataset.from_list([dict(prompt=r["prompt"], chosen=[{"role": "assistant", "content": r["chosen"]}],
                                       rejected=[{"role": "assistant", "content": r["rejected"]}]) for r in rows])
    raise ValueError(kind)


def pref_rows(n, seed=0):
    "Synthetic preference pairs of the arithmetic task: chosen = correct answer, rejected = a wrong one."
    rng = random.Random(seed)
    out = []
    for r in arith_rows(n, "train", seed):
        t = int(r["reward_model"]["ground_truth"])
        w = t + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])
        out.append({**{k: v for k, v in r.items() if k != "completion"}, "chosen": f"{t} #### {t}", "rejected": f"{w} #### {w}"})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Machine description
# ----------------------------------------------------------------------------------------------------------------
def load_avg():
    try: return list(os.getloadavg())
    except OSError: return None


def uptime_line():
    try: return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception: return None


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"): return line.split(":", 1)[1].strip()
    except OSError: pass
    return platform.processor() or platform.machine()


def versions(python=sys.executable):
    "Versions of the libraries under test, as the given interpreter sees them."
    code = ("import json,importlib.metadata as m\nv={}\nfor p in ['torch','transformers','trl','peft','accelerate','datasets','math-verify']:\n"
            "    try: v[p]=m.version(p)\n    except Exception: v[p]=None\nprint(json.dumps(v))")
    try: return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout)
    except Exception as e: return {"error": str(e)}


def machine():
    import multiprocessing
    return {"cpu_model": cpu_model(), "cores": multiprocessing.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "mem_total_gb": _mem_total_gb()}


def _mem_total_gb():
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"): return round(int(line.split()[1]) / 2**20, 1)
    except OSError: return None

"""The `rlhf-nb` command line end to end: every subcommand's --help, bad configuration (one stderr line, non-zero
exit, nothing written), the training subcommands on the tiny model, the chain sft -> eval -> plot, the module entry
point under `accelerate launch`, and the demo's hub code path (offline, on local GSM8K rows and a tiny model standing
in for Qwen). The real console script runs in subprocesses (top-level help, the module entry point, training, the
launcher); the per-subcommand help and the bad-configuration corpus call the same `rlhf_nb.launch.main` in this
process, in the case's folder (one interpreter start-up instead of thirty)."""
import dataclasses, importlib, json, os, pkgutil, shutil, subprocess, sys
from pathlib import Path

import pytest

import rlhf_nb as rlhf_nb_pkg
from rlhf_nb import launch, demo
from rlhf_nb.algos import GRPOConfig
from rlhf_nb.config import OverwriteArgs, CheckpointArgs, TrackingArgs, DataArgs, SupervisedArgs, option_declarations, repeated_options
from rlhf_nb.dpo import DPOConfig
from rlhf_nb.models import LoadArgs, LoraArgs, PeftArgs
from rlhf_nb.ppo import PPOConfig
from rlhf_nb.reward_model import RMArgs
from rlhf_nb.sft import SFTArgs

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
ENV.pop("RLHF_NB_DEBUG", None)
SUBCOMMANDS = ["prep", "sft", "rm", "ppo", "grpo", "dpo", "eval", "plot", "demo"]
TINY_RL = ["--per_device_train_batch_size", "4", "--max_completion_length", "8", "--arith_train_size", "64",
           "--eval_steps", "0", "--disable_tqdm", "true"]


def rlhf_nb(*args, cwd, timeout=600, module=False):
    "Run the real console script (or `python -m rlhf_nb.launch`) in `cwd`."
    exe = shutil.which("rlhf-nb")
    cmd = ([sys.executable, "-m", "rlhf_nb.launch"] if module or not exe else [exe]) + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


class Result:
    "What a run of the command line left: exit status, stdout, stderr (as subprocess.CompletedProcess names them)."
    def __init__(self, returncode, stdout, stderr): self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def in_process(capsys, monkeypatch):
    "`rlhf-nb ARGS` as `launch.main(ARGS)` in this process, in folder `cwd` -> Result."
    monkeypatch.delenv("RLHF_NB_DEBUG", raising=False)
    def _run(*args, cwd):
        monkeypatch.chdir(cwd); capsys.readouterr()
        rc = launch.main([str(a) for a in args])
        out = capsys.readouterr()
        return Result(rc, out.out, out.err)
    return _run


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def error_lines(stderr):
    "The lines a user reads (library warnings filtered out)."
    return [l for l in stderr.strip().splitlines() if l.strip() and "Warning" not in l and not l.startswith("  warnings.warn")]


# --- --help -------------------------------------------------------------------------------------------------

def test_top_level_help_lists_every_subcommand(tmp_path):
    r = rlhf_nb("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for name in SUBCOMMANDS: assert f"\n  {name} " in r.stdout, name
    assert "accelerate launch" in r.stdout and "--accelerate_config" in r.stdout


@pytest.mark.parametrize("algo", ["ppo", "grpo", "dpo"])
def test_training_help_lists_every_option_with_its_help(tmp_path, algo, in_process):
    r = in_process(algo, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())                                   # argparse wraps help text
    hidden = launch.ALGORITHMS[algo][2]                                 # accepted, not listed: e.g. PPO's critic knobs on grpo
    for dc in launch._arg_types(algo):
        for f in dataclasses.fields(dc):
            if f.name in hidden: assert f"--{f.name} " not in out, f.name; continue
            assert f"--{f.name}" in out, f.name
            assert " ".join(f.metadata["help"].split()[:4]) in out, f.name
    assert "--config FILE.yaml" in out
    assert listing(tmp_path) == []


@pytest.mark.parametrize("name,dc", [("sft", launch.SFTArgs), ("rm", launch.RMArgs), ("eval", launch.EvalArgs),
                                     ("plot", launch.PlotArgs), ("demo", demo.DemoArgs)])
def test_stage_help_lists_every_option(tmp_path, name, dc, in_process):
    r = in_process(name, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    for f in dataclasses.fields(dc):
        assert f"--{f.name}" in out and " ".join(f.metadata["help"].split()[:3]) in out, f.name


# --- option groups: each shared option declared once -----------------------------------------------------------

def option_classes():
    "Every option dataclass defined in the package's modules: a dataclass whose fields carry help strings (not, e.g., RunLoop)."
    out = []
    for m in pkgutil.iter_modules(rlhf_nb_pkg.__path__):
        if m.name.startswith("_"): continue
        mod = importlib.import_module(f"rlhf_nb.{m.name}")
        out += [v for v in vars(mod).values() if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == mod.__name__
                and any("help" in f.metadata for f in dataclasses.fields(v))]
    return list(dict.fromkeys(out))


GROUPS = (OverwriteArgs, CheckpointArgs, TrackingArgs, DataArgs, LoraArgs, PeftArgs, LoadArgs)    # (the demo's bf16 is tri-state: None = on with CUDA)
# Options each stage declares for itself: their defaults or meanings differ by stage (max_steps counts RL steps in
# ppo/grpo and optimizer steps in sft, rm and dpo; learning_rate is 3e-5, 3e-4, 2e-4 or 3e-3; eval_size counts
# prompts or pairs). A name that is not here and is declared twice should join a group in rlhf_nb.config instead.
PER_STAGE = {"beta", "bf16", "dataset", "eval_size", "eval_steps", "learning_rate", "logging_steps", "loss_type", "lr_scheduler_type",
             "max_completion_length", "max_grad_norm", "max_length", "max_nan_steps", "max_prompt_length", "max_seconds", "max_steps",
             "model_name_or_path", "n_train", "num_generations", "output_dir", "overwrite_output_dir", "padding_free",
             "per_device_train_batch_size",
             "ref_strategy", "seed", "share_prompt_prefix", "temperature", "warm_start_dir", "warmup_steps",
             "weight_decay"}


def test_every_shared_option_is_declared_by_its_group_only():
    classes = option_classes()
    assert {SFTArgs, RMArgs, DPOConfig, GRPOConfig, demo.DemoArgs} <= set(classes)
    decl = option_declarations(classes)
    for g in GROUPS:
        for name in g.__dict__["__annotations__"]:
            assert decl[name] == [g], f"{name} is declared by {[c.__name__ for c in decl[name]]}, not only by {g.__name__}"
    assert set(repeated_options(classes)) <= PER_STAGE, set(repeated_options(classes)) - PER_STAGE


def test_sft_and_rm_take_their_shared_options_from_one_group():
    "SupervisedArgs' options are per stage elsewhere (PPO's learning_rate is 3e-5), but SFT and RM declare none of them."
    decl = option_declarations(option_classes())
    for name in SupervisedArgs.__dict__["__annotations__"]:
        assert SupervisedArgs in decl[name] and not {SFTArgs, RMArgs} & set(decl[name]), (name, [c.__name__ for c in decl[name]])


def test_one_default_for_lora_target_modules():
    defaults = {c.__name__: c().lora_target_modules for c in (SFTArgs, RMArgs, DPOConfig, PPOConfig, GRPOConfig)}
    assert set(map(tuple, defaults.values())) == {("all-linear",)}, defaults


# --- bad configuration: one line, status != 0, nothing written ----------------------------------------------

BAD = {
    "unknown key (command line)": (["ppo", "--learing_rate", "1e-5"], "unknown option --learing_rate; did you mean --learning_rate?"),
    "unknown key (yaml)": (["grpo", "--config", "run.yaml"], "run.yaml: unknown option learing_rate; did you mean learning_rate?"),
    "wrong type (command line)": (["ppo", "--max_steps", "ten"], "invalid int value: 'ten'"),
    "wrong type (yaml)": (["grpo", "--config", "types.yaml"], "invalid float value: 'fast'"),
    "bad choice": (["ppo", "--critic", "big"], "invalid choice: 'big'"),
    "missing model path": (["grpo", "--model_name_or_path", "/no/such/model"], "no such model folder '/no/such/model'"),
    "missing model path (relative)": (["ppo", "--model_name_or_path", "runs/sft/model"], "no such model folder"),
    "missing model (eval)": (["eval"], "--model_name_or_path is required"),
    "unknown algo": (["trpo", "--max_steps", "1"], "unknown subcommand 'trpo'; did you mean 'grpo'? choose one of: prep, "),
    "unknown algo (demo)": (["demo", "--algo", "trpo"], "invalid choice: 'trpo'"),
    "bad accelerate config path": (["ppo", "--accelerate_config", "/no/such/accelerate.yaml"],
                                   "accelerate config not found: /no/such/accelerate.yaml"),
    "one-process MULTI_CPU accelerate config": (["grpo", "--accelerate_config", "multi_cpu.yaml"], "starts ONE process"),
    "GPU accelerate config on a CPU machine": (["grpo", "--accelerate_config", "multi_gpu"], "needs GPUs"),
    "launcher flag without a config": (["grpo", "--num_processes", "2"], "only applies with --accelerate_config"),
    "config file missing": (["ppo", "--config", "nope.yaml"], "config file not found: nope.yaml"),
    "inconsistent options": (["ppo", "--ref_strategy", "none"], "kl_coef=0"),
    "unknown dataset": (["grpo", "--dataset", "gsm9k"], "--dataset 'gsm9k': not 'arith'"),
    "missing eval dataset": (["grpo", "--eval_dataset", "held/test.parquet"], "--eval_dataset 'held/test.parquet': not 'arith'"),
    "negative save_steps (RL)": (["grpo", "--save_steps", "-1"], "--save_steps -1 is out of range: it must be >= 0"),
    "negative save_total_limit (sft)": (["sft", "--save_total_limit", "-2"], "--save_total_limit -2 is out of range: it must be >= 0"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, case, in_process):
    args, msg = BAD[case]
    (tmp_path / "run.yaml").write_text("learning_rate: 1.0e-5\nlearing_rate: 2.0e-5\n")
    (tmp_path / "types.yaml").write_text("learning_rate: fast\n")
    (tmp_path / "multi_cpu.yaml").write_text("distributed_type: MULTI_CPU\nnum_processes: 2\n")
    before = listing(tmp_path)
    extra = ["--output_dir", "out"] if args[0] in ("ppo", "grpo", "dpo", "sft", "rm", "demo") else []
    r = in_process(*args, *extra, cwd=tmp_path)
    lines = error_lines(r.stderr)
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert len(lines) == 1 and msg in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert listing(tmp_path) == before                              # no output dir, no runs/, no temp files


def test_module_entry_point_reports_the_same_way(tmp_path):
    r = rlhf_nb("grpo", "--max_steps", "ten", cwd=tmp_path, module=True)
    assert r.returncode == 2 and error_lines(r.stderr) == ["rlhf-nb grpo: error: argument --max_steps: invalid int value: 'ten'"]


# --- training subcommands, one process ----------------------------------------------------------------------

def test_grpo_ppo_cli_and_chain_to_eval_and_plot(tmp_path):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("num_generations: 4\nmax_steps: 3\nlearning_rate: 1.0e-4\n")
    r = rlhf_nb("grpo", "--config", cfg, "--max_steps", "2", "--output_dir", "g", *TINY_RL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert (s["steps"], s["world_size"], s["ranks_identical"], s["algo"]) == (2, 1, True, "grpo")   # CLI beat the YAML
    assert s["final"]["kl_coef"] == GRPOConfig().kl_coef and "critic/vf_loss" not in s["final"]
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["checkpoint-2", "metrics.jsonl", "samples.jsonl", "summary.json"]
    r = rlhf_nb("ppo", "--max_steps", "1", "--output_dir", "p", *TINY_RL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert s["algo"] == "gae" and "critic/vf_loss" in s["final"]
    assert (tmp_path / "p" / "checkpoint-1" / "critic").is_dir()
    r = rlhf_nb("eval", "--model_name_or_path", "g/checkpoint-2/policy", "--eval_size", "8", "--output_file", "e.json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ev = json.loads(r.stdout.strip().splitlines()[-1])
    assert ev["n"] == 8 and 0 <= ev["accuracy"] <= 1 and json.loads((tmp_path / "e.json").read_text())["n"] == 8
    r = rlhf_nb("plot", "--runs", "g", "p", "--output", "curves.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_sft_then_rm(tmp_path):
    r = rlhf_nb("sft", "--max_steps", "6", "--eval_steps", "3", "--eval_size", "8", "--n_train", "64",
                "--per_device_train_batch_size", "8", "--output_dir", "sft", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = {p.name for p in (tmp_path / "sft").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "metrics.jsonl", "summary.json"} <= names
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    AutoModelForCausalLM.from_pretrained(tmp_path / "sft"); AutoTokenizer.from_pretrained(tmp_path / "sft")
    r = rlhf_nb("sft", "--max_steps", "1", "--output_dir", "sft", cwd=tmp_path)      # no silent clobbering
    assert r.returncode == 2 and "is not empty; pass --overwrite_output_dir" in r.stderr
    r = rlhf_nb("rm", "--model_name_or_path", "sft", "--max_steps", "3", "--eval_steps", "3", "--n_train", "32",
                "--eval_size", "8", "--output_dir", "rm", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "rm" / "summary.json").read_text())["stage"] == "rm"


def test_accelerate_launch_module_single_process(tmp_path):
    "`accelerate launch -m rlhf_nb.launch grpo ...` is the same program as `rlhf-nb grpo ...`."
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "rlhf_nb.launch", "grpo", "--max_steps", "1",
           "--num_generations", "2", "--output_dir", "a", *TINY_RL]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["world_size"] == 1


# --- the demo -----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not (SHARED / "gsm8k").exists(), reason=f"real data {SHARED / 'gsm8k'} is absent")
def test_demo_hub_code_path_offline(tmp_path):
    "The `--model_name_or_path M --dataset gsm8k` path: no SFT, GSM8K prepared once, GRPO, eval, outputs."
    from rlhf_nb.models import char_tokenizer, tiny_causal_lm
    tok = char_tokenizer(); tiny_causal_lm(tok).save_pretrained(tmp_path / "m"); tok.save_pretrained(tmp_path / "m")
    args = ["demo", "--model_name_or_path", "m", "--dataset", "gsm8k", "--dataset_source", SHARED / "gsm8k",
            "--max_steps", "1", "--eval_steps", "1", "--eval_size", "4", "--per_device_train_batch_size", "2",
            "--num_generations", "2", "--max_completion_length", "4", "--output_dir", "demo"]
    r = rlhf_nb(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no SFT stage" in r.stderr and "data: prepared gsm8k" in r.stderr
    s = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert s["rl_config"]["learning_rate"] == 1e-6 and s["rl_steps"] == 1 and s["dataset"].endswith("gsm8k")
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["curves.png", "metrics.jsonl", "model", "samples.jsonl", "summary.json"]
    assert (tmp_path / "runs" / "data" / "gsm8k" / "train.parquet").exists()

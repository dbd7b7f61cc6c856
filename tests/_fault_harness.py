"""Fault-injection harness: SIGKILL a training run at random moments, resume it, and check "resume == never stopped".

    python tests/_fault_harness.py [--faults 12] [--budget 90] [--seed 0]

One interpreter imports rlhf_nb once; every run is a forked child of it (no import cost per run, so many faults fit a
short budget) that calls the CLI's `rlhf_nb.launch.main` on the tiny runs of tests/test_resume.py (GRPO or DPO, one
thread, the dense arith reward of tests/_resume_worker.py). For each fault: a child starts the run, the harness
SIGKILLs it after a random delay drawn over the whole length of an uninterrupted run (start-up, mid-step, mid-write
of a checkpoint or metrics line, all possible), then restarts it with `--resume_from_checkpoint latest`, the advice
of every fault's error line (it starts over when the run died before its first checkpoint), until it finishes, and
compares metrics.jsonl and the final weights with the uninterrupted run of the same algorithm. Prints each fault and
the totals; exit status 1 on any mismatch.
"""
import argparse, os, random, signal, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _resume_worker import dense_arith_reward
from test_resume import ARGS, COMMON, RL_EXTRA, assert_same_metrics, assert_same_weights, checkpoints


def argv(algo, out, *extra):
    return [str(a) for a in [algo, "--output_dir", out, *ARGS[algo], *COMMON, *(RL_EXTRA if algo != "dpo" else []),
                             "--save_total_limit", 100, *extra]]


def start(args):
    "Fork a child running `rlhf-nb ARGS` (output silenced); -> its pid."
    pid = os.fork()
    if pid: return pid
    try:
        fd = os.open(os.devnull, os.O_WRONLY); os.dup2(fd, 1); os.dup2(fd, 2)
        import torch
        torch.set_num_threads(1)
        from rlhf_nb.launch import main
        code = main(args)
    except BaseException: code = 3
    os._exit(code or 0)


def wait(pid):
    "Exit status of child `pid` (negative: killed by that signal)."
    _, st = os.waitpid(pid, 0)
    return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)


def run_to_end(algo, out):
    "Restart `algo` into `out` with `--resume_from_checkpoint latest` (what the error lines advise) until it finishes; -> restarts."
    for n in range(1, 4):
        rc = wait(start(argv(algo, out, "--resume_from_checkpoint", "latest")))   # no checkpoint yet: latest starts over
        if rc == 0: return n
    raise AssertionError(f"{out}: the resumed run failed (exit status {rc})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", type=int, default=12); ap.add_argument("--budget", type=float, default=90)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from rlhf_nb.rewards import register_reward
    register_reward("arith")(dense_arith_reward)
    rng, tmp, t0 = random.Random(a.seed), Path(tempfile.mkdtemp(prefix="faults-")), time.time()
    refs = {}
    for algo in ("grpo", "dpo"):                                          # the uninterrupted runs, timed
        t = time.time(); assert wait(start(argv(algo, tmp / f"ref-{algo}"))) == 0, f"reference {algo} run failed"
        refs[algo] = (tmp / f"ref-{algo}", time.time() - t)
    injected = survived = finished_first = 0
    for i in range(a.faults):
        if time.time() - t0 > a.budget: break
        algo = rng.choice(sorted(refs)); ref, length = refs[algo]
        out, delay = tmp / f"run{i}", rng.uniform(0.0, refs[algo][1])
        pid = start(argv(algo, out)); time.sleep(delay); os.kill(pid, signal.SIGKILL)
        if wait(pid) != -signal.SIGKILL: finished_first += 1; print(f"fault {i}: {algo} finished before its kill at {delay:.2f}s"); continue
        injected += 1
        last = checkpoints(out)[-1].name if checkpoints(out) else "none"
        restarts = run_to_end(algo, out)
        assert_same_metrics(ref, out); assert_same_weights(ref, out)
        survived += 1
        print(f"fault {i}: {algo} SIGKILL at {delay:.2f}s of {length:.2f}s (latest checkpoint then: {last}); "
              f"{restarts} restart(s); resumed == never stopped", flush=True)
    print(f"injected faults: {injected}, survivals: {survived}, runs that finished before their kill: {finished_first}, "
          f"{time.time() - t0:.0f}s")
    return 0 if injected == survived and injected > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

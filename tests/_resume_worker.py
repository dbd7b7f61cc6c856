"""Run `rlhf-nb ARGS...` (the CLI's own `rlhf_nb.launch.main`) in this process, for the kill-and-resume tests.

    python tests/_resume_worker.py [--kill_at_save STEP --kill_point mid|rename] [--step_sleep S] -- ppo --output_dir D ...

Two things differ from the plain console script, both so that a tiny run says something:
- the reward of data_source "arith" is replaced by a dense one (the fraction of characters with an even code point),
  so an untrained tiny policy gets non-zero, varying scores, gradients and advantages (the real arith reward is 0
  for every sample of a random model, and a resume test on all-zero metrics would prove nothing);
- `--kill_at_save STEP` sends this process SIGKILL in the middle of writing checkpoint STEP: `mid` = at the first
  `torch.save` into that checkpoint's folder (the weights are written, the optimizer state is not), `rename` = when
  the finished temporary folder is about to be renamed to `checkpoint-STEP`;
- `--signal_at_log STEP --signal TERM|INT|KILL` sends this process that signal right after the metrics row of step
  STEP is written (a real signal, delivered in the middle of that step's bookkeeping, before its checkpoint).
"""
import os, re, signal, sys
from pathlib import Path


def dense_arith_reward(solution_str, ground_truth=None, extra_info=None):
    "Fraction of characters with an even code point: in [0, 1], varies from sample to sample."
    return sum(ord(c) % 2 == 0 for c in solution_str) / max(1, len(solution_str))


def _die(): os.kill(os.getpid(), signal.SIGKILL)


def arm_kill(step, point):
    "Make this process SIGKILL itself while checkpoint `step` is being written."
    name = f"checkpoint-{step}"
    inside = re.compile(rf"checkpoint-{step}(?!\d)")
    if point == "mid":
        import torch
        save = torch.save
        def killing_save(obj, f, *a, **kw):
            if isinstance(f, (str, os.PathLike)) and inside.search(Path(f).parent.name): _die()
            return save(obj, f, *a, **kw)
        torch.save = killing_save
    elif point == "rename":
        for fn in ("replace", "rename"):
            orig = getattr(os, fn)
            def killing(src, dst, *a, _orig=orig, **kw):
                if Path(dst).name == name: _die()
                return _orig(src, dst, *a, **kw)
            setattr(os, fn, killing)
    else: raise SystemExit(f"--kill_point must be mid or rename, not {point!r}")


def slow_steps(seconds):
    "Sleep after every RL step, so a test can act (kill a Ray worker) while the run is surely still going."
    import time
    from rlhf_nb.ppo import RLTrainer
    step = RLTrainer.step
    def slow(self):
        m = step(self); time.sleep(seconds); return m
    RLTrainer.step = slow


def arm_signal(step, name):
    "Send this process SIG`name` just after the metrics row of step `step` is written."
    from rlhf_nb.tracking import RunLog
    log = RunLog.log
    def signalling_log(self, row):
        log(self, row)
        if row.get("step") == step: os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
    RunLog.log = signalling_log


def main(argv):
    kill_at, point, sig_at, sig, step_sleep = None, "mid", None, "TERM", 0.0
    if "--" in argv:
        i = argv.index("--"); opts, argv = argv[:i], argv[i + 1:]
        for k, v in zip(opts[::2], opts[1::2]):
            if k == "--kill_at_save": kill_at = int(v)
            elif k == "--kill_point": point = v
            elif k == "--step_sleep": step_sleep = float(v)
            elif k == "--signal_at_log": sig_at = int(v)
            elif k == "--signal": sig = v
            else: raise SystemExit(f"unknown worker option {k}")
    import torch
    torch.set_num_threads(1)
    from rlhf_nb.rewards import register_reward
    register_reward("arith")(dense_arith_reward)
    if kill_at is not None: arm_kill(kill_at, point)
    if step_sleep: slow_steps(step_sleep)
    if sig_at is not None: arm_signal(sig_at, sig)
    from rlhf_nb.launch import main as cli
    return cli(argv)


if __name__ == "__main__":
    from rlhf_nb.dist import exit_process
    exit_process(main(sys.argv[1:]))                                     # a launched rank: no C++ teardown (it can abort)

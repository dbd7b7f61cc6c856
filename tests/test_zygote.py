"""tests/_zygote.py, the fork server behind the resume and fault tests' worker processes: a forked child behaves as
`subprocess.Popen([sys.executable, script, ...])` would (argv, environment, folder, output file, exit status, signals),
and the fallback to an ordinary process gives the same answers."""
import os, signal, sys, time

import pytest

from _zygote import Child, spawn

SCRIPT = """import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("ZYGOTE_TEST"), "main", __name__, flush=True)
if sys.argv[1] == "exit": sys.exit(int(sys.argv[2]))
if sys.argv[1] == "raise": raise ValueError("a worker's own error")
if sys.argv[1] == "wait":
    open(sys.argv[2], "w").close()
    time.sleep(120)
"""


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_child_behaves_as_a_fresh_interpreter(fork, tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_NB_TEST_FORK", fork)
    script, log = tmp_path / "worker.py", tmp_path / "out.log"
    script.write_text(SCRIPT)
    env = {**os.environ, "ZYGOTE_TEST": "seen", "OMP_NUM_THREADS": "1"}
    run = lambda *a: spawn([sys.executable, str(script), *map(str, a)], env=env, cwd=tmp_path, log=log)
    child = run("exit", 3)
    assert isinstance(child, Child) == (fork == "1")
    assert child.wait(120) == 3 and child.poll() == 3
    assert f"argv ['exit', '3'] cwd {tmp_path} env seen main __main__" in log.read_text()
    assert run("raise").wait(120) == 1 and "ValueError: a worker's own error" in log.read_text()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        ready = tmp_path / f"ready-{sig}"
        child = run("wait", ready)
        t0 = time.monotonic()
        while not ready.exists():
            assert child.poll() is None and time.monotonic() - t0 < 120, log.read_text()[-2000:]
            time.sleep(0.05)
        child.send_signal(sig)
        assert child.wait(120) == -sig

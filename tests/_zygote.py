"""A fork server for the tests' worker processes: one interpreter imports torch, transformers and rlhf_nb once, then
forks a child for every run, which executes a script as `python SCRIPT ARGS...` would (as `__main__`, with that
argv, environment, working folder and output file).

Each child is a real process of its own: it gets signals (SIGTERM, SIGINT, SIGKILL), dies, leaves files behind and
ends with an exit status exactly like an interpreter started for it; only the 5-6 CPU-seconds of imports are skipped
(a fork costs milliseconds). The server forks only while it has a single OS thread (checked before each fork: a fork
with other threads alive could copy a held lock); when that does not hold, or the server cannot start, `spawn` starts
an ordinary interpreter instead, so a test never depends on this shortcut to pass.

The server talks JSON lines over its stdin/stdout; a reader thread in the test process turns exit reports into
`Child.wait()` results. Usage: `Child = spawn(argv, env=..., cwd=..., log=path)`; `argv[0]` is `sys.executable`.
"""
import atexit, json, os, select, subprocess, sys, threading

PRELOAD = ("torch", "transformers", "accelerate", "peft", "rlhf_nb.launch", "rlhf_nb.ppo", "rlhf_nb.algos",
           "rlhf_nb.dpo", "rlhf_nb.sft", "rlhf_nb.reward_model", "rlhf_nb.fast", "rlhf_nb.async_rl")


# --- the server side (python tests/_zygote.py) ------------------------------------------------------------------------

def _threads(): return len(os.listdir("/proc/self/task"))


def _child(req):
    "In the forked child: become `python argv[1:]` with the request's environment, folder and output file; never return."
    code = 1
    try:
        os.setpgid(0, 0) if req.get("new_group") else None
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
        sys.stdin = open(0, closefd=False); sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear(); os.environ.update(req["env"]); os.chdir(req["cwd"])
        import runpy
        sys.argv = list(req["argv"][1:])
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
        try:
            runpy.run_path(sys.argv[0], run_name="__main__"); code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else (print(e.code, file=sys.stderr) or 1))
        except BaseException:
            import traceback; traceback.print_exc(); code = 1
        import atexit as _atexit; _atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try: f.flush()
            except Exception: pass
        os._exit(code)


def serve():
    "The server loop: preload, then fork one child per request line and report every child's exit."
    import importlib
    for m in PRELOAD:
        try: importlib.import_module(m)
        except Exception: pass
    out = sys.stdout
    def say(**kw): out.write(json.dumps(kw) + "\n"); out.flush()
    say(ready=True, threads=_threads())
    live, buf = set(), b""
    while True:
        r, _, _ = select.select([0], [], [], 0.05)
        if r:
            chunk = os.read(0, 65536)
            if not chunk: break                                              # the test process went away
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if _threads() != 1: say(id=req["id"], refused=f"{_threads()} threads"); continue
                pid = os.fork()
                if pid == 0: _child(req)
                live.add(pid); say(id=req["id"], pid=pid)
        for pid in list(live):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done: live.discard(pid); say(exit=pid, code=os.waitstatus_to_exitcode(status))
    for pid in live:
        try: os.kill(pid, 9)
        except ProcessLookupError: pass


# --- the client side (imported by the tests) --------------------------------------------------------------------------

class Child:
    "A forked worker with the part of `subprocess.Popen` the tests use: pid, poll, wait, kill, send_signal, returncode."
    def __init__(self, pid):
        self.pid, self.returncode, self._done = pid, None, threading.Event()
    def _exited(self, code): self.returncode = code; self._done.set()
    def poll(self): return self.returncode
    def wait(self, timeout=None):
        if not self._done.wait(timeout): raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode
    def send_signal(self, sig):
        if self.returncode is None: os.kill(self.pid, sig)
    def kill(self): self.send_signal(9)
    def terminate(self): self.send_signal(15)


class _Server:
    def __init__(self, env):
        # pyarrow's allocator (jemalloc) starts a background thread when it loads, unless told not to: without it the
        # server stays single-threaded and may fork (the children's environment is the test's, without this variable)
        server_env = dict(env, JE_ARROW_MALLOC_CONF="background_thread:false")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=server_env, cwd=os.path.dirname(os.path.abspath(__file__)))
        first = json.loads(self.proc.stdout.readline() or "{}")
        self.ok = bool(first.get("ready")) and first.get("threads") == 1
        self.lock, self.replies, self.children, self.next_id = threading.Lock(), {}, {}, 0
        self.exits = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.lock:
                if "exit" in msg:
                    child = self.children.pop(msg["exit"], None)
                    if child: child._exited(msg["code"])
                    else: self.exits[msg["exit"]] = msg["code"]            # exited before its Child was registered
                else:
                    self.replies[msg["id"]][1].update(msg); self.replies[msg["id"]][0].set()

    def spawn(self, argv, env, cwd, log, new_group=False):
        with self.lock:
            self.next_id += 1; rid = self.next_id
            self.replies[rid] = (threading.Event(), {})
        req = dict(id=rid, argv=[str(a) for a in argv], env=env, cwd=str(cwd), log=str(log), new_group=new_group)
        self.proc.stdin.write((json.dumps(req) + "\n").encode()); self.proc.stdin.flush()
        ev, msg = self.replies[rid]
        if not ev.wait(60) or "pid" not in msg: return None
        child = Child(msg["pid"])
        with self.lock:
            if child.pid in self.exits: child._exited(self.exits.pop(child.pid))
            else: self.children[child.pid] = child
        return child

    def close(self):
        try: self.proc.stdin.close(); self.proc.wait(timeout=10)
        except Exception: self.proc.kill()


_SERVERS = {}


def spawn(argv, env, cwd, log):
    """Start `argv` (`[sys.executable, script, *args]`) with stdout and stderr appended to the file `log`: forked from a
    server started with the same environment, or an ordinary process when that is not possible. -> a Popen-like object."""
    key = json.dumps(sorted(env.items()))
    if argv[0] == sys.executable and len(argv) > 1 and argv[1].endswith(".py") and os.environ.get("RLHF_NB_TEST_FORK", "1") == "1":
        if key not in _SERVERS:
            try: _SERVERS[key] = _Server(env)
            except Exception: _SERVERS[key] = None
        server = _SERVERS[key]
        if server is not None and server.ok:
            child = server.spawn(argv, env, cwd, log)
            if child is not None: return child
    with open(log, "a") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)


@atexit.register
def _close_servers():
    for s in _SERVERS.values():
        if s is not None: s.close()


if __name__ == "__main__":
    serve()

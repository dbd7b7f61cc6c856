"""Hostile clients of the rollout server (`rlhf-nb vllm-serve`, rlhf_nb.rollout_server) on 127.0.0.1.

The server runs `serve` on a thread of this process with the `hf` engine on a tiny random model (the process boundary
is not what most of these test); one test starts it as a process to show its watchdog ends it when the parent dies.
Each bad request must end in an HTTP 4xx with a one-line JSON error that names the problem, leave the engine's weights
as they were, and leave the server answering its health check. Every wait is bounded; nothing sleeps."""
import http.client, io, json, os, pickle, queue, socket, subprocess, sys, threading, time, zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlhf_nb.models import char_tokenizer, tiny_causal_lm
from rlhf_nb.rollout import HFEngine, save_for_engine
from rlhf_nb.rollout_server import ServerLimits, saved, serve

ROOT = Path(__file__).resolve().parents[1]
KEY = "test-key-0123456789"
LIMITS = ServerLimits(max_request_bytes=4096, max_request_samples=8, max_sample_tokens=16, max_prompt_tokens=32,
                      request_timeout=2)
JSON, OCTET = {"Content-Type": "application/json"}, {"Content-Type": "application/octet-stream"}
MUTATING = ["/generate", "/update_weights", "/sleep", "/wake_up", "/shutdown"]


@pytest.fixture(scope="module")
def server():
    tok = char_tokenizer()
    engine = HFEngine(tiny_causal_lm(tok, seed=0), tok.eos_token_id, tok.pad_token_id, shared=False)
    engine.max_model_len = 40                                       # prompt + max_tokens, as `vllm-serve --max_model_len`
    up, stop, addr = threading.Event(), threading.Event(), []
    t = threading.Thread(target=serve, args=(engine, "127.0.0.1", 0), daemon=True,
                         kwargs=dict(ready=lambda a: (addr.extend(a), up.set()), api_key=KEY, limits=LIMITS, stop=stop))
    t.start()
    assert up.wait(60), "the server did not start"
    yield SimpleNamespace(addr=tuple(addr), engine=engine, before={k: v.clone() for k, v in engine.model.state_dict().items()})
    stop.set(); t.join(15)
    assert not t.is_alive(), "serve did not return after its stop event"


def call(addr, method, route, body=b"", headers=None, key=KEY):
    "One request -> (status, JSON answer)."
    c = http.client.HTTPConnection(*addr, timeout=30)
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request(method, route, body=body, headers={**JSON, **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})})
    r = c.getresponse()
    out = (r.status, json.loads(r.read() or b"{}"))
    c.close()
    return out


def raw(addr, data):
    "Bytes as sent by a client that writes its own HTTP -> (status, JSON answer)."
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536): got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def healthy(srv):
    "The server answers /health, and the engine's weights are the ones it started with."
    assert call(srv.addr, "GET", "/health", key=None)[0] == 200
    now = srv.engine.model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in srv.before.items()), "a refused request changed the weights"


def weights(srv, **change):
    "The model's embedding under its name, or a changed copy (name=..., tensor=...)."
    emb = srv.before["model.embed_tokens.weight"].clone()
    return saved({change.get("name", "model.embed_tokens.weight"): change.get("tensor", emb)})


def test_an_idle_connection_does_not_freeze_the_server(server):
    idle = socket.create_connection(server.addr, timeout=30)                      # connected, never speaks
    half = socket.create_connection(server.addr, timeout=30)                      # declares a body it never sends
    half.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n")
    t0 = time.monotonic()
    assert call(server.addr, "GET", "/health", key=None)[0] == 200
    status, ans = call(server.addr, "POST", "/generate", {"prompts": [[5, 6, 7]], "params": {"max_tokens": 4, "temperature": 0}})
    assert status == 200 and len(ans["completions"]) == 1
    assert time.monotonic() - t0 < 10
    assert idle.recv(1) == b""                                  # closed by the server after request_timeout, not held forever
    assert b" 408 " in half.recv(1 << 16).split(b"\r\n")[0]                 # the stalled body: 408 after request_timeout
    idle.close(); half.close()
    healthy(server)


@pytest.mark.parametrize("route", MUTATING)
@pytest.mark.parametrize("key", [None, "wrong", KEY + "x"])
def test_every_mutating_endpoint_needs_the_key(server, route, key):
    body, headers = (weights(server), OCTET) if route == "/update_weights" else ({"prompts": [[5]]}, JSON)
    status, ans = call(server.addr, "POST", route, body, headers, key=key)
    assert (status, ans["error"]) == (401, "missing or wrong API key: send 'Authorization: Bearer <key>' (--api_key, $RLHF_NB_API_KEY)")
    healthy(server)                                                 # /shutdown without the key did not stop it


GEN = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n" % KEY
EVIL = type("Evil", (), {"__reduce__": lambda self: (os.system, ("touch /tmp/rlhf_nb_hostile_pickle_ran",))})


def evil_archive():
    "A torch.save-shaped zip whose pickle would run a shell command if it were unpickled in full."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"model.embed_tokens.weight": EVIL()}, protocol=2))
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def deflated(srv):
    "The model's weights in a zip whose members are compressed (a small body that unpacks large)."
    src, buf = zipfile.ZipFile(io.BytesIO(weights(srv))), io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n in src.namelist(): z.writestr(n, src.read(n))
    return buf.getvalue()


BAD = {   # name: (how to send it, status, what the error says)
    "oversize body": (lambda s: call(s.addr, "POST", "/generate", b"[" * 5000), 413, "5000 bytes is over --max_request_bytes (4096 bytes)"),
    "negative Content-Length": (lambda s: raw(s.addr, (GEN + "Content-Length: -1\r\n\r\n{}").encode()), 400, "Content-Length must be a byte count, got '-1'"),
    "chunked body": (lambda s: raw(s.addr, (GEN + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode()), 411, "send a Content-Length"),
    "huge declared weights": (lambda s: raw(s.addr, ("POST /update_weights HTTP/1.1\r\nAuthorization: Bearer %s\r\nContent-Type: "
                              "application/octet-stream\r\nContent-Length: 300000000000\r\n\r\n" % KEY).encode()), 413, "is over --max_weights_bytes"),
    "too many samples": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[5]] * 3, "params": {"n": 3}}), 400,
                         "3 prompts x n=3 is over --max_request_samples (8)"),
    "too many tokens": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[5]], "params": {"max_tokens": 17}}), 400, "--max_sample_tokens (16)"),
    "long prompt": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[5] * 33]}), 400, "33 tokens, over --max_prompt_tokens (32)"),
    "out-of-vocabulary id": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[5, 102]]}), 400, "token id 102 is not in the vocabulary [0, 102)"),
    "negative id": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[-3]]}), 400, "token id -3 is not in the vocabulary"),
    "empty prompt": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[5], []]}), 400, "prompt 1 is empty"),
    "no prompts": (lambda s: call(s.addr, "POST", "/generate", {"prompts": []}), 400, '{"prompts": [[token ids], ...]'),
    "NaN temperature": (lambda s: call(s.addr, "POST", "/generate", b'{"prompts": [[5]], "params": {"temperature": NaN}}'), 400,
                        "params.temperature must be a finite number"),
    "bad JSON": (lambda s: call(s.addr, "POST", "/generate", b"{'prompts'"), 400, "the body is not JSON"),
    "deep JSON": (lambda s: call(s.addr, "POST", "/generate", b"[" * 2000 + b"]" * 2000), 400, "the body is not JSON (RecursionError)"),
    "form post": (lambda s: call(s.addr, "POST", "/generate", b"prompts=1", {"Content-Type": "text/plain"}), 415, "takes Content-Type application/json"),
    "web page": (lambda s: call(s.addr, "POST", "/shutdown", {}, {"Origin": "http://evil.example"}), 403, "requests from web pages"),
    "rebinding host": (lambda s: call(s.addr, "GET", "/health", headers={"Host": "evil.example:8000"}, key=None), 403, "is not this loopback server's"),
    "raw pickle": (lambda s: call(s.addr, "POST", "/update_weights", pickle.dumps(EVIL()), OCTET), 400, "not a torch.save archive"),
    "pickle in the archive": (lambda s: call(s.addr, "POST", "/update_weights", evil_archive(), OCTET), 400, "weights-only load refused"),
    "compressed archive": (lambda s: call(s.addr, "POST", "/update_weights", deflated(s), OCTET), 400, "compressed or unpacks to more"),
    "wrong weight name": (lambda s: call(s.addr, "POST", "/update_weights", weights(s, name="model.evil.weight"), OCTET), 400,
                          "the model has no weight named 'model.evil.weight'"),
    "wrong weight shape": (lambda s: call(s.addr, "POST", "/update_weights", weights(s, tensor=torch.zeros(3, 128)), OCTET), 400,
                           "weight 'model.embed_tokens.weight' is (3, 128), the model's is a tensor of shape (102, 128)"),
    "NaN weights": (lambda s: call(s.addr, "POST", "/update_weights", weights(s, tensor=torch.full((102, 128), float("nan"))), OCTET), 400,
                    "weight 'model.embed_tokens.weight' has NaN or infinite values"),
    "inf weights": (lambda s: call(s.addr, "POST", "/update_weights", weights(s, tensor=torch.full((102, 128), float("inf"))), OCTET), 400,
                    "has NaN or infinite values"),
    "bad version": (lambda s: call(s.addr, "POST", "/update_weights?version=-1", weights(s), OCTET), 400, "version must be an integer >= 0"),
    "over the context": (lambda s: call(s.addr, "POST", "/generate", {"prompts": [[5] * 30], "params": {"max_tokens": 16}}), 400,
                         "prompt 0 (30 tokens) + max_tokens=16 is over the model's context of 40 tokens (--max_model_len)"),
    "no such endpoint": (lambda s: call(s.addr, "POST", "/exec", {}), 404, "no such endpoint: POST /exec"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_request_is_one_line_and_changes_nothing(server, name):
    send, want_status, says = BAD[name]
    status, ans = send(server)
    assert status == want_status and says in ans["error"], (status, ans)
    assert set(ans) == {"error"} and "\n" not in ans["error"]
    assert not Path("/tmp/rlhf_nb_hostile_pickle_ran").exists()
    healthy(server)


def test_a_good_update_and_a_burst_of_clients(server):
    "A valid sync (the same values) moves the version; 64 clients at once are all answered (a listen backlog of 128)."
    status, ans = call(server.addr, "POST", "/update_weights?version=7", weights(server), OCTET)
    assert status == 200 and ans["seconds"] >= 0
    out = queue.Queue()
    threads = [threading.Thread(target=lambda: out.put(call(server.addr, "GET", "/health", key=None))) for _ in range(64)]
    for t in threads: t.start()
    for t in threads: t.join(30)
    got = [out.get_nowait() for _ in range(out.qsize())]
    assert len(got) == 64 and all(s == 200 and a["weight_version"] == 7 for s, a in got)
    healthy(server)


def test_bound_beyond_loopback_it_warns(capsys):
    tok = char_tokenizer()
    engine = HFEngine(tiny_causal_lm(tok, seed=0, num_hidden_layers=1), tok.eos_token_id, tok.pad_token_id, shared=False)
    stop = threading.Event(); stop.set()
    serve(engine, "0.0.0.0", 0, stop=stop)
    err = capsys.readouterr().err
    assert "WARNING: listening on 0.0.0.0:" in err and "ANYONE, with no API key" in err


def test_the_watchdog_fires_while_a_connection_is_held(tmp_path):
    "A served process whose parent dies exits, though a client holds a silent connection open."
    tok = char_tokenizer()
    save_for_engine(tiny_causal_lm(tok, seed=0, num_hidden_layers=1), tok, tmp_path / "model")
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {**os.environ, "RLHF_NB_API_KEY": KEY, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen([sys.executable, "-c", "import sys; from rlhf_nb.rollout_server import serve_main; sys.exit(serve_main())",
                               "--model", str(tmp_path / "model"), "--engine", "hf", "--port", "0", "--request_timeout", "600",
                               "--parent_pid", str(parent.pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in server.stdout], daemon=True).start()
    try:
        line = ""
        while "ready on" not in line: line = lines.get(timeout=120)
        addr = ("127.0.0.1", int(line.rsplit(":", 1)[1]))
        held = socket.create_connection(addr, timeout=30)                          # silent, with a 600 s time limit
        assert call(addr, "GET", "/health", key=None)[0] == 200
        assert call(addr, "POST", "/sleep", {}, key=None)[0] == 401           # the key came through the environment
        parent.kill(); parent.wait()
        t0 = time.monotonic()
        assert server.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 30
        held.close()
    finally:
        for p in (parent, server):
            if p.poll() is None: p.kill(); p.wait()

"""A hostile client against `rlhf-nb tinker-serve` on 127.0.0.1 (server on a thread, port 0): paths that leave the
root, a rebinding Host, a foreign Origin, text/plain and form bodies, missing and wrong keys, another client's ids,
bodies and requests beyond the caps. Each ends in an HTTP 4xx with one line of JSON naming what is wrong (and the
flag, for a cap), nothing is written outside the root, and the server answers its health check after every case."""
import json, os, socket, threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK is not installed (pip install tinker==0.38.0)")
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402
from rlhf_nb.tinker_serve import ServeLimits, make_server, serve_main, start_server  # noqa: E402

LIMITS = ServeLimits(max_body_bytes=64 << 10, max_num_samples=4, max_tokens=16, max_model_len=64,
                     max_num_batched_tokens=128, max_models=2, max_samplers=2, max_pending=6)
PROMPT = {"chunks": [{"tokens": [3, 4, 5], "type": "encoded_text"}]}


def files_outside(top, root):
    "Every path under `top` that is not under `root` (links not followed)."
    out = set()
    for d, dirs, files in os.walk(top):
        if Path(d).is_relative_to(root): continue
        out |= {os.path.join(d, f) for f in dirs + files}
    return out


def send(port, name, body=None, headers=None, method="POST", key="tml-alice"):
    "One request on its own connection -> (status, decoded JSON answer)."
    raw = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json",
         "Content-Length": None if method == "GET" else str(len(raw)),
         **({"X-API-Key": key} if key else {}), **(headers or {})}
    head = f"{method} /api/v1/{name} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    return exchange(port, head.encode() + b"Connection: close\r\n\r\n" + (b"" if method == "GET" else raw))


def exchange(port, data):
    "Send raw bytes, read the answer until the server closes -> (status, decoded JSON)."
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536): chunks.append(chunk)
    head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    try: return int(head.split()[1]), json.loads(payload)
    except ValueError: return int(head.split()[1]), payload                  # a protobuf answer


def detail(answer): return answer[1]["detail"]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    top = tmp_path_factory.mktemp("hostile")
    root, outside = top / "a" / "b" / "root", top / "outside"
    root.mkdir(parents=True)
    (outside / "ckpt").mkdir(parents=True); (outside / "ckpt" / "state.pt").write_bytes(b"not a checkpoint")
    (outside / "model").mkdir(); (outside / "model" / "config.json").write_text("{}")
    os.symlink(outside, root / "link")
    httpd = start_server(port=0, root=str(root), limits=LIMITS)
    port = httpd.server_port
    b = SimpleNamespace(top=top, root=root, outside=outside, port=port, httpd=httpd, before=files_outside(top, root))
    b.call = lambda name, body=None, **kw: send(port, name, body, **kw)
    b.sid = b.call("create_session")[1]["session_id"]
    b.mid = new_model(b, 0)
    yield b
    httpd.shutdown(); httpd.server_close()


def new_model(b, seq, key="tml-alice"):
    ans = b.call("create_model", {"session_id": b.sid, "model_seq_id": seq, "base_model": "tiny",
                                  "lora_config": {"rank": 4}}, key=key)
    assert ans[0] == 200, ans
    return result(b, ans[1]["request_id"], key)["model_id"]


def result(b, rid, key="tml-alice"):
    ans = b.call("retrieve_future", {"request_id": rid}, key=key)
    assert ans[0] == 200 and (isinstance(ans[1], bytes) or "error" not in ans[1]), ans
    return ans[1]


@pytest.fixture(autouse=True)
def still_healthy(request):
    yield
    if "box" in request.fixturenames:
        b = request.getfixturevalue("box")
        assert b.call("healthz") == (200, {"status": "ok"})
        assert b.call("healthz", method="GET") == (200, {"status": "ok"})


def test_paths_that_leave_the_root_are_refused_and_nothing_is_written_outside(box):
    b = box
    for name in ["../../../X", "../../../../outside/X", "/tmp/X", str(b.outside / "X"), "a/b", "..", ".x", "x" * 200]:
        ans = b.call("save_weights", {"model_id": b.mid, "path": name})
        assert ans[0] == 400 and "is refused" in detail(ans), (name, ans)
    saved = result(b, b.call("save_weights", {"model_id": b.mid, "path": "ok"})[1]["request_id"])["path"]
    run_dir = b.root / saved.removeprefix("tinker://").split("/")[0]
    os.symlink(b.outside, run_dir / "weights" / "planted")                 # a link someone left in the root
    ans = b.call("save_weights", {"model_id": b.mid, "path": "planted"})
    assert ans[0] == 400 and "no link out" in detail(ans), ans
    lines = set()
    for path in ["/etc", str(b.outside / "ckpt"), str(b.outside / "nothing"), "tinker://../../../outside/ckpt",
                 "../../../outside/nothing", "link/ckpt", "tinker://link/nothing", "tinker://run-x/../../../../ckpt"]:
        for name, body in [("load_weights", {"model_id": b.mid, "path": path}),
                           ("create_sampling_session", {"model_path": path})]:
            ans = b.call(name, body)
            assert ans[0] == 400, (path, ans)
            lines.add(detail(ans).replace(repr(path), "<p>").replace("model_path", "path"))
    assert len(lines) == 1, lines                                         # one line: existing or not
    for base in [str(b.outside / "model"), "link/model", "../../../outside/model"]:
        ans = b.call("create_model", {"session_id": b.sid, "model_seq_id": 9, "base_model": base})
        assert ans[0] == 400 and "is not local" in detail(ans), ans
    assert files_outside(b.top, b.root) == b.before                       # nothing written outside the root
    assert result(b, b.call("load_weights", {"model_id": b.mid, "path": saved})[1]["request_id"])["path"] == saved


def test_a_rebinding_host_a_foreign_origin_and_page_bodies_are_refused(box):
    b = box
    assert b.call("healthz", headers={"Host": "evil.example"})[0] == 403
    assert "--allowed_hosts" in detail(b.call("create_session", headers={"Host": f"evil.example:{b.port}"}))
    for origin in ["http://evil.example", "null", f"http://localhost:{b.port}"]:     # localhost is not 127.0.0.1
        ans = b.call("create_session", headers={"Origin": origin})
        assert ans[0] == 403 and "Origin" in detail(ans), (origin, ans)
    assert b.call("create_session", headers={"Origin": f"http://127.0.0.1:{b.port}"})[0] == 200
    for ctype in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]:
        ans = b.call("create_session", headers={"Content-Type": ctype})
        assert ans[0] == 415 and "application/json" in detail(ans), (ctype, ans)
    assert b.call("forward_backward", {"model_id": b.mid})[0] == 415        # JSON where protobuf belongs
    assert b.call("create_session", method="OPTIONS")[0] == 405              # no CORS preflight ever passes
    assert b.call("create_session", method="GET")[0] == 405
    assert b.call("create_session", b"[" * 50_000)[0] == 400
    assert b.call("create_session", b"[1, 2]")[0] == 400


@pytest.mark.filterwarnings("ignore:DEPRECATED")
def test_a_missing_or_wrong_key_is_a_401_and_the_sdk_sends_the_right_one(tmp_path, monkeypatch):
    httpd = start_server(port=0, root=str(tmp_path), api_key="tml-secret")
    try:
        port = httpd.server_port
        for key, headers in [(None, {}), ("tml-guess", {}), (None, {"Authorization": "Bearer tml-guess"}),
                             (None, {"Authorization": "tml-secret"})]:
            ans = send(port, "healthz", key=key, headers=headers)
            assert ans[0] == 401 and "--api_key" in detail(ans), (key, headers, ans)
        assert send(port, "healthz", key="tml-secret")[0] == 200
        assert send(port, "healthz", key=None, headers={"Authorization": "Bearer tml-secret"})[0] == 200
        monkeypatch.setenv("TINKER_API_KEY", "tml-secret")
        sc = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}")
        assert [m.model_name for m in sc.get_server_capabilities().supported_models] == ["tiny"]
        monkeypatch.setenv("TINKER_API_KEY", "tml-guess")
        with pytest.raises(tinker.APIStatusError, match="missing or wrong API key"):
            tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}").get_server_capabilities()
    finally:
        httpd.shutdown(); httpd.server_close()


def test_ids_are_unguessable_and_answer_only_their_owner(box):
    b = box
    rids = [b.call("optim_step", {"model_id": b.mid, "adam_params": {"learning_rate": 0.0}})[1]["request_id"]
            for _ in range(2)]
    assert rids[0] != rids[1] and all(len(r) >= 20 for r in rids) and len(b.sid) >= 20
    saved = result(b, b.call("save_weights", {"model_id": b.mid, "path": "mine"})[1]["request_id"])["path"]
    mallory = dict(key="tml-mallory")
    unknown = b.call("retrieve_future", {"request_id": "req-" + "x" * 22}, **mallory)
    theirs = b.call("retrieve_future", {"request_id": rids[0]}, **mallory)
    assert theirs[0] == unknown[0] == 404
    assert detail(theirs).replace(rids[0], "<id>") == detail(unknown).replace("req-" + "x" * 22, "<id>")
    for name, body in [("get_info", {"model_id": b.mid}), ("save_weights", {"model_id": b.mid, "path": "steal"}),
                       ("unload_model", {"model_id": b.mid}), (f"sessions/{b.sid}/finish", {}),
                       ("create_model", {"session_id": b.sid, "model_seq_id": 7, "base_model": "tiny"}),
                       ("load_weights", {"session_id": b.sid, "model_seq_id": 7, "path": saved}),
                       ("create_sampling_session", {"model_path": saved})]:
        ans = b.call(name, body, **mallory)
        assert ans[0] == 404, (name, ans)
    assert all("metrics" in result(b, r) for r in rids)                  # the owner still gets them


def test_bodies_and_requests_beyond_the_caps_name_the_limit(box):
    b, cap = box, LIMITS.max_body_bytes
    head = "POST /api/v1/create_session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    big = exchange(b.port, (head + f"Content-Length: {300 << 20}\r\n\r\n").encode())      # no byte of it sent
    assert big[0] == 413 and f"--max_body_bytes {cap}" in detail(big)
    assert exchange(b.port, (head + "Content-Length: -1\r\n\r\n").encode())[0] == 400
    assert exchange(b.port, (head + "Content-Length: 1, 2\r\n\r\n").encode())[0] == 400
    assert exchange(b.port, (head + "\r\n").encode())[0] == 411
    assert exchange(b.port, (head + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode())[0] == 411
    sampler = b.call("create_sampling_session", {"base_model": "tiny"})[1]["sampling_session_id"]
    ask = lambda **kw: b.call("asample", {"sampling_session_id": sampler, "prompt": PROMPT, **kw})
    for kw, flag in [(dict(num_samples=200_000), "--max_num_samples"), (dict(num_samples=-1), "--max_num_samples"),
                     (dict(num_samples="2"), "--max_num_samples"),
                     (dict(sampling_params={"max_tokens": 10**6}), "--max_tokens"),
                     (dict(prompt={"chunks": [{"tokens": [3] * 60, "type": "encoded_text"}]}), "--max_model_len"),
                     (dict(num_samples=4, sampling_params={"max_tokens": 16}, prompt={"chunks": [
                         {"tokens": [3] * 30, "type": "encoded_text"}]}), "--max_num_batched_tokens")]:
        ans = ask(**kw)
        assert ans[0] == 400 and flag in detail(ans), (kw, ans)
    assert "token ids outside" in detail(ask(prompt={"chunks": [{"tokens": [3, 10**6], "type": "encoded_text"}]}))
    ok = ask(num_samples=2, sampling_params={"max_tokens": 4, "seed": 0})
    sampled = pb.SampleResponse(); sampled.ParseFromString(result(b, ok[1]["request_id"]))
    assert ok[0] == 200 and len(sampled.sequences) == 2
    nan = {"model_id": b.mid, "adam_params": {"learning_rate": float("nan")}}          # JSON's NaN
    assert "finite" in detail(b.call("optim_step", nan))
    assert "--max_lora_rank" in detail(b.call("create_model", {"session_id": b.sid, "model_seq_id": 5,
                                                               "base_model": "tiny", "lora_config": {"rank": 10**6}}))


def fb_body(mid, n, length):
    "A protobuf ForwardBackwardRequest of `n` datums of `length` tokens."
    msg = pb.ForwardBackwardRequest(model_id=mid, loss_fn="cross_entropy")
    for _ in range(n):
        d = msg.data.add()
        d.model_input.add().encoded_text.tokens = (np.arange(length, dtype=np.int32) % 50).tobytes()
        t = d.loss_fn_inputs["target_tokens"]
        t.dense, t.dtype = (np.arange(length, dtype=np.int64) % 50).tobytes(), pb.DTYPE_INT64
        t.shape.extend([length])
    return msg.SerializeToString()


def test_a_forward_backward_beyond_the_caps_is_refused_before_it_is_decoded(box):
    b, proto = box, {"Content-Type": "application/x-protobuf"}
    ans = b.call("forward_backward", fb_body(b.mid, 3, 60), headers=proto)
    assert ans[0] == 400 and "--max_num_batched_tokens 128" in detail(ans), ans
    assert "--max_model_len 64" in detail(b.call("forward_backward", fb_body(b.mid, 1, 65), headers=proto))
    assert b.call("forward_backward", b"\xff\xff garbage", headers=proto)[0] == 400
    ok = b.call("forward_backward", fb_body(b.mid, 2, 8), headers=proto)
    done = b.call("retrieve_future", {"request_id": ok[1]["request_id"]})
    assert ok[0] == done[0] == 200 and isinstance(done[1], bytes)            # the outputs, as protobuf


def test_live_models_samplers_and_pending_requests_are_capped_and_can_be_freed(box):
    b = box
    second = new_model(b, 1)
    ans = b.call("create_model", {"session_id": b.sid, "model_seq_id": 2, "base_model": "tiny"})
    assert ans[0] == 400 and "--max_models 2" in detail(ans), ans
    assert b.call("unload_model", {"model_id": second}) == (200, {"type": "unload_model", "model_id": second})
    assert b.call("get_info", {"model_id": second})[0] == 404
    b.call("unload_model", {"model_id": new_model(b, 2)})                  # room again, and freed again
    first, *_ = [b.call("create_sampling_session", {"base_model": "tiny"})[1]["sampling_session_id"]
                 for _ in range(LIMITS.max_samplers + 1)]
    assert len(b.httpd.tinker.samplers) == LIMITS.max_samplers
    gone = b.call("asample", {"sampling_session_id": first, "prompt": PROMPT})
    assert gone[0] == 404 and "--max_samplers" in detail(gone)
    rids, ans = [], (200, {})
    while ans[0] == 200 and len(rids) <= LIMITS.max_pending:
        ans = b.call("optim_step", {"model_id": b.mid, "adam_params": {"learning_rate": 0.0}})
        if ans[0] == 200: rids.append(ans[1]["request_id"])
    assert ans[0] == 429 and f"--max_pending {LIMITS.max_pending}" in detail(ans), ans
    for r in rids: b.call("retrieve_future", {"request_id": r})
    assert not b.httpd.tinker.futures


def test_a_burst_of_clients_and_an_idle_connection_do_not_stop_the_health_check(box):
    b, answers = box, []
    idle = socket.create_connection(("127.0.0.1", b.port), timeout=30)     # connects, never sends
    try:
        threads = [threading.Thread(target=lambda: answers.append(b.call("healthz")[0])) for _ in range(64)]
        for t in threads: t.start()
        for t in threads: t.join(60)
        assert answers == [200] * 64
    finally:
        idle.close()


def test_binding_beyond_loopback_warns_and_bad_flags_are_one_line(tmp_path, capsys):
    httpd = make_server("0.0.0.0", 0, str(tmp_path))
    httpd.server_close()
    err = capsys.readouterr().err
    assert "WARNING: listening on 0.0.0.0" in err and "--api_key" in err
    assert httpd.request_queue_size >= 128
    with pytest.raises(SystemExit) as e: serve_main(["--max_num_samples", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "rlhf-nb tinker-serve: error: argument --max_num_samples: '0' is not a positive integer")

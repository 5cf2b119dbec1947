"""The scripted model server's bounds (issue 28, case 10): real sockets, answers within a second.

Before: no body limit (a 400 MB body raised its RSS to 800 MB), no socket timeouts (1,000 half-open connections held
1,002 threads), a bad Content-Length or deeply nested JSON dropped the connection with no answer, and any local user
could drive the fault-control routes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from testbed.faults.model import FaultRule
from testbed import http_service, model_server
from testbed.model_server import ADMIN_TOKEN_ENV, MAX_BODY_BYTES, ScriptedModelServer
from tests.events import HANG_S, wait_for
from tests.test_model_server import ROOT, _env, chat_body, echo_responder, post_chat, serve


def send(port: int, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    return sock


#: an answer "at once": far sooner than the server's read timeout (30 s), which is what a server waiting on a body
#: or a request line that never comes would answer at, however busy the machine
AT_ONCE_S = 10.0


def answer(sock: socket.socket, within_s: float = AT_ONCE_S) -> tuple[int, dict]:
    """The status and JSON body of the one response on ``sock``, which must come within ``within_s``."""
    sock.settimeout(within_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed with no answer (got {data!r})"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    sock.close()
    return int(head.split()[1]), json.loads(rest[:length])


def post_head(length: str, path: str = "/v1/chat/completions", extra: str = "") -> str:
    return f"POST {path} HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: {length}\n{extra}"


@pytest.mark.parametrize(("length", "status"), [
    ("abc", 400), ("-5", 400), ("1.5", 400), ("5\nContent-Length: 6", 400), ("9" * 5000, 413),
    (str(MAX_BODY_BYTES + 1), 413), (str(400 * 1024 * 1024), 413),
])
def test_a_bad_or_oversized_content_length_is_answered_at_once(length: str, status: int) -> None:
    with serve() as server:
        code, body = answer(send(server.port, post_head(length), b"{" * 65536))  # a body that is never read whole
        assert code == status  # and within AT_ONCE_S: not at the read timeout
        assert body["error"]["code"] in ("bad_content_length", "request_too_large")
        assert post_chat(server).status_code == 200  # the server serves on


def test_an_oversized_body_is_refused_unread() -> None:
    """A client that sends a 400 MB body gets its 413 without the server holding the body."""
    with serve() as server:
        rss_before = psutil.Process().memory_info().rss
        sock = send(server.port, post_head(str(400 * 1024 * 1024)))
        sent = 0
        with pytest.raises(OSError):  # the server stops reading and closes: the rest cannot be sent
            sock.settimeout(5)
            while sent < 400 * 1024 * 1024:
                sent += sock.send(b"x" * (1 << 20))
        assert sent < 100 * 1024 * 1024
        assert psutil.Process().memory_info().rss - rss_before < 64 * 1024 * 1024
        sock.close()
        code, body = answer(send(server.port, post_head(str(400 * 1024 * 1024)), b"x" * 1024))
        assert (code, body["error"]["code"]) == (413, "request_too_large")


def test_chunked_bodies_are_refused_with_411() -> None:
    with serve() as server:
        code, _ = answer(send(server.port, "POST /v1/chat/completions HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n",
                              b"5\r\nhello\r\n0\r\n\r\n"))
        assert code == 411


def test_run_keys_are_bounded_in_length_and_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_server, "MAX_RUN_KEYS", 3)  # any local process may send the header
    with serve() as server:
        for key in ["a", "b", "c" * 10_000, "d", "e", "a"]:
            assert post_chat(server, run=key).status_code == 200
        by_run = server.stats()["by_run"]
        assert by_run == {"a": 2, "b": 1, "c" * model_server.MAX_RUN_KEY_CHARS: 1, model_server.OTHER_RUNS: 2}


@pytest.mark.parametrize("depth", [http_service.MAX_JSON_DEPTH + 1, 200_000])
def test_deeply_nested_json_is_answered_400(depth: int) -> None:
    with serve() as server:
        body = b'{"model": "x", "messages": ' + b"[" * depth + b"]" * depth + b"}"
        code, answered = answer(send(server.port, post_head(str(len(body))), body))
        assert code == 400 and "nested too deeply" in answered["error"]["message"]
        code, answered = answer(send(server.port, post_head(str(len(body)), "/admin/faults",
                                                            f"Authorization: Bearer {server.admin_token}\n"), body))
        assert code == 400 and "nested too deeply" in answered["error"]["message"]


def test_the_bodies_held_at_once_are_bounded() -> None:
    """Four requests each announcing 30 MiB and sending 1 byte hold 120 MiB of the 128 MiB budget: a fifth is 503."""
    with serve() as server:
        holding = [send(server.port, post_head(str(30 * 1024 * 1024)), b"[") for _ in range(4)]
        try:
            wait_for(lambda: server._httpd.body_bytes >= 4 * 30 * 1024 * 1024, "the four bodies held", every_s=0.01)
            code, body = answer(send(server.port, post_head(str(30 * 1024 * 1024)), b"["))
            assert (code, body["error"]["code"]) == (503, "service_unavailable")
        finally:
            for sock in holding:
                sock.close()
        assert post_chat(server).status_code == 200


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (after whatever answer it sent)."""
    try:
        while sock.recv(65536, socket.MSG_DONTWAIT):
            pass
        return True  # the end of the stream
    except BlockingIOError:
        return False  # open, and nothing sent
    except ConnectionResetError:
        return True


def test_a_thousand_half_open_connections_hold_a_bounded_number_of_threads_and_time_out() -> None:
    process = psutil.Process()
    baseline = process.num_threads()
    with ScriptedModelServer(echo_responder, max_connections=64, read_timeout_s=1.0) as server:
        half_open = []
        try:
            for i in range(1000):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S)
                if i % 2:
                    sock.sendall(post_head("100").replace("\n", "\r\n").encode() + b"\r\n[")  # a body that stalls
                half_open.append(sock)
            time.sleep(0.3)
            threads_while_held = process.num_threads() - baseline
            assert threads_while_held <= 64 + 2, f"{threads_while_held} threads for 1,000 half-open connections"
            # closed by the 1 s read timeout; a connection nobody times out stays open for ever
            wait_for(lambda: all(_closed_by_server(s) for s in half_open),
                     "the server's close of every half-open connection", limit_s=60)
            assert post_chat(server).status_code == 200  # and the server serves again
        finally:
            for sock in half_open:
                sock.close()
        wait_for(lambda: process.num_threads() - baseline <= 2, "the end of the server's threads", limit_s=60,
                 every_s=0.05)


def test_the_read_timeout_does_not_bound_slow_answers() -> None:
    """Latency and hang faults delay the answer, not the request: a short read timeout leaves them alone."""
    with ScriptedModelServer(echo_responder, read_timeout_s=0.3,
                             faults=[FaultRule.parse("hang,first_n=1,hang_s=1.0")]) as server:
        start = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):
            post_chat(server, timeout=HANG_S)
        assert time.monotonic() - start >= 0.95  # held for hang_s, not cut at the read timeout
        server.set_latency(model_server.LatencyModel.parse("fixed:800"))
        start = time.monotonic()
        assert post_chat(server, timeout=HANG_S).status_code == 200
        assert time.monotonic() - start >= 0.8


def test_the_admin_routes_need_the_servers_token() -> None:
    with serve() as server:
        base = f"http://127.0.0.1:{server.port}"
        rules = {"rules": [FaultRule.parse("status:503").to_dict()]}
        assert httpx.post(f"{base}/admin/faults", json=rules).status_code == 401
        assert httpx.get(f"{base}/admin/stats").status_code == 401
        assert httpx.delete(f"{base}/admin/faults").status_code == 401
        assert httpx.post(f"{base}/admin/latency", json={"spec": "fixed:9000"}).status_code == 401
        wrong = {"Authorization": "Bearer " + "x" * len(server.admin_token)}
        assert httpx.post(f"{base}/admin/faults", json=rules, headers=wrong).status_code == 403
        assert server.faults == [] and post_chat(server).status_code == 200
        right = {"Authorization": f"Bearer {server.admin_token}"}
        assert httpx.post(f"{base}/admin/faults", json=rules, headers=right).status_code == 200
        assert post_chat(server).status_code == 503
    with serve() as other:
        assert other.admin_token != server.admin_token  # a token per server


def test_the_subprocess_takes_its_admin_token_from_the_environment_and_never_prints_it() -> None:
    token = "t-" + os.urandom(16).hex()
    proc = subprocess.Popen([sys.executable, "-m", "testbed.model_server", "--responder",
                             "tests.test_model_server:echo_responder", "--log-level", "DEBUG"],
                            cwd=ROOT, env={**_env(), ADMIN_TOKEN_ENV: token},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
        assert ready, f"the server's READY line never came within {HANG_S:g} s"
        url = proc.stdout.readline().split()[1]
        stats = url.removesuffix("/v1") + "/admin/stats"
        assert httpx.get(stats, timeout=HANG_S).status_code == 401
        assert httpx.get(stats, headers={"Authorization": f"Bearer {token}"}, timeout=HANG_S).status_code == 200
        assert httpx.post(f"{url}/chat/completions", json=chat_body("sub"), timeout=HANG_S).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_S)
        assert proc.returncode == 0
        assert token not in out + err
    finally:
        if proc.poll() is None:
            proc.kill()  # only the pid this test started
            proc.communicate()


@pytest.mark.parametrize("server", ["model", "effects"])
def test_headers_trickled_a_byte_at_a_time_do_not_hold_a_slot_for_ever(server: str) -> None:
    """The probe: one header byte every 10 s held a slot for ever (each byte reset the socket timeout), and 256
    such connections kept /healthz at 503 for 80 s. Now a request's line and headers must all arrive within
    ``header_timeout_s`` of its first byte: the trickling connections are closed, and /healthz answers again."""
    from testbed.effects_service import EffectsService

    slots = 4
    made = (ScriptedModelServer(echo_responder, max_connections=slots) if server == "model"
            else EffectsService(max_connections=slots))
    made.header_timeout_s = 1.0
    with made as s:
        trickles = [socket.create_connection(("127.0.0.1", s.port), timeout=HANG_S) for _ in range(slots)]
        closed: set[int] = set()

        def trickled_until_all_closed() -> bool:
            for i, sock in enumerate(trickles):
                if i in closed:
                    continue
                try:
                    sock.send(b"G")  # a byte at a time, each well within the read timeout
                    sock.settimeout(0.01)
                    if sock.recv(1) == b"":
                        closed.add(i)
                except (TimeoutError, BlockingIOError):
                    pass
                except OSError:
                    closed.add(i)
            return len(closed) == slots

        # closed by the 1 s header deadline; a byte every 0.2 s would otherwise hold them for ever
        wait_for(trickled_until_all_closed, "the server's close of every trickling connection", limit_s=60,
                 every_s=0.2)
        status, _ = answer(send(s.port, "GET /healthz HTTP/1.1\nHost: x\n"))
        assert status == 200
        for sock in trickles:
            sock.close()


@pytest.mark.parametrize("server", ["model", "effects"])
def test_both_services_refuse_a_bad_request_alike_in_their_own_error_shape(server: str) -> None:
    """One plumbing (testbed.http_service): a chunked body, a bad Content-Length, a body over the service's limit
    (the effects service answers 400, its contract) and an unknown route, each refused at once."""
    from testbed.effects_service import MAX_BODY_BYTES as EFFECTS_MAX_BODY_BYTES, EffectsService

    made, limit, too_large = ((ScriptedModelServer(echo_responder), MAX_BODY_BYTES, 413) if server == "model"
                              else (EffectsService(), EFFECTS_MAX_BODY_BYTES, 400))
    cases = [(post_head("5", extra="Transfer-Encoding: chunked\n"), 411, "chunked"),
             (post_head("abc"), 400, "Content-Length must be"), (post_head(str(limit + 1)), too_large, "over the limit"),
             ("GET /nowhere HTTP/1.1\nHost: x\n", 404, "no route for GET /nowhere")]
    with made as s:
        for head, status, words in cases:
            code, body = answer(send(s.port, head))
            message = body["error"]["message"] if server == "model" else body["error"]
            assert (code, words in message) == (status, True), (code, body)


def test_an_idle_keep_alive_connection_is_not_cut_by_the_header_deadline() -> None:
    """The deadline runs from a request's first byte, not from the connection's: a client that pools its
    connection and sends its next request after a pause longer than the deadline is answered."""
    made = ScriptedModelServer(echo_responder)
    made.header_timeout_s = 0.5
    with made as s:
        with httpx.Client(base_url=s.url) as client:
            assert client.post("/chat/completions", json=chat_body("one")).status_code == 200
            time.sleep(1.0)
            assert client.post("/chat/completions", json=chat_body("two")).status_code == 200

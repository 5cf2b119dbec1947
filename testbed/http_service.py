"""The HTTP service base of the test bed's scripted services (``testbed.model_server``, ``testbed.effects_service``):
bounds, deadlines, error bodies, routes, the admin token and ``/healthz``, in one place.

Contract
--------
* ``HTTPService`` serves a ``ServiceHandler`` subclass over HTTP/1.1 with keep-alive on a ``BoundedHTTPServer``.
  ``start()`` binds and serves from a thread; ``stop()`` is idempotent and returns promptly (< 1 s) even while
  connections hang (it sets ``_stopping`` to wake what waits on it). ``url`` is ``http_url(host, port, url_path)``.
* Routes: a handler's ``routes`` maps (verb, path) to what answers it; ``GET /healthz`` answers 200
  ``{"ok": true}``; a path under ``/admin/`` (``GET /admin/stats``: the service's ``stats()``) is served only to a
  loopback client (403 otherwise) with ``Authorization: Bearer <admin_token>`` (401 without it, 403 with another,
  compared in constant time); any other route is a 404. The token is made per service (``secrets.token_urlsafe``)
  unless one is given; ``serve_until_signalled`` takes it from the environment variable the service names
  (``admin_token_env``; unset: a random one, so the admin routes stay closed). It is never printed or logged, nor
  are request headers.
* Only this user's (or root's) connections are served (``testbed.isolation.admitted``); others are closed unread.
* Bounded: at most ``max_connections`` connections are served at once (more are answered 503 and closed), a
  socket operation waits at most ``read_timeout_s`` and a body must arrive within it, a request's line and
  headers within ``header_timeout_s`` of its first byte, a body is at most the handler's ``max_body_bytes``
  (``too_large_status``, unread) and the bodies held at once at most ``MAX_BODIES_IN_FLIGHT_BYTES`` (503); a bad
  ``Content-Length`` is a 400, a chunked body a 411, and ``_json`` refuses JSON nested deeper than
  ``MAX_JSON_DEPTH``.
* Errors are ``error_body``'s OpenAI-style object unless a handler's ``error_payload`` shapes them otherwise.
"""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Self

from testbed.isolation import admitted

__all__ = ["HTTPService", "ServiceHandler", "BoundedHTTPServer", "http_url", "error_body", "serve_until_signalled",
           "READ_TIMEOUT_S", "HEADER_TIMEOUT_S", "MAX_JSON_DEPTH", "MAX_BODIES_IN_FLIGHT_BYTES"]

logger = logging.getLogger(__name__)

#: the most body bytes held by all requests at once (bounds the server's memory with many large requests)
MAX_BODIES_IN_FLIGHT_BYTES = 128 * 1024 * 1024
#: the deepest JSON a request may hold (a chat request is ~10 levels deep, its tool schemas a few more)
MAX_JSON_DEPTH = 64
#: the longest one socket read or write waits, and the longest a request body may take to arrive; an idle
#: keep-alive connection is closed after it. Answers a service delays on purpose (latency, hang) do not read, so it
#: does not bound them.
READ_TIMEOUT_S = 30.0
#: once a request's first byte has arrived, its request line and headers must all arrive within this (a client
#: sending one byte every few seconds would otherwise hold a connection slot for ever)
HEADER_TIMEOUT_S = 10.0
#: after refusing a body it did not read, how long and how much of it the server reads and discards before
#: closing: a client that sends a small rest then reads sees the answer rather than a reset
_LINGER_S = 1.0
_LINGER_BYTES = 1024 * 1024


def http_url(host: str, port: int, path: str = "") -> str:
    """The URL a local client reaches a server bound to ``host``:``port`` at (a wildcard bind on loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def error_body(message: str, type_: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _json_depth(value: Any) -> int:
    """How deeply ``value`` (parsed JSON) nests lists and objects, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


# --------------------------------------------------------------------------- the server


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that tracks live connections so stop() can release them, serves at most
    ``owner.max_connections`` at once (one thread each) and bounds the body bytes held at once."""

    daemon_threads = True
    request_queue_size = 128  # benchmarks open many concurrent connections

    owner: "HTTPService"

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: "HTTPService"):
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.owner = owner
        self.live: set[socket.socket] = set()
        self.to_reset: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(owner.max_connections)
        self.body_bytes = 0  # body bytes reserved by requests being served; under conn_lock
        super().__init__(addr, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Only this user's (or root's) sockets are served (``testbed.isolation.admitted``): closed unread."""
        return admitted(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self._turn_away(request)
            return
        with self.conn_lock:
            self.live.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: nothing else will release the slot
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _turn_away(self, request: socket.socket) -> None:
        """Answer 503 and close, from the accepting thread: never waits on the client."""
        body = json.dumps(error_body(f"the server is serving {self.owner.max_connections} connections; retry later",
                                     "server_error", "service_unavailable")).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
        try:
            request.setblocking(False)
            request.send(head + body)
        except OSError:
            pass
        logger.debug("turned a connection away: %d connections are being served", self.owner.max_connections)
        super().shutdown_request(request)

    def reserve_body(self, length: int) -> bool:
        """Count ``length`` body bytes as held, unless that would pass MAX_BODIES_IN_FLIGHT_BYTES."""
        with self.conn_lock:
            if self.body_bytes + length > MAX_BODIES_IN_FLIGHT_BYTES:
                return False
            self.body_bytes += length
            return True

    def release_body(self, length: int) -> None:
        with self.conn_lock:
            self.body_bytes -= length

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.live.discard(request)
            reset = request in self.to_reset
            self.to_reset.discard(request)
        if reset:
            # No shutdown(SHUT_WR): a FIN first would look like a clean EOF; close() with linger 0 sends RST.
            try:
                request.close()
            except OSError:
                pass
            return
        super().shutdown_request(request)

    def release_connections(self) -> None:
        """Wake handler threads blocked on idle keep-alive sockets."""
        with self.conn_lock:
            live = list(self.live)
        for sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("unhandled error serving a connection", exc_info=True)


class _DeadlineReads(socket.SocketIO):
    """A connection's reads; while ``deadline`` is set (``time.monotonic()``), each waits at most until it, and
    past it a read raises TimeoutError."""

    def __init__(self, sock: socket.socket, per_read_s: float) -> None:
        super().__init__(sock, "rb")
        self.per_read_s = per_read_s
        self.deadline: float | None = None

    def readinto(self, b: Any) -> int | None:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request headers not received in time")
            self._sock.settimeout(min(left, self.per_read_s))  # type: ignore[attr-defined]
        return super().readinto(b)


Route = Callable[[Any, bytes], None]


class ServiceHandler(BaseHTTPRequestHandler):
    """A request's plumbing: deadlines, bounded bodies, error bodies, the admin token, routing by ``routes``."""

    protocol_version = "HTTP/1.1"  # keep-alive: LiteLLM/httpx reuse connections
    sys_version = ""
    # Headers and body go out as two writes: with Nagle on, the body waits for the client's delayed ACK
    # of the headers (~40 ms on Linux), which once doubled a mock model call's latency.
    disable_nagle_algorithm = True
    #: the largest request body (each service sets its own), and what a larger one is answered
    max_body_bytes: int
    too_large_status = 413
    server: BoundedHTTPServer

    # -- logging: never the default stderr lines, never headers
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s " + format, self.client_address[0], *args)

    # -- answers
    def _send_json(self, status: int, payload: Any, extra_headers: dict[str, str] | None = None) -> None:
        self._send_raw(status, json.dumps(payload).encode("utf-8"), extra_headers)

    def _send_raw(self, status: int, body: bytes, extra_headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def error_payload(self, message: str, type_: str, code: str | None) -> Any:
        """The body of an error answer (``error_body``'s, unless a service shapes its errors otherwise)."""
        return error_body(message, type_, code)

    def _send_error(self, status: int, message: str, type_: str | None = None, code: str | None = None,
                    headers: dict[str, str] | None = None) -> None:
        type_ = type_ or ("server_error" if status >= 500 else "invalid_request_error")
        self._send_json(status, self.error_payload(message, type_, code), headers)

    def _refuse(self, status: int, message: str, code: str, extra_headers: dict[str, str] | None = None) -> None:
        """Answer an error, then close the connection: what is left of the request is not read (only discarded,
        for a moment, so that the client finishes sending and sees the answer rather than a reset)."""
        self.close_connection = True
        self._send_error(status, message, code=code, headers={"Connection": "close", **(extra_headers or {})})
        try:
            self.connection.shutdown(socket.SHUT_WR)
            until, discarded = time.monotonic() + _LINGER_S, 0
            while (left := until - time.monotonic()) > 0 and discarded < _LINGER_BYTES:
                self.connection.settimeout(left)
                if not (chunk := self.connection.recv(65536)):
                    break
                discarded += len(chunk)
        except OSError:
            pass

    def _reset_connection(self) -> None:
        """Answer nothing: the connection is reset (RST) once the handler returns, as a killed peer's would be."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self.server.conn_lock:
            self.server.to_reset.add(self.connection)
        self.close_connection = True

    # -- reading a request within its deadlines
    def setup(self) -> None:
        self.timeout = self.server.owner.read_timeout_s  # StreamRequestHandler.setup puts it on the socket
        super().setup()
        self.rfile.close()  # reads go through _DeadlineReads instead, to bound the time headers take
        self._reads = _DeadlineReads(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        """An idle keep-alive connection waits ``read_timeout_s`` for a request's first byte; from it, the request
        line and headers must arrive within ``header_timeout_s`` (``parse_request`` ends that deadline)."""
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except OSError:  # idle past read_timeout_s, or reset
            self.close_connection = True
            return
        self._reads.deadline = time.monotonic() + self.server.owner.header_timeout_s
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._reads.deadline = None
        self.connection.settimeout(self.timeout)
        return ok

    def _body_length(self) -> int | None:
        """The request's Content-Length (0 if none); None if it was refused (the answer is sent)."""
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "chunked request bodies are not accepted; send a Content-Length", "length_required")
            return None
        values = self.headers.get_all("Content-Length") or ["0"]
        text = values[0].strip()
        if len(set(values)) > 1 or not (text.isascii() and text.isdigit()):
            shown = ", ".join(repr(v[:40]) for v in values)
            self._refuse(400, f"Content-Length must be one non-negative integer, got {shown}", "bad_content_length")
            return None
        if len(text) > 18 or int(text) > self.max_body_bytes:  # the length test spares int() a 65,000-digit header
            self._refuse(self.too_large_status, f"request body of {text[:40]} bytes is over the limit of "
                         f"{self.max_body_bytes}", "request_too_large")
            return None
        return int(text)

    @contextmanager
    def _body(self) -> Iterator[bytes | None]:
        """The request body, read whole within ``read_timeout_s``; None if it was refused (the answer is sent)."""
        length = self._body_length()
        if length is None:
            yield None
            return
        if not self.server.reserve_body(length):
            self._refuse(503, "the server is holding too many request bodies; retry later", "service_unavailable",
                         {"Retry-After": "1"})
            yield None
            return
        try:
            deadline = time.monotonic() + self.server.owner.read_timeout_s
            chunks, left = [], length
            while left:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"request body not received within {self.server.owner.read_timeout_s:g} s")
                chunk = self.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    raise ConnectionResetError("the client closed the connection mid-body")
                chunks.append(chunk)
                left -= len(chunk)
            yield b"".join(chunks)
        finally:
            self.server.release_body(length)

    def _json(self, raw: bytes, what: str) -> Any:
        """``raw`` parsed, or ValueError naming the problem (not JSON, or nested deeper than MAX_JSON_DEPTH)."""
        try:
            value = json.loads(raw)
        except RecursionError:
            raise ValueError(f"{what} is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)") from None
        except ValueError as exc:
            raise ValueError(f"{what} is not JSON: {exc}") from None
        if _json_depth(value) > MAX_JSON_DEPTH:
            raise ValueError(f"{what} is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)")
        return value

    def _path(self) -> str:
        path = self.path.split("?", 1)[0]
        return path.rstrip("/") or "/"

    # -- routing
    def do_GET(self) -> None:
        self._guarded(lambda: self._dispatch(b""))  # a GET's body is not read

    def do_POST(self) -> None:
        self._guarded(self._dispatch_with_body)

    do_DELETE = do_POST

    def _guarded(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            # the client gave up (timeout, reset); nothing to answer
            logger.debug("client went away during %s %s", self.command, self._path())
            self.close_connection = True

    def _dispatch_with_body(self) -> None:
        with self._body() as body:  # read even where no route wants it, to keep the connection in sync
            self._dispatch(body)

    def _dispatch(self, body: bytes | None) -> None:
        """Answer the request from ``routes``; ``body`` None: it was refused (the answer is sent)."""
        if body is None:
            return
        path = self._path()
        route = self.routes.get((self.command, path))
        if route is None:
            self._send_error(404, f"no route for {self.command} {path}", code="not_found")
        elif not path.startswith("/admin/") or self._admin_allowed():
            route(self, body)

    def _admin_allowed(self) -> bool:
        """Whether an admin route may be served (the answer is sent if not): loopback only, with the token."""
        host = self.client_address[0]
        if not (host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1")):
            self._send_error(403, "admin endpoints are loopback-only", code="forbidden")
            return False
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            self._send_error(401, "admin endpoints need 'Authorization: Bearer <the server's admin token>'",
                             code="unauthorized", headers={"WWW-Authenticate": "Bearer"})
            return False
        if not secrets.compare_digest(given.strip().encode(), self.server.owner.admin_token.encode()):
            self._send_error(403, "wrong admin token", code="forbidden")
            return False
        return True

    def _healthz(self, body: bytes) -> None:
        self._send_json(200, {"ok": True})

    def _admin_stats(self, body: bytes) -> None:
        self._send_json(200, self.server.owner.stats())

    #: (verb, path) -> what answers it, given the body; a subclass adds its own to these
    routes: dict[tuple[str, str], Route] = {("GET", "/healthz"): _healthz, ("GET", "/admin/stats"): _admin_stats}


# --------------------------------------------------------------------------- the service


class HTTPService:
    """A ``handler`` served from a thread, with its bounds and admin token (see the module docstring)."""

    handler: type[ServiceHandler]
    #: where a subprocess reads its admin token from (never a flag: argv is public to ``ps``)
    admin_token_env: str
    url_path = ""

    def __init__(self, *, host: str, port: int, admin_token: str | None, max_connections: int,
                 read_timeout_s: float, header_timeout_s: float) -> None:
        self.host, self._port = host, port
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.max_connections = max_connections
        self.read_timeout_s, self.header_timeout_s = read_timeout_s, header_timeout_s
        self._lifecycle = threading.Lock()
        self._stopping = threading.Event()  # set by stop(): wakes what a handler waits out
        self._httpd: BoundedHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def stats(self) -> dict[str, Any]:
        """What ``GET /admin/stats`` answers."""
        raise NotImplementedError

    def _started(self) -> None:
        """Called once bound (``url`` is known), before the first request is served."""

    def _stopped(self) -> None:
        """Called once the last connection is released."""

    def start(self) -> Self:
        with self._lifecycle:
            if self._httpd is not None:
                return self
            self._stopping.clear()
            httpd = BoundedHTTPServer((self.host, self._port), self.handler, self)
            self._port = httpd.server_address[1]
            try:
                self._started()
            except BaseException:
                httpd.server_close()
                raise
            # short poll interval so shutdown() returns quickly
            thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                      name=f"{type(self).__name__}-{self._port}", daemon=True)
            self._httpd, self._thread = httpd, thread
            thread.start()
        return self

    def stop(self) -> None:
        with self._lifecycle:
            httpd, thread = self._httpd, self._thread
            if httpd is None:
                return
            self._httpd = self._thread = None
            self._stopping.set()
            httpd.shutdown()
            httpd.release_connections()
            httpd.server_close()
            if thread is not None:
                thread.join(timeout=2.0)
            deadline = time.monotonic() + 0.5  # let handler threads finish closing their sockets
            while time.monotonic() < deadline:
                with httpd.conn_lock:
                    if not httpd.live:
                        break
                time.sleep(0.01)
            self._stopped()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError(f"{type(self).__name__} has no port yet: call start() first")
        return self._port

    @property
    def url(self) -> str:
        """What a local client is given: ``http://HOST:PORT`` and the service's ``url_path``."""
        return http_url(self.host, self.port, self.url_path)


def serve_until_signalled(service_class: type[HTTPService], *args: Any, **options: Any) -> int:
    """A service as a subprocess (its ``python -m``): ``service_class(*args, **options)`` with the admin token from
    ``$admin_token_env``; prints exactly one line ``READY <url>`` to stdout once listening, serves until
    SIGTERM/SIGINT and returns 0 (1 if it cannot bind)."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    service = service_class(*args, admin_token=os.environ.get(service_class.admin_token_env), **options)
    try:
        service.start()
    except OSError as exc:
        print(f"error: cannot bind {service.host}:{service._port}: {exc}", file=sys.stderr)
        return 1
    print(f"READY {service.url}", flush=True)
    try:
        while not done.wait(0.5):  # timed wait keeps the main thread responsive to signals
            pass
    finally:
        service.stop()
    return 0

"""Network faults: ``FaultProxy``, a TCP proxy with Toxiproxy's toxics, switched at run time.

    with FaultProxy("temporal", ("127.0.0.1", 7233), seed=1) as proxy:
        client = await Client.connect(proxy.address)
        proxy.add_toxic(Toxic.parse("latency:200,jitter=50,stream=downstream"))
        ...
        proxy.clear_toxics()

Contract
--------
* One proxy per link. It runs its own asyncio loop in a daemon thread, so it
  works under any caller (sync or async); ``start`` returns once listening and
  ``stop`` (idempotent) closes the listener and every connection and joins the
  thread in well under 2 s.
* Each connection has two directions: ``upstream`` (client -> server) and
  ``downstream`` (server -> client). Each is a reader that stamps every chunk
  (up to 64 KiB) with its arrival time and a writer that applies the toxics in
  force *when it forwards the chunk*, so toxics added or removed while a
  connection is open take effect on it at once. Chunks are never reordered.
  While no toxic touches a direction and nothing is queued in it, the reader
  writes straight through (TCP_NODELAY on both sockets): no added latency.
* Toxics (``Toxic.kind``):
  - ``latency``: a chunk is forwarded ``latency_ms`` ± uniform ``jitter_ms``
    after it arrived (Toxiproxy's rule: the delay counts from arrival, so it
    adds latency without capping throughput). Several latency toxics add up.
  - ``bandwidth``: at most ``rate_kbps`` kB/s (1 kB = 1000 bytes), written in
    slices of 100 ms worth of bytes. With several, the lowest rate wins.
  - ``blackhole``: what a network partition does to a TCP connection: nothing
    gets through, nothing errors, and the connection stays open. Bytes are
    held (counted in ``blackholed_bytes``), at most ~1 MiB per direction before
    the sender is pushed back, as a full TCP window would; an end-of-stream
    (FIN) is held too. When the blackhole is removed, everything held is
    delivered in order: as TCP's retransmissions would deliver it once the
    network heals. A peer that gave up meanwhile (a keep-alive timeout) has
    closed its connection and dials a new one.
  - ``drop``: bytes are read and thrown away (counted in ``dropped_bytes``);
    the connection stays open and nothing errors (Toxiproxy's ``timeout``
    toxic with no timeout). No real network does this to a TCP stream: a
    framed protocol (HTTP/2, gRPC) is left with streams that wait forever for
    frames that are gone, on a connection that still answers pings. A fault
    for testing a protocol's own resilience, not a partition.
  - ``reset``: the connection is closed with a TCP RST (SO_LINGER on, 0 s):
    existing connections when the toxic is added, new ones right after accept.
    As in Toxiproxy, the RST goes to the side the toxic's stream reads from:
    ``upstream`` -> the client, ``downstream`` -> the server, ``both`` -> both;
    the other side is closed. A reset connection is gone; later toxic changes
    do not bring it back.
* ``toxicity`` is decided once per (connection, toxic) with the proxy's seeded
  RNG: for existing connections (in accept order) when the toxic is added, for
  a new connection (toxics in insertion order) when it is accepted. Only
  toxicities strictly between 0 and 1 draw, so a fractional toxic's subset does
  not depend on unrelated all-or-nothing toxics. Jitter draws from a separate
  RNG per (connection, direction), so timing never shifts toxicity decisions.
* ``disable`` closes the listener (new connections are refused by the kernel)
  and every open connection; ``enable`` listens again on the same port.
* An unreachable upstream closes the client's connection and is counted in
  ``stats()["upstream_unreachable"]``. A connection that fails in one
  direction (reset, broken pipe) is closed in both.
* Control methods are thread-safe and return once the change is in force.

Library code: logs through ``logging``, never prints.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Coroutine

from testbed.isolation import admitted

__all__ = ["Toxic", "FaultProxy", "TOXIC_KINDS", "STREAMS"]

log = logging.getLogger(__name__)

TOXIC_KINDS: tuple[str, ...] = ("latency", "bandwidth", "blackhole", "drop", "reset")
STREAMS: tuple[str, ...] = ("upstream", "downstream", "both")

# spec key -> Toxic field, and which kinds accept it (None: all kinds)
_SPEC_KEYS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "latency": ("latency_ms", ("latency",)),
    "jitter": ("jitter_ms", ("latency",)),
    "rate": ("rate_kbps", ("bandwidth",)),
    "stream": ("stream", None),
    "toxicity": ("toxicity", None),
    "name": ("name", None),
}
# the value after "kind:" in a spec
_POSITIONAL = {"latency": "latency", "bandwidth": "rate"}
_SPEC_FORMS = (
    "'<kind>[:<value>][,key=value...]' with kind in {latency, bandwidth, blackhole, drop, reset} and keys "
    "{latency, jitter (latency only), rate (bandwidth only), stream (upstream|downstream|both), "
    "toxicity (0..1), name}, e.g. 'latency:200,jitter=50,stream=downstream', 'bandwidth:10' (kB/s), "
    "'blackhole,toxicity=0.5', 'reset'"
)

_READ_SIZE = 64 * 1024
_QUEUE_CHUNKS = 16  # per direction: at most ~1 MiB read ahead of a slow (toxic) writer
_DIAL_TIMEOUT_S = 5.0
_CONTROL_TIMEOUT_S = 5.0
_SLICE_S = 0.1  # bandwidth: bytes are released in slices worth this long
_EOF = None


# --------------------------------------------------------------------------- toxics


@dataclass
class Toxic:
    """One fault on a proxy, Toxiproxy-style."""

    kind: str  # "latency" | "bandwidth" | "blackhole" | "drop" | "reset"
    stream: str = "both"  # "upstream" (client -> server), "downstream" (server -> client), "both"
    toxicity: float = 1.0  # fraction of connections it applies to, drawn per connection from the proxy's seed
    latency_ms: float = 0.0  # latency: added per chunk
    jitter_ms: float = 0.0  # latency: uniform +/- jitter
    rate_kbps: float = 0.0  # bandwidth: kilobytes (1000 bytes) per second
    name: str = ""  # default: f"{kind}_{stream}"

    def __post_init__(self) -> None:
        # Validate here so direct construction, from_dict() and parse() enforce the same rules.
        if self.kind not in TOXIC_KINDS:
            raise ValueError(f"unknown toxic kind {self.kind!r}; allowed kinds: {', '.join(TOXIC_KINDS)}")
        if self.stream not in STREAMS:
            raise ValueError(f"unknown toxic stream {self.stream!r}; allowed streams: {', '.join(STREAMS)}")
        for f in ("toxicity", "latency_ms", "jitter_ms", "rate_kbps"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"toxic {f} must be a finite number >= 0, got {value!r}")
            setattr(self, f, float(value))
        if self.toxicity > 1:
            raise ValueError(f"toxic toxicity is a fraction of connections in 0..1, got {self.toxicity!r}")
        if self.kind == "bandwidth" and self.rate_kbps <= 0:
            raise ValueError(f"a bandwidth toxic needs rate_kbps > 0 (kB/s), got {self.rate_kbps!r}")
        if not isinstance(self.name, str):
            raise ValueError(f"toxic name must be a string, got {self.name!r}")
        if not self.name:
            self.name = f"{self.kind}_{self.stream}"

    def applies_to(self, direction: str) -> bool:
        return self.stream == "both" or self.stream == direction

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Toxic:
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ValueError(f"unknown toxic field(s) {', '.join(unknown)}; allowed fields: {', '.join(allowed)}")
        if "kind" not in d:
            raise ValueError(f"a toxic needs a 'kind'; allowed kinds: {', '.join(TOXIC_KINDS)}")
        return cls(**d)

    @classmethod
    def parse(cls, spec: str) -> Toxic:
        """Parse "latency:200,jitter=50,stream=downstream", "bandwidth:10" (kB/s), "blackhole,toxicity=0.5", "reset"."""
        parts = [p.strip() for p in spec.strip().split(",")]
        head, sep, value = parts[0].partition(":")
        kind = head.strip().lower()
        if kind not in TOXIC_KINDS:
            raise ValueError(f"bad toxic spec {spec!r}: unknown kind {kind!r}; allowed forms: {_SPEC_FORMS}")
        items: list[tuple[str, str]] = []
        if sep:
            if kind not in _POSITIONAL:
                raise ValueError(f"bad toxic spec {spec!r}: {kind} takes no ':<value>'; allowed forms: {_SPEC_FORMS}")
            items.append((_POSITIONAL[kind], value.strip()))
        for part in parts[1:]:
            key, eq, val = part.partition("=")
            key = key.strip().lower()
            if not eq or key not in _SPEC_KEYS:
                raise ValueError(f"bad toxic spec {spec!r}: {part!r} is not key=value with a known key; "
                                 f"allowed forms: {_SPEC_FORMS}")
            items.append((key, val.strip()))
        kwargs: dict[str, Any] = {"kind": kind}
        for key, val in items:
            field_name, kinds = _SPEC_KEYS[key]
            if kinds is not None and kind not in kinds:
                raise ValueError(f"bad toxic spec {spec!r}: key {key!r} does not apply to {kind}; "
                                 f"allowed forms: {_SPEC_FORMS}")
            if field_name in kwargs:
                raise ValueError(f"bad toxic spec {spec!r}: {key!r} given twice")
            if field_name in ("stream", "name"):
                kwargs[field_name] = val
                continue
            try:
                kwargs[field_name] = float(val)
            except ValueError:
                raise ValueError(f"bad toxic spec {spec!r}: {key}={val!r} is not a number; "
                                 f"allowed forms: {_SPEC_FORMS}") from None
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"bad toxic spec {spec!r}: {exc}") from None

    def to_spec(self) -> str:
        """Canonical spec string that parse() turns back into an equal Toxic."""
        head = self.kind
        if self.kind == "latency":
            head += f":{self.latency_ms:g}" + (f",jitter={self.jitter_ms:g}" if self.jitter_ms else "")
        elif self.kind == "bandwidth":
            head += f":{self.rate_kbps:g}"
        extra = [f"stream={self.stream}"] if self.stream != "both" else []
        if self.toxicity != 1.0:
            extra.append(f"toxicity={self.toxicity:g}")
        if self.name != f"{self.kind}_{self.stream}":
            extra.append(f"name={self.name}")
        return ",".join([head, *extra])


# --------------------------------------------------------------------------- connections


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def _close(writer: asyncio.StreamWriter | None, *, rst: bool = False) -> None:
    """Close at once, dropping unsent bytes; with ``rst`` the peer gets a TCP RST (ECONNRESET)."""
    if writer is None or writer.transport.is_closing() and not rst:
        return
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
    writer.transport.abort()


class _Connection:
    """One client connection and its upstream connection; lives on the proxy's loop."""

    def __init__(self, cid: int, seed: int, client_reader: asyncio.StreamReader,
                 client: asyncio.StreamWriter) -> None:
        self.id = cid
        self.client_reader = client_reader
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.applies: dict[str, bool] = {}  # toxic name -> drawn at accept or at add
        self.jitter = {d: random.Random(f"{seed}/{cid}/{d}") for d in ("upstream", "downstream")}
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    def close(self, *, rst_client: bool = False, rst_server: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        _close(self.client, rst=rst_client)
        _close(self.server, rst=rst_server)
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()

    def reset(self, stream: str) -> None:
        # Without a server socket yet there is nothing upstream to reset: the client gets the RST.
        self.close(rst_client=stream != "downstream" or self.server is None, rst_server=stream != "upstream")


class _Direction:
    """One direction of a connection: chunks wait in ``queue`` while toxics act on them."""

    def __init__(self, name: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        self.name = name  # "upstream" | "downstream"
        self.counter = f"bytes_{name}"
        self.src = src
        self.dst = dst
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=_QUEUE_CHUNKS)
        self.busy = False  # the writer holds a chunk it took off the queue


# --------------------------------------------------------------------------- proxy


class FaultProxy:
    """A TCP proxy in front of ``upstream`` whose faults (toxics) are switched at run time."""

    def __init__(self, name: str, upstream: tuple[str, int], *, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, seed: int = 0) -> None:
        self.name = name
        self.upstream = (upstream[0], int(upstream[1]))
        self.listen_host = listen_host
        self._port = listen_port
        self.seed = seed
        self._rng = random.Random(seed)  # toxicity draws only
        self._lock = threading.Lock()  # guards _toxics for readers on other threads
        self._toxics: list[Toxic] = []
        self._conns: dict[int, _Connection] = {}
        self._next_id = 0
        self._enabled = True
        self._counts = {"accepted": 0, "bytes_upstream": 0, "bytes_downstream": 0, "resets": 0,
                        "blackholed_bytes": 0, "dropped_bytes": 0, "upstream_unreachable": 0,
                        "refused": 0}  # connections from another local user's sockets (testbed.isolation)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._changed: asyncio.Event | None = None  # replaced and set on every toxic change

    # ---- lifecycle

    def start(self) -> FaultProxy:
        if self._thread is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.name}", daemon=True)
        self._thread.start()
        try:
            self._submit(self._listen())
        except BaseException:
            self.stop()
            raise
        log.info("fault proxy %s listening on %s -> %s:%d", self.name, self.address, *self.upstream)
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._submit(self._shutdown(), timeout=1.0)
        except Exception:  # noqa: BLE001 - stopping must not fail; leftovers are cancelled below
            log.exception("fault proxy %s: shutdown did not finish cleanly", self.name)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=0.9)
        if thread.is_alive():
            log.warning("fault proxy %s: loop thread still running after stop()", self.name)
        self._loop = self._thread = None
        log.info("fault proxy %s stopped", self.name)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self._port}"

    @property
    def enabled(self) -> bool:
        return self._enabled

    # ---- control (any thread)

    def add_toxic(self, toxic: Toxic) -> None:
        """Add a toxic; it applies to existing connections at once and to new ones. Names are unique."""
        self._control(self._add_toxic, toxic)

    def remove_toxic(self, name: str) -> None:
        self._control(self._remove_toxics, [name])

    def clear_toxics(self) -> None:
        """Heal: remove every toxic; open connections that were not reset work again."""
        self._control(self._remove_toxics, None)

    def toxics(self) -> list[Toxic]:
        with self._lock:
            return [Toxic(**t.to_dict()) for t in self._toxics]

    def disable(self) -> None:
        """Take the link down: close the listener (new connections are refused) and every connection."""
        if self._loop is None:
            self._enabled = False
            return
        self._submit(self._disable())

    def enable(self) -> None:
        """Listen again, on the same port."""
        if self._loop is None:
            self._enabled = True
            return
        self._submit(self._enable())

    def stats(self) -> dict:
        with self._lock:
            names = [t.name for t in self._toxics]
        return {**self._counts, "active": len(self._conns), "enabled": self._enabled, "toxics": names}

    # ---- loop thread

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for t in pending:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def _submit(self, coro: Coroutine[Any, Any, Any], timeout: float = _CONTROL_TIMEOUT_S) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _control(self, fn: Any, arg: Any) -> None:
        if self._loop is None:
            fn(arg)  # not running: no connections to update
            return

        async def call() -> None:
            fn(arg)

        self._submit(call())

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _draw(self, toxic: Toxic) -> bool:
        if toxic.toxicity >= 1.0:
            return True
        if toxic.toxicity <= 0.0:
            return False
        return self._rng.random() < toxic.toxicity

    def _add_toxic(self, toxic: Toxic) -> None:
        if not isinstance(toxic, Toxic):
            raise TypeError(f"add_toxic takes a Toxic (see Toxic.parse), got {type(toxic).__name__}")
        toxic = Toxic(**toxic.to_dict())  # our own copy: the caller's object may change later
        with self._lock:
            if any(t.name == toxic.name for t in self._toxics):
                raise ValueError(f"proxy {self.name!r} already has a toxic named {toxic.name!r}; "
                                 "remove it first or give the new one another name")
            self._toxics.append(toxic)
        for conn in list(self._conns.values()):
            conn.applies[toxic.name] = self._draw(toxic)
            if toxic.kind == "reset" and conn.applies[toxic.name]:
                self._reset(conn, toxic)
        log.info("fault proxy %s: added toxic %s (%s)", self.name, toxic.name, toxic.to_spec())
        self._notify()

    def _remove_toxics(self, names: list[str] | None) -> None:
        with self._lock:
            if names is not None:
                missing = [n for n in names if all(t.name != n for t in self._toxics)]
                if missing:
                    raise KeyError(f"proxy {self.name!r} has no toxic named {missing[0]!r}; "
                                   f"its toxics: {[t.name for t in self._toxics]}")
            removed = [t.name for t in self._toxics if names is None or t.name in names]
            self._toxics = [t for t in self._toxics if t.name not in removed]
        for conn in self._conns.values():
            for n in removed:
                conn.applies.pop(n, None)
        if removed:
            log.info("fault proxy %s: removed toxic(s) %s", self.name, ", ".join(removed))
        self._notify()

    def _active(self, conn: _Connection, direction: str, kind: str) -> list[Toxic]:
        return [t for t in self._toxics
                if t.kind == kind and t.applies_to(direction) and conn.applies.get(t.name, False)]

    def _reset(self, conn: _Connection, toxic: Toxic) -> None:
        log.debug("fault proxy %s: reset connection %d (%s)", self.name, conn.id, toxic.name)
        self._counts["resets"] += 1
        conn.reset(toxic.stream)

    async def _listen(self) -> None:
        self._changed = asyncio.Event()
        if self._enabled:
            await self._enable()

    async def _enable(self) -> None:
        self._enabled = True
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._on_accept, self.listen_host, self._port,
                                                  reuse_address=True, limit=_READ_SIZE)
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("fault proxy %s: enabled on %s", self.name, self.address)

    async def _disable(self) -> None:
        self._enabled = False
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for conn in list(self._conns.values()):
            conn.close()
        log.info("fault proxy %s: disabled (%s refuses connections)", self.name, self.address)

    async def _shutdown(self) -> None:
        await self._disable()
        tasks = [t for c in self._conns.values() for t in c.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=0.5)

    async def _on_accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        sock = client.get_extra_info("socket")
        if sock is not None and not admitted(sock):  # another local user's: closed unread, never forwarded
            self._counts["refused"] += 1
            client.close()
            return
        self._next_id += 1
        conn = _Connection(self._next_id, self.seed, client_reader, client)
        conn.tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        self._conns[conn.id] = conn
        self._counts["accepted"] += 1
        _nodelay(client)
        try:
            if not self._enabled:
                conn.close()
                return
            for t in list(self._toxics):
                conn.applies[t.name] = self._draw(t)
            resets = self._active(conn, "upstream", "reset")  # RST the client without dialling upstream
            if resets:
                self._reset(conn, resets[0])
                return
            try:
                server_reader, server = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream, limit=_READ_SIZE), _DIAL_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                self._counts["upstream_unreachable"] += 1
                log.info("fault proxy %s: upstream %s:%d unreachable (%s); closing client connection %d",
                            self.name, *self.upstream, exc, conn.id)
                conn.close()
                return
            if conn.closed:
                _close(server)
                return
            conn.server = server
            _nodelay(server)
            resets = self._active(conn, "downstream", "reset")
            if resets:
                self._reset(conn, resets[0])
                return
            await self._relay(conn, server_reader)
        except asyncio.CancelledError:
            pass  # closed by reset, disable or stop
        finally:
            conn.close()
            del self._conns[conn.id]

    async def _relay(self, conn: _Connection, server_reader: asyncio.StreamReader) -> None:
        assert conn.server is not None
        pumps = [asyncio.create_task(self._pump(conn, "upstream", conn.client_reader, conn.server)),
                 asyncio.create_task(self._pump(conn, "downstream", server_reader, conn.client))]
        conn.tasks.update(pumps)
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                log.debug("fault proxy %s: connection %d failed: %r", self.name, conn.id, t.exception())
                conn.close()
                return
        # Both directions ended with a propagated end-of-stream: a clean close.
        conn.closed = True
        for w in (conn.client, conn.server):
            w.close()

    async def _pump(self, conn: _Connection, direction: str, src: asyncio.StreamReader,
                    dst: asyncio.StreamWriter) -> None:
        d = _Direction(direction, src, dst)
        reader = asyncio.create_task(self._read(conn, d))
        conn.tasks.add(reader)
        try:
            while True:
                item = await d.queue.get()
                d.busy = True
                if isinstance(item, BaseException):
                    raise item
                if item is _EOF:
                    await self._hold_while_blackholed(conn, direction)
                    if dst.can_write_eof():
                        dst.write_eof()  # half-close: the other direction keeps flowing
                    return
                stamp, data = item
                await self._hold_for_latency(conn, direction, stamp)
                if self._active(conn, direction, "drop"):
                    self._counts["dropped_bytes"] += len(data)
                else:
                    if self._active(conn, direction, "blackhole"):
                        self._counts["blackholed_bytes"] += len(data)
                        await self._hold_while_blackholed(conn, direction)
                    await self._write(conn, direction, dst, data)
                    self._counts[d.counter] += len(data)
                d.busy = False
        finally:
            reader.cancel()

    async def _read(self, conn: _Connection, d: _Direction) -> None:
        try:
            while data := await d.src.read(_READ_SIZE):
                if d.queue.empty() and not d.busy and not self._touched(conn, d.name):
                    # Fast path, the usual case: nothing queued ahead and no toxic on this direction.
                    d.dst.write(data)
                    self._counts[d.counter] += len(data)
                    await d.dst.drain()
                else:
                    await d.queue.put((time.monotonic(), data))
        except (OSError, asyncio.IncompleteReadError) as exc:
            await d.queue.put(exc)
            return
        await d.queue.put(_EOF)

    def _touched(self, conn: _Connection, direction: str) -> bool:
        return any(t.applies_to(direction) and conn.applies.get(t.name, False) for t in self._toxics)

    async def _hold_for_latency(self, conn: _Connection, direction: str, stamp: float) -> None:
        while True:
            changed = self._changed
            assert changed is not None
            latency = self._active(conn, direction, "latency")
            if not latency:
                return
            rng = conn.jitter[direction]
            delay = sum(t.latency_ms + (rng.uniform(-t.jitter_ms, t.jitter_ms) if t.jitter_ms else 0.0)
                        for t in latency) / 1000.0
            remaining = stamp + max(0.0, delay) - time.monotonic()
            if remaining <= 0:
                return
            try:  # wake early if the toxics change, and recompute (a healed link flushes at once)
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                return

    async def _hold_while_blackholed(self, conn: _Connection, direction: str) -> None:
        while True:
            changed = self._changed
            assert changed is not None
            if not self._active(conn, direction, "blackhole"):
                return
            await changed.wait()

    async def _write(self, conn: _Connection, direction: str, dst: asyncio.StreamWriter, data: bytes) -> None:
        view = memoryview(data)
        while view:
            limits = self._active(conn, direction, "bandwidth")
            if not limits:
                dst.write(view)
                await dst.drain()
                return
            rate = min(t.rate_kbps for t in limits) * 1000.0  # bytes per second
            piece = view[:max(1, int(rate * _SLICE_S))]
            await asyncio.sleep(len(piece) / rate)
            dst.write(piece)
            await dst.drain()
            view = view[len(piece):]

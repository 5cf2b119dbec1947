"""FaultProxy: Toxiproxy's toxics on real sockets, switched while connections are open,
and a real Temporal client through the proxy."""

from __future__ import annotations

import asyncio
import http.client
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import temporalio.api.workflowservice.v1 as wsv1
from temporalio.client import Client
from temporalio.service import RPCError

from testbed.engines.temporal.server import EmbeddedTemporal
from testbed.processes import free_port
from testbed.faults.network import FaultProxy, Toxic
from tests.events import HANG_S, wait_for_async

LOCAL = "127.0.0.1"
#: the latency toxic the latency test adds: a round trip without it is faster, one with it is at least this long
#: (loopback's own round trip, even on a loaded machine, is far below it)
LATENCY_S = 1.0


@asynccontextmanager
async def echo_server() -> AsyncIterator[tuple[str, int]]:
    """Echoes every byte; on the client's end-of-stream, closes (so half-close is observable)."""
    handlers: set[asyncio.Task] = set()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, LOCAL, 0)
    try:
        yield LOCAL, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for t in handlers:
            t.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    async with echo_server() as addr:
        yield addr


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy("echo", echo, seed=7) as p:
        yield p


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(LOCAL, proxy.port)


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes = b"ping\n") -> float:
    started = time.monotonic()
    writer.write(data)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(len(data)), HANG_S) == data
    return time.monotonic() - started


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass


async def exchange_or_reset(proxy: FaultProxy) -> bool:
    """One connection, one echo: True if it worked, False if the proxy reset it."""
    try:
        reader, writer = await connect(proxy)
        try:
            await round_trip(reader, writer)
            return True
        finally:
            await close(writer)
    except (ConnectionResetError, asyncio.IncompleteReadError, BrokenPipeError):
        return False


# --------------------------------------------------------------------------- pass-through


async def test_without_toxics_bytes_pass_unchanged_both_ways_on_many_concurrent_connections(
        proxy: FaultProxy) -> None:
    async def one(i: int) -> None:
        payload = os.urandom(200_000 + i)
        reader, writer = await connect(proxy)
        writer.write(payload)
        writer.write_eof()  # half-close: the echo server answers, then closes
        got = await asyncio.wait_for(reader.read(), HANG_S)
        assert got == payload
        await close(writer)

    await asyncio.gather(*(one(i) for i in range(40)))
    stats = proxy.stats()
    assert stats["accepted"] == 40
    assert stats["bytes_upstream"] == stats["bytes_downstream"] == sum(200_000 + i for i in range(40))
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) < LATENCY_S  # no latency added: far below what a latency toxic adds
    await close(writer)


def test_http_keep_alive_through_the_proxy() -> None:
    class Hello(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((LOCAL, 0), Hello)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with FaultProxy("http", httpd.server_address[:2]) as p:
            conn = http.client.HTTPConnection(LOCAL, p.port, timeout=HANG_S)
            for i in range(20):
                conn.request("GET", f"/n/{i}")
                resp = conn.getresponse()
                assert resp.status == 200 and resp.read() == f"/n/{i}".encode()
            conn.close()
            assert p.stats()["accepted"] == 1  # one kept-alive connection
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


# --------------------------------------------------------------------------- latency and bandwidth


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
async def test_latency_delays_one_direction_of_an_open_connection(proxy: FaultProxy, stream: str) -> None:
    # Each bound is a whole LATENCY_S from the next case (one direction delayed, both, twice): room for a busy machine.
    reader, writer = await connect(proxy)
    assert await round_trip(reader, writer) < LATENCY_S
    proxy.add_toxic(Toxic("latency", stream=stream, latency_ms=LATENCY_S * 1000))
    assert LATENCY_S <= await round_trip(reader, writer) < 2 * LATENCY_S  # one direction: not both
    proxy.add_toxic(Toxic("latency", stream="both", latency_ms=LATENCY_S * 500))  # adds up with the first
    assert 2 * LATENCY_S <= await round_trip(reader, writer) < 3 * LATENCY_S
    proxy.clear_toxics()
    assert await round_trip(reader, writer) < LATENCY_S
    await close(writer)


async def test_jitter_stays_within_bounds_and_keeps_chunks_in_order(proxy: FaultProxy) -> None:
    proxy.add_toxic(Toxic.parse("latency:500,jitter=250,stream=downstream"))
    reader, writer = await connect(proxy)
    rtts = [await round_trip(reader, writer, f"{i}\n".encode()) for i in range(8)]
    assert all(0.25 <= r < 1.5 for r in rtts), rtts  # 0.25 to 0.75 s, with room for a busy machine
    assert max(rtts) - min(rtts) > 0.01, rtts  # it does vary
    # Many small chunks in flight at once: jitter must not reorder them.
    lines = b"".join(f"line {i}\n".encode() for i in range(200))
    for i in range(0, len(lines), 50):
        writer.write(lines[i:i + 50])
        await writer.drain()
        await asyncio.sleep(0.001)
    assert await asyncio.wait_for(reader.readexactly(len(lines)), HANG_S) == lines
    await close(writer)


async def test_bandwidth_limits_throughput(proxy: FaultProxy) -> None:
    proxy.add_toxic(Toxic.parse("bandwidth:200,stream=downstream"))  # 200 kB/s
    reader, writer = await connect(proxy)
    payload = os.urandom(100_000)
    started = time.monotonic()
    writer.write(payload)
    assert await asyncio.wait_for(reader.readexactly(len(payload)), HANG_S) == payload
    assert 0.45 <= time.monotonic() - started < 2.0  # 0.5 s at the rate, not a quarter of it
    await close(writer)


# --------------------------------------------------------------------------- blackhole, reset, disable


async def test_blackhole_holds_bytes_silently_and_delivers_them_when_healed(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    await round_trip(reader, writer)
    proxy.add_toxic(Toxic.parse("blackhole"))
    writer.write(b"held\n")
    await writer.drain()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.5)
    assert not writer.is_closing() and not reader.at_eof()
    assert proxy.stats()["blackholed_bytes"] == 5 and proxy.stats()["active"] == 1
    proxy.clear_toxics()
    # As TCP would after a partition heals: what was sent meanwhile arrives, in order, on the same connection.
    assert await asyncio.wait_for(reader.readline(), HANG_S) == b"held\n"
    await round_trip(reader, writer, b"again\n")  # it arrives: nothing is held any more
    assert await exchange_or_reset(proxy)  # and a new connection works too
    await close(writer)


async def test_drop_throws_bytes_away_silently_until_removed(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    await round_trip(reader, writer)
    proxy.add_toxic(Toxic.parse("drop"))
    writer.write(b"lost\n")
    await writer.drain()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.5)
    assert not writer.is_closing() and not reader.at_eof()
    assert proxy.stats()["dropped_bytes"] == 5 and proxy.stats()["active"] == 1
    proxy.clear_toxics()
    await round_trip(reader, writer, b"again\n")  # the open connection works again; "lost" is gone
    assert await exchange_or_reset(proxy)
    await close(writer)


async def test_blackhole_holds_end_of_stream_and_releases_it_when_removed(proxy: FaultProxy) -> None:
    proxy.add_toxic(Toxic("blackhole", stream="upstream", name="cut"))
    reader, writer = await connect(proxy)
    writer.write_eof()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(), 0.3)
    proxy.remove_toxic("cut")
    assert await asyncio.wait_for(reader.read(), HANG_S) == b""  # the echo server saw the FIN and closed
    await close(writer)


async def test_reset_sends_rst_to_open_and_new_connections(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    await round_trip(reader, writer)
    proxy.add_toxic(Toxic.parse("reset"))
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), HANG_S)
    await close(writer)
    assert not await exchange_or_reset(proxy)
    assert proxy.stats()["resets"] == 2
    proxy.remove_toxic("reset_both")
    assert await exchange_or_reset(proxy)


async def test_disable_refuses_connections_and_enable_listens_on_the_same_port(proxy: FaultProxy) -> None:
    port = proxy.port
    reader, writer = await connect(proxy)
    await round_trip(reader, writer)
    proxy.disable()
    assert not proxy.enabled
    assert await asyncio.wait_for(reader.read(), HANG_S) == b""  # the open connection was closed
    await close(writer)
    with pytest.raises(ConnectionRefusedError):
        await connect(proxy)
    proxy.enable()
    assert proxy.enabled and proxy.port == port
    assert await exchange_or_reset(proxy)


async def test_an_unreachable_upstream_closes_the_client_connection() -> None:
    with FaultProxy("nowhere", (LOCAL, free_port())) as p:
        reader, writer = await connect(p)
        assert await asyncio.wait_for(reader.read(), HANG_S) == b""
        await close(writer)
        assert p.stats()["upstream_unreachable"] == 1


# --------------------------------------------------------------------------- toxicity


async def _reset_subset(echo: tuple[str, int], seed: int) -> tuple[list[int], list[int]]:
    """Which of 20 new, then which of 20 open connections a reset with toxicity 0.5 hits."""
    with FaultProxy("toxicity", echo, seed=seed) as p:
        p.add_toxic(Toxic.parse("reset,toxicity=0.5"))
        new = [i for i in range(20) if not await exchange_or_reset(p)]  # one at a time: accept order is fixed
        p.clear_toxics()
        conns = [await connect(p) for _ in range(20)]
        for r, w in conns:
            await round_trip(r, w)
        p.add_toxic(Toxic.parse("reset,toxicity=0.5"))
        existing = []
        for i, (r, w) in enumerate(conns):
            try:
                await round_trip(r, w)
            except (ConnectionResetError, asyncio.IncompleteReadError):
                existing.append(i)
            await close(w)
        return new, existing


async def test_toxicity_hits_a_reproducible_subset_of_connections(echo: tuple[str, int]) -> None:
    new, existing = await _reset_subset(echo, seed=7)
    assert 0 < len(new) < 20 and 0 < len(existing) < 20, (new, existing)
    assert await _reset_subset(echo, seed=7) == (new, existing)
    assert await _reset_subset(echo, seed=8) != (new, existing)


# --------------------------------------------------------------------------- specs and lifecycle


def test_specs_parse_round_trip_and_bad_specs_name_the_problem() -> None:
    t = Toxic.parse("latency:200,jitter=50,stream=downstream")
    assert (t.kind, t.latency_ms, t.jitter_ms, t.stream, t.name) == ("latency", 200, 50, "downstream",
                                                                      "latency_downstream")
    assert Toxic.parse("bandwidth:10").rate_kbps == 10
    assert Toxic.parse("blackhole,toxicity=0.5").toxicity == 0.5
    assert Toxic.parse("reset").name == "reset_both"
    for spec in ["latency:200,jitter=50,stream=downstream", "bandwidth:10", "blackhole", "drop", "blackhole,toxicity=0.5",
                 "reset,stream=upstream,name=cut", "latency:0"]:
        toxic = Toxic.parse(spec)
        assert Toxic.parse(toxic.to_spec()) == toxic
        assert Toxic.from_dict(toxic.to_dict()) == toxic
    for spec, match in [("jitter:5", "unknown kind 'jitter'.*latency, bandwidth, blackhole, drop, reset"),
                        ("latency:abc", "latency='abc' is not a number"),
                        ("latency:100,colour=red", "'colour=red' is not key=value with a known key"),
                        ("blackhole:5", "blackhole takes no"),
                        ("reset,jitter=5", "key 'jitter' does not apply to reset"),
                        ("latency:10,stream=sideways", "unknown toxic stream 'sideways'.*upstream, downstream, both"),
                        ("blackhole,toxicity=2", "toxicity.*0..1"),
                        ("bandwidth", "rate_kbps > 0")]:
        with pytest.raises(ValueError, match=match):
            Toxic.parse(spec)
    with pytest.raises(ValueError, match="unknown toxic field"):
        Toxic.from_dict({"kind": "latency", "delay": 5})


def test_toxic_names_are_unique_and_removing_an_unknown_one_says_which_exist(echo: tuple[str, int]) -> None:
    with FaultProxy("names", echo) as p:
        p.add_toxic(Toxic.parse("latency:10"))
        with pytest.raises(ValueError, match="already has a toxic named 'latency_both'"):
            p.add_toxic(Toxic.parse("latency:20"))
        with pytest.raises(KeyError, match="latency_both"):
            p.remove_toxic("nope")
        assert [t.name for t in p.toxics()] == p.stats()["toxics"] == ["latency_both"]


async def test_stop_with_open_connections_is_quick_and_leaves_no_thread(echo: tuple[str, int]) -> None:
    p = FaultProxy("stopper", echo).start()
    p.add_toxic(Toxic.parse("latency:60000"))  # data stuck in the proxy, too
    conns = [await connect(p) for _ in range(10)]
    for _, w in conns:
        w.write(b"stuck\n")
    async def all_active() -> bool:
        return p.stats()["active"] == 10

    await wait_for_async(all_active, "the proxy's tenth active connection")
    started = time.monotonic()
    p.stop()
    p.stop()  # idempotent
    assert time.monotonic() - started < 30  # the stuck data's 60 s were not waited out
    assert not [t for t in threading.enumerate() if t.name == "fault-proxy-stopper"]
    for r, w in conns:
        assert await asyncio.wait_for(r.read(), HANG_S) == b""
        await close(w)


# --------------------------------------------------------------------------- Temporal through the proxy


async def test_a_temporal_client_through_the_proxy_fails_under_blackhole_and_recovers() -> None:
    request = wsv1.GetSystemInfoRequest()
    async with EmbeddedTemporal() as server:
        host, port = server.address.rsplit(":", 1)
        with FaultProxy("temporal", (host, int(port))) as p:
            client = await Client.connect(p.address)
            await client.workflow_service.get_system_info(request, timeout=timedelta(seconds=60))
            p.add_toxic(Toxic.parse("blackhole"))
            started = time.monotonic()
            with pytest.raises(RPCError):
                await client.workflow_service.get_system_info(request, timeout=timedelta(seconds=1))
            assert time.monotonic() - started < 30  # the call's 1 s timeout, not the partition's forever
            p.clear_toxics()
            # The same client recovers on its own connection: what the partition held is delivered, the HTTP/2
            # stream state is intact (a partition loses no bytes of a TCP stream).
            await client.workflow_service.get_system_info(request, timeout=timedelta(seconds=60))
            assert p.stats()["accepted"] == 1, p.stats()
            p.add_toxic(Toxic.parse("drop"))
            with pytest.raises(RPCError):
                await client.workflow_service.get_system_info(request, timeout=timedelta(seconds=1))
            p.clear_toxics()
            # After a drop the connection may have lost frames (and HPACK state): the first call may fail with
            # "transport error" while the SDK's core finds the connection broken; it then dials a new one.
            failures = []
            for _ in range(5):
                try:
                    await client.workflow_service.get_system_info(request, timeout=timedelta(seconds=60))
                    break
                except RPCError as exc:
                    failures.append(exc)
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the client did not recover after the drop was removed: {failures}")
            assert len(failures) <= 1 and p.stats()["accepted"] <= 2, (failures, p.stats())
            fresh = await Client.connect(p.address)
            await fresh.workflow_service.get_system_info(request, timeout=timedelta(seconds=60))

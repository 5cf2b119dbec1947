"""``python -m benchmarks.proxy``: what the fault proxy (testbed/faults/network.py ``FaultProxy``) adds to a TCP link.

    python -m benchmarks.proxy                          # 5000 64-byte round trips per path, 200 MB each way
    python -m benchmarks.proxy --requests 20000 --payload 1024 --mb 500 --json proxy.json

Chaos runs put a ``FaultProxy`` between every worker and Temporal (and the
model server); with no toxic active it must stay cheap: at most 100 us added
to a request's round trip at the median. This measures it in one run, against
a direct connection to the same server, with the machine's noise spread over
both:

* an echo server runs in a child process (as Temporal does in chaos runs); the
  proxies run in this process, each in its own loop thread, as in testbed/stack.py;
* latency: ``--payload`` bytes sent and read back over one persistent
  connection per path, ``--requests`` times per path, in rounds that alternate
  the paths (direct, proxied, proxied with a no-op ``latency:0`` toxic) and
  rotate their order, after a discarded warm-up;
* throughput: ``--mb`` megabytes streamed one way through each path, upstream
  (client -> server) and downstream (server -> client), in interleaved rounds.

The no-op toxic shows what a configured toxic costs by itself: any toxic on a
direction takes the proxy off its write-through fast path (every chunk is
queued, stamped and handed to the direction's writer task).

Prints a table and a verdict line ("added p50 X us (goal <= 100 us): ok | over")
and exits 0 whatever the verdict: benchmarks report, tests assert.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.percentiles import percentile
from harness.commands import CommandParser, positive, tool
from testbed.faults.network import FaultProxy, Toxic

HOST = "127.0.0.1"
GOAL_US = 100.0
NOOP_TOXIC = "latency:0"
_HEADER = struct.Struct("!cQ")  # mode (E echo, S sink, G generate), byte count
_BLOCK = 1 << 20  # bytes per send / recv in the throughput streams
_IO_TIMEOUT_S = 30.0

#: The echo server, run as ``python -c`` in a child process. It prints its port, serves every connection in a
#: thread, and exits when its stdin closes (so it never outlives this process, even a SIGKILLed one).
_SERVER = r"""
import os, socket, struct, sys, threading
HEADER = struct.Struct("!cQ")
BLOCK = 1 << 20

def exact(conn, n):
    data = b""
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            raise ConnectionError("closed mid-header")
        data += more
    return data

def serve(conn):
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode, count = HEADER.unpack(exact(conn, HEADER.size))
        conn.sendall(b"K")
        if mode == b"E":
            while data := conn.recv(65536):
                conn.sendall(data)
        elif mode == b"S":
            buf = memoryview(bytearray(BLOCK))
            total = 0
            while n := conn.recv_into(buf):
                total += n
            conn.sendall(struct.pack("!Q", total))
        elif mode == b"G":
            block = memoryview(b"x" * BLOCK)
            while count:
                n = min(count, BLOCK)
                conn.sendall(block[:n])
                count -= n
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(65536):
                pass
    except OSError:
        pass
    finally:
        conn.close()

def watch_stdin():
    while sys.stdin.buffer.read(1):
        pass
    os._exit(0)

threading.Thread(target=watch_stdin, daemon=True).start()
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


class EchoServer:
    """The child process serving echo / sink / generate connections on a free port."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> EchoServer:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if not line.strip().isdigit():
                raise RuntimeError(f"the echo server did not start (printed {line!r})")
        except BaseException:  # Ctrl-C included: the child must not outlive this
            self.close()
            raise
        self.port = int(line)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()  # closing stdin is the child's signal to exit
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def connect(port: int, mode: bytes, count: int = 0) -> socket.socket:
    """A connection in ``mode``, once the server has answered (through a proxy: once it dialled upstream)."""
    sock = socket.create_connection((HOST, port), timeout=_IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(_HEADER.pack(mode, count))
    if sock.recv(1) != b"K":
        sock.close()
        raise ConnectionError(f"no answer from the server on port {port}")
    return sock


def round_trips(sock: socket.socket, payload: bytes, n: int, out: list[int]) -> None:
    """``n`` round trips of ``payload``; appends each one's nanoseconds to ``out``."""
    clock = time.perf_counter_ns
    size = len(payload)
    view = memoryview(bytearray(size))
    for _ in range(n):
        t0 = clock()
        sock.sendall(payload)
        got = 0
        while got < size:
            k = sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("the echo connection closed")
            got += k
        out.append(clock() - t0)


def upload(port: int, nbytes: int) -> float:
    """Seconds to stream ``nbytes`` to the sink and have it confirm the count."""
    block = memoryview(b"u" * _BLOCK)
    with connect(port, b"S") as sock:
        t0 = time.perf_counter()
        left = nbytes
        while left:
            n = min(left, _BLOCK)
            sock.sendall(block[:n])
            left -= n
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while len(reply) < 8:
            more = sock.recv(8 - len(reply))
            if not more:
                raise ConnectionError("the sink closed before confirming")
            reply += more
        seconds = time.perf_counter() - t0
    (received,) = struct.unpack("!Q", reply)
    if received != nbytes:
        raise ConnectionError(f"sent {nbytes} bytes, the sink received {received}")
    return seconds


def download(port: int, nbytes: int) -> float:
    """Seconds to receive ``nbytes`` from the generator, to its end of stream."""
    buf = memoryview(bytearray(_BLOCK))
    with connect(port, b"G", nbytes) as sock:
        t0 = time.perf_counter()
        got = 0
        while n := sock.recv_into(buf):
            got += n
        seconds = time.perf_counter() - t0
    if got != nbytes:
        raise ConnectionError(f"expected {nbytes} bytes, received {got}")
    return seconds


def loop_thread_clock(proxy_name: str) -> Callable[[], float] | None:
    """The CPU clock (seconds) of a running FaultProxy's loop thread (``fault-proxy-<name>``), or None."""
    for thread in threading.enumerate():
        if thread.name == f"fault-proxy-{proxy_name}" and thread.ident is not None:
            try:
                clock_id = time.pthread_getcpuclockid(thread.ident)
            except (AttributeError, OSError):
                return None
            return lambda: time.clock_gettime(clock_id)
    return None


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    us = [s / 1000.0 for s in samples_ns]
    return {"n": len(us), "p50": percentile(us, 50), "p90": percentile(us, 90), "p99": percentile(us, 99),
            "mean": statistics.fmean(us), "min": min(us), "max": max(us)}


def rotate(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


def _latency(ports: dict[str, int], clocks: dict[str, Any], payload: bytes, per_round: list[int], warmup: int,
             say: Callable[[str], None]) -> tuple[dict[str, dict[str, float]], dict[str, list[float]], float]:
    """Round trips on one persistent connection per path, rounds alternating the paths: each path's summary (with
    the proxy's CPU per round trip), each proxied path's per-round p50 minus direct's, and the wall time."""
    paths = list(ports)
    rounds = len(per_round)
    socks = {p: connect(ports[p], b"E") for p in paths}
    try:
        say(f"latency: warm-up, {warmup} round trips per path")
        for p in paths:
            round_trips(socks[p], payload, warmup, [])
        samples: dict[str, list[int]] = {p: [] for p in paths}
        round_p50: dict[str, list[float]] = {p: [] for p in paths}
        cpu_s = {p: 0.0 for p in clocks if clocks[p] is not None}
        say(f"latency: {sum(per_round)} round trips of {len(payload)} bytes per path in {rounds} rounds")
        started = time.monotonic()
        shown = started
        for r, n in enumerate(per_round):
            for p in rotate(paths, r):
                batch: list[int] = []
                clock = clocks.get(p)
                cpu0 = clock() if clock else 0.0
                round_trips(socks[p], payload, n, batch)
                if clock:
                    cpu_s[p] += clock() - cpu0
                samples[p].extend(batch)
                round_p50[p].append(percentile(batch, 50) / 1000.0)
            if time.monotonic() - shown >= 2.0 and r + 1 < rounds:
                shown = time.monotonic()
                say(f"latency: round {r + 1}/{rounds}")
        wall = time.monotonic() - started
    finally:
        for s in socks.values():
            s.close()
    latency = {p: summary_us(samples[p]) for p in paths}
    for p, seconds_cpu in cpu_s.items():  # the proxy's own work per round trip: what its code can change
        latency[p]["proxy_cpu_us"] = seconds_cpu / len(samples[p]) * 1e6
    # per round: proxied p50 minus the same round's direct p50 (noise that hits a whole round cancels)
    paired = {p: [a - b for a, b in zip(round_p50[p], round_p50["direct"])] for p in paths if p != "direct"}
    return latency, paired, wall


def _throughput(ports: dict[str, int], mb: int, say: Callable[[str], None]) -> tuple[dict[str, dict[str, float]],
                                                                                     float]:
    """``mb`` MB one way through each path, upstream and downstream, in interleaved rounds: MB/s each way per path,
    and the wall time."""
    paths = list(ports)
    total = mb * 1_000_000
    parts = max(1, min(4, mb))
    sizes = [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
    seconds: dict[tuple[str, str], float] = {}
    say(f"throughput: {mb} MB each way per path, in {parts} rounds")
    for p in paths:  # warm-up: a small transfer each way
        upload(ports[p], min(total, 2_000_000))
        download(ports[p], min(total, 2_000_000))
    started = shown = time.monotonic()
    for r, size in enumerate(sizes):
        for p in rotate(paths, r):
            seconds[p, "up"] = seconds.get((p, "up"), 0.0) + upload(ports[p], size)
            seconds[p, "down"] = seconds.get((p, "down"), 0.0) + download(ports[p], size)
        if time.monotonic() - shown >= 2.0 and r + 1 < parts:
            shown = time.monotonic()
            say(f"throughput: round {r + 1}/{parts}")
    wall = time.monotonic() - started
    return ({p: {"up_mb_s": total / seconds[p, "up"] / 1e6, "down_mb_s": total / seconds[p, "down"] / 1e6}
             for p in paths}, wall)


def measure(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    payload = os.urandom(args.payload)
    rounds = max(1, min(args.rounds, args.requests))
    per_round = [args.requests // rounds + (1 if i < args.requests % rounds else 0) for i in range(rounds)]
    warmup = min(args.requests, 500)
    with EchoServer() as server, FaultProxy("bench", (HOST, server.port)) as proxy, \
            FaultProxy("bench-toxic", (HOST, server.port)) as toxic_proxy:
        toxic_proxy.add_toxic(Toxic.parse(NOOP_TOXIC))
        ports = {"direct": server.port, "proxied": proxy.port}
        clocks = {"proxied": loop_thread_clock(proxy.name)}
        if not args.no_toxic:
            ports[f"proxied + {NOOP_TOXIC}"] = toxic_proxy.port
            clocks[f"proxied + {NOOP_TOXIC}"] = loop_thread_clock(toxic_proxy.name)
        say(f"echo server (child pid {server.proc.pid if server.proc else '?'}) on :{server.port}; proxy on "
            f":{proxy.port}" + ("" if args.no_toxic else f", proxy with {NOOP_TOXIC} on :{toxic_proxy.port}"))
        latency, paired, latency_wall = _latency(ports, clocks, payload, per_round, warmup, say)
        throughput, throughput_wall = _throughput(ports, args.mb, say)
        stats = {"proxied": proxy.stats(), f"proxied + {NOOP_TOXIC}": toxic_proxy.stats()}

    direct = latency["direct"]
    added = {p: {"p50_us": latency[p]["p50"] - direct["p50"], "p90_us": latency[p]["p90"] - direct["p90"],
                 "p99_us": latency[p]["p99"] - direct["p99"], "mean_us": latency[p]["mean"] - direct["mean"],
                 "round_p50_median_us": statistics.median(paired[p]),
                 "round_p50_min_us": min(paired[p]), "round_p50_max_us": max(paired[p])}
             for p in ports if p != "direct"}
    added_p50 = added["proxied"]["p50_us"]
    return {
        "benchmark": "fault proxy overhead (testbed/faults/network.py FaultProxy)",
        "config": {"requests": args.requests, "payload_bytes": args.payload, "rounds": rounds, "warmup": warmup,
                   "mb": args.mb, "pin": args.pin, "noop_toxic": None if args.no_toxic else NOOP_TOXIC,
                   "goal_p50_us": args.goal_us},
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cores": os.cpu_count()},
        "latency_us": latency,
        "added_us": added,
        "throughput": throughput,
        "proxy_stats": {p: stats[p] for p in ports if p in stats},
        "wall_s": {"latency": round(latency_wall, 2), "throughput": round(throughput_wall, 2)},
        "verdict": {"added_p50_us": added_p50, "goal_us": args.goal_us, "ok": added_p50 <= args.goal_us},
    }


def render(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [f"{result['benchmark']}: {c['payload_bytes']}-byte echo round trip, {c['requests']} per path "
             f"in {c['rounds']} interleaved rounds; {c['mb']} MB each way for throughput",
             "",
             f"{'path':<24}{'p50 us':>9}{'p90 us':>9}{'p99 us':>9}{'mean us':>9}{'+p50 us':>9}{'+p99 us':>9}"
             f"{'cpu us':>8}{'up MB/s':>10}{'down MB/s':>10}"]
    for path, lat in result["latency_us"].items():
        add = result["added_us"].get(path)
        tp = result["throughput"][path]
        plus = f"{add['p50_us']:>+9.1f}{add['p99_us']:>+9.1f}" if add else f"{'':>9}{'':>9}"
        cpu = f"{lat['proxy_cpu_us']:>8.1f}" if "proxy_cpu_us" in lat else f"{'':>8}"
        lines.append(f"{path:<24}{lat['p50']:>9.1f}{lat['p90']:>9.1f}{lat['p99']:>9.1f}{lat['mean']:>9.1f}{plus}"
                     f"{cpu}{tp['up_mb_s']:>10.0f}{tp['down_mb_s']:>10.0f}")
    lines.append("")
    lines.append("+p50/+p99: proxied minus direct; cpu us: CPU time of the proxy's loop thread per round trip"
                 + (f"; everything pinned to CPU {c['pin']}" if c.get("pin") is not None else ""))
    for path, add in result["added_us"].items():
        lines.append(f"{path}: added p50 per round (proxied - direct in the same round): median "
                     f"{add['round_p50_median_us']:+.1f} us, range {add['round_p50_min_us']:+.1f} .. "
                     f"{add['round_p50_max_us']:+.1f} us")
    v = result["verdict"]
    lines.append(f"added p50 {v['added_p50_us']:.1f} us (goal <= {v['goal_us']:g} us): {'ok' if v['ok'] else 'over'}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    summary, details = __doc__.split("\n\n", 1)
    p = CommandParser(prog=tool("benchmarks.proxy"), description=summary.split(": ", 1)[1],
                                epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=positive, default=5000, help="round trips per path (default 5000)")
    p.add_argument("--payload", type=positive, default=64, help="bytes per request, echoed back (default 64)")
    p.add_argument("--rounds", type=positive, default=50,
                   help="rounds the round trips are split into, alternating the paths (default 50)")
    p.add_argument("--mb", type=positive, default=200,
                   help="megabytes (10^6 bytes) streamed each way through each path for throughput (default 200)")
    p.add_argument("--no-toxic", action="store_true", help=f"skip the path through a proxy with a no-op {NOOP_TOXIC} "
                                                           "toxic")
    p.add_argument("--pin", type=int, metavar="CPU",
                   help="run this process, its threads and the echo server on one CPU (no cross-CPU wake-ups, "
                        "which on a VM can cost more than the proxy's own work); default: wherever the OS puts them")
    p.add_argument("--goal-us", type=float, default=GOAL_US,
                   help=f"the added p50 the verdict line checks against (default {GOAL_US:g} us)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - start:5.1f}s] {message}", file=sys.stderr, flush=True)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    affinity = None
    try:
        if args.pin is not None:  # before any thread or child starts: they inherit it
            affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {args.pin})
        result = measure(args, say)  # the proxies and the echo server are stopped on the way out, always
    except KeyboardInterrupt:
        print("interrupted: the proxies and the echo server were stopped", file=sys.stderr)
        return 130
    except (OSError, RuntimeError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    print(render(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

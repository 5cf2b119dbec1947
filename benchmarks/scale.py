"""The scale section (``dah-bench --only scale``): the harness's own cost at the shape its users run.

Each size is one real ``kill_mid_turn`` chaos run through ``chaos.runner.run``, the code path ``dah-chaos run
kill_mid_turn --timeouts defaults --conversations N --messages M`` takes (its run directory under ``scale/<size>/`` of the bench
run), then the report built from that run directory alone (``reports.build``). The sizes are
``--scale-conversations`` x ``--scale-messages`` and one continue-as-new size: ``CHAIN_CONVERSATIONS``
conversations of ``--scale-chain`` messages each, continuing as new every ``CHAIN_EVERY_EVENTS`` events, so each
conversation's chain of runs holds thousands of events.

What is the harness's and what is not (``classify``): this process (the driver, the fault proxies, the scripted
model server, the operation log, the checkers, every thread but the sampler's own) and the processes it starts
that are harness code (the replayer, the container reaper) are the harness; the Temporal server is the engine and
the reference worker processes (the fork server and the workers it forks) are the agent, both left out. The
replayer runs and ends inside the check, so its CPU is the children's CPU this process collected while checking
(``resource.RUSAGE_CHILDREN``: the cluster is stopped, and its processes collected, before the check begins).

The fits (``fit``): least squares of each measure against the messages sent, and of the check and replay times
against the history events, with R²; and the exponent of the log-log fit (1: linear, 2: quadratic), which says
how a measure grows where three or four sizes leave a straight-line R² ambiguous.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.options import Bench
from harness.rundir import RunDir

#: the continue-as-new size: conversations, and the history events past which each continues as new
CHAIN_CONVERSATIONS, CHAIN_EVERY_EVENTS = 2, 1000
#: the continue-as-new size's think time between messages (seconds): its many messages in minutes, not ten
CHAIN_THINK_S = 0.1
#: every size's settle round (seconds; the scenario's is 60): the load goes on after the heal until each
#: conversation has sent its messages, and a round with no answer, or ten rounds, abandon it. On 2 busy cores 100 x 20
#: (1.5 to 3 messages a second) and the chain (every turn carries the whole conversation: 1 s a turn at message 20,
#: 6 s at 165) outlast ten 60 s rounds; issue 44's first chain was abandoned at 187 of 220 messages, and a reply that
#: came during the late wait then failed it (a liveness failure of the benchmark's making)
SETTLE_S = 150.0
#: the scenario every size runs, under the agent's and the SDK's own timeouts (``dah-chaos run kill_mid_turn~defaults``,
#: as deployed): the chaos runs' ``fast`` profile (a 0.4 s heartbeat timeout) times out live work on a 2-core machine
#: busy with 30 conversations, and the run then measures a collapse (issue 44: 30 x 20 failed, 92 messages in 208 s)
SCENARIO, TIMEOUTS = "kill_mid_turn", "defaults"
#: the acceptance limits (issue 44): checks at the largest size at most this many times the smallest's; the
#: harness's CPU per message at most this ratio; peak RSS under this many MiB
CHECKS_RATIO_LIMIT, CPU_RATIO_LIMIT, RSS_LIMIT_MIB = 10.0, 1.2, 1024.0
HARNESS, ENGINE, AGENT = "harness", "engine", "agent"


@dataclass(frozen=True)
class Size:
    label: str
    conversations: int
    messages: int
    max_history_events: int = 0  # 0: the scenario's own (no continue-as-new at these lengths)
    think_s: float | None = None  # None: the scenario's own
    settle_s: float = SETTLE_S


def sizes(conversations: tuple[int, ...], messages: int, chain_messages: int) -> list[Size]:
    """The sizes a scale run measures: the continue-as-new size first (none if ``chain_messages`` is 0), then the
    others smallest first, so a run stopped in its largest, longest size keeps every other."""
    out = [Size(f"c{c}xm{messages}", c, messages) for c in sorted(set(conversations))]
    if chain_messages:
        out.insert(0, Size(f"chain-c{CHAIN_CONVERSATIONS}xm{chain_messages}", CHAIN_CONVERSATIONS, chain_messages,
                           CHAIN_EVERY_EVENTS, CHAIN_THINK_S))
    return out


def classify(cmdline: list[str]) -> str:
    """Whose a process under the harness is: ``engine`` (the Temporal server), ``agent`` (a reference worker, or
    the fork server its workers are forked from) or ``harness`` (anything else it started: the replayer, ...)."""
    if cmdline and Path(cmdline[0]).name == "temporal":
        return ENGINE
    joined = " ".join(cmdline)
    if "testbed.forkserver" in joined or " -m testbed worker" in joined:
        return AGENT
    return HARNESS


def fit(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Least squares ``y = intercept + slope * x``, its R², and the log-log exponent (``y ~ x ** exponent``,
    where every value is positive); None where fewer than two distinct x (or a y that is not a number)."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if _number(x) and _number(y)]
    if len({x for x, _ in pts}) < 2:
        return {"n": len(pts), "slope": None, "intercept": None, "r2": None, "exponent": None}
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for _, y in pts)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in pts)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    logs = [(math.log(x), math.log(y)) for x, y in pts if x > 0 and y > 0]
    exponent = None
    if len({x for x, _ in logs}) >= 2:
        lx, ly = sum(x for x, _ in logs) / len(logs), sum(y for _, y in logs) / len(logs)
        exponent = sum((x - lx) * (y - ly) for x, y in logs) / sum((x - lx) ** 2 for x, _ in logs)
    return {"n": n, "slope": slope, "intercept": intercept, "r2": r2,
            "exponent": round(exponent, 3) if exponent is not None else None}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class TreeSampler:
    """CPU seconds and peak RSS of this process and of every process under it, by whose it is (``classify``),
    sampled in a thread every ``interval_s``; the sampler's own CPU is kept apart (``own_cpu_s``) so the harness's
    CPU can leave it out. A process is counted from its CPU when first seen (the fork server outlives a size)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.me = psutil.Process()
        self.rss_mib = 0.0
        self.own_cpu_s = 0.0
        self.procs: dict[tuple[int, float], dict[str, Any]] = {}  # (pid, create time) -> kind, cpu, rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scale-sampler", daemon=True)
        self._first = True

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._first = False
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
        self.own_cpu_s = time.thread_time()

    def sample(self) -> None:
        try:
            self.rss_mib = max(self.rss_mib, self.me.memory_info().rss / 2**20)
            children = self.me.children(recursive=True)
        except psutil.Error:
            return
        for p in children:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    cpu = sum(p.cpu_times()[:2])
                    rss = p.memory_info().rss / 2**20
                    entry = self.procs.get(key)
                    if entry is None:
                        entry = self.procs[key] = {"kind": HARNESS, "cmd": "", "rss_mib": 0.0,
                                                   "base_cpu_s": cpu if self._first else 0.0}
                    if entry["kind"] == HARNESS:  # seen between fork and exec, a server has its parent's command
                        cmd = p.cmdline()
                        entry.update(kind=classify(cmd), cmd=" ".join(cmd)[:120])
                    entry["cpu_s"] = cpu - entry["base_cpu_s"]
                    entry["rss_mib"] = max(entry["rss_mib"], rss)
            except psutil.Error:  # gone between the listing and the read
                continue

    def cpu_s(self, kind: str, leave_out: str = "") -> float:
        return sum(e.get("cpu_s", 0.0) for e in self.procs.values()
                   if e["kind"] == kind and not (leave_out and leave_out in e["cmd"]))

    def peak_rss_mib(self, kind: str) -> float:
        return max((e["rss_mib"] for e in self.procs.values() if e["kind"] == kind), default=0.0)


def _cpu_self() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_dir_bytes(path: Path) -> int:
    """Every file's size under ``path`` (symlinks not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def history_counts(run_dir: Path) -> dict[str, int]:
    """The saved event histories: workflows, runs (one file each), events, and the longest chain's events."""
    chains: dict[str, int] = {}
    runs = 0
    for f in sorted((run_dir / "event_histories").glob("*/*.json")):
        runs += 1
        chains[f.parent.name] = chains.get(f.parent.name, 0) + len(json.loads(f.read_text()).get("events") or [])
    return {"workflows": len(chains), "runs": runs, "events": sum(chains.values()),
            "longest_chain_events": max(chains.values(), default=0)}


def messages_sent(run_dir: Path) -> int:
    """The client's messages (``send_message`` operations invoked), from the run's operation log."""
    from harness import operations

    return sum(1 for op in operations.load(RunDir(run_dir).operations)
               if op.f == "send_message" and op.type == "invoke")


async def measure(bench: Bench, size: Size, out_root: Path) -> dict[str, Any]:
    """One size: its chaos run (as ``dah-chaos run`` runs it), then its report; every measure of it."""
    from chaos import runner
    from chaos.scenarios import SCENARIOS
    from chaos.suite import TIMEOUTS_SEPARATOR, with_load
    from harness.engines import HOME
    from testbed.engines import make_engine

    scenario = with_load(SCENARIOS[SCENARIO], size.conversations, size.messages)
    scenario = dataclasses.replace(scenario, name=f"{SCENARIO}{TIMEOUTS_SEPARATOR}{TIMEOUTS}", timeouts=TIMEOUTS)
    if size.max_history_events:
        scenario = dataclasses.replace(scenario, max_history_events=size.max_history_events)
    scenario = dataclasses.replace(scenario, settle_s=size.settle_s)
    if size.think_s is not None:
        scenario = dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload,
                                                                                think_s=size.think_s))
    checking: dict[str, float] = {}

    def progress(line: str) -> None:
        if line.endswith(": checking"):  # the cluster is stopped and collected: what is reaped now is the replayer
            checking.update(children_cpu=_cpu_children(), wall=time.monotonic())
        bench.say(f"    {size.label}: {line}")

    cpu0, started = _cpu_self(), time.monotonic()
    with TreeSampler() as tree:
        result = await runner.run(scenario, make_engine(HOME), seed=bench.options.seed, out_root=out_root,
                                  progress=progress)
    wall_s, own_cpu = time.monotonic() - started, _cpu_self() - cpu0 - tree.own_cpu_s
    replay_cpu = _cpu_children() - checking["children_cpu"] if checking else 0.0
    report = await asyncio.to_thread(build_report, out_root, bench.run_dir / "scale-reports" / size.label)
    return summarise(size, result, wall_s, own_cpu, replay_cpu, tree, report)


def build_report(runs_root: Path, out: Path) -> dict[str, Any]:
    """The report of ``runs_root`` alone (``dah-report --runs ROOT``): its wall seconds and peak RSS growth."""
    from reports.build import build

    rss0 = psutil.Process().memory_info().rss
    started = time.perf_counter()
    built = build([runs_root], out, bench_dirs=[])
    return {"report_s": round(time.perf_counter() - started, 3), "report_files": len(built.files),
            "report_rss_mib": round(max(rss0, psutil.Process().memory_info().rss) / 2**20, 1)}


def summarise(size: Size, result: Any, wall_s: float, own_cpu: float, replay_cpu: float, tree: TreeSampler,
              report: dict[str, Any]) -> dict[str, Any]:
    """One size's point of ``scale.json``."""
    saved = RunDir(result.run_dir).read_verdict() or {}
    timings = saved.get("timings_s") or {}
    histories = history_counts(result.run_dir)
    messages = messages_sent(result.run_dir)
    replay = next((c for c in saved.get("checks") or [] if c.get("name") == "replay"), {})
    harness_cpu = own_cpu + tree.cpu_s(HARNESS, leave_out="harness.replayer") + replay_cpu
    checks = timings.get("checks") or {}
    return {
        "size": size.label, "conversations": size.conversations, "messages_per_conversation": size.messages,
        "max_history_events": size.max_history_events, "messages": messages, **histories,
        "verdict": result.verdict, "run_dir": str(result.run_dir), "wall_s": round(wall_s, 2),
        "harness_cpu_s": round(harness_cpu, 3), "harness_own_cpu_s": round(own_cpu, 3),
        "replay_cpu_s": round(replay_cpu, 3), "sampler_cpu_s": round(tree.own_cpu_s, 3),
        "harness_cpu_ms_per_message": round(1000 * harness_cpu / messages, 3) if messages else None,
        "engine_cpu_s": round(tree.cpu_s(ENGINE), 2), "agent_cpu_s": round(tree.cpu_s(AGENT), 2),
        "peak_rss_mib": round(tree.rss_mib, 1), "largest_harness_child_rss_mib": round(tree.peak_rss_mib(HARNESS), 1),
        "check_s": timings.get("total"), "checker_s": checks, "measurement_s": timings.get("measurements") or {},
        "replay_s": checks.get("replay"),
        "replay_ms_per_history": round(1000 * checks["replay"] / histories["runs"], 2)
        if checks.get("replay") is not None and histories["runs"] else None,
        "replayed": (replay.get("details") or {}).get("replayed"),
        "run_dir_bytes": run_dir_bytes(result.run_dir), **report}


#: the measures fitted against the messages sent, and those also fitted against the history events
BY_MESSAGES = ("wall_s", "harness_cpu_s", "peak_rss_mib", "check_s", "replay_s", "run_dir_bytes", "report_s")
BY_EVENTS = ("check_s", "replay_s")


def fits(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each measure's fit (``fit``) over the sizes: ``<measure>~messages``, ``<measure>~events``, and every
    check's time against the messages (``checker:<name>~messages``)."""
    out = {f"{m}~messages": fit([p["messages"] for p in points], [p.get(m) for p in points]) for m in BY_MESSAGES}
    out |= {f"{m}~events": fit([p["events"] for p in points], [p.get(m) for p in points]) for m in BY_EVENTS}
    names = dict.fromkeys(n for p in points for n in p["checker_s"])
    out |= {f"checker:{n}~messages": fit([p["messages"] for p in points], [p["checker_s"].get(n) for p in points])
            for n in names}
    return out


def acceptance(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 44's acceptance over the kill_mid_turn sizes (not the continue-as-new one): the largest against the
    smallest; None where fewer than two sizes ran."""
    plain = [p for p in points if not p["max_history_events"]]
    if len(plain) < 2:
        return {"compared": None}
    small, large = min(plain, key=lambda p: p["conversations"]), max(plain, key=lambda p: p["conversations"])
    checks = large["check_s"] / small["check_s"] if small.get("check_s") else None
    cpu = (large["harness_cpu_ms_per_message"] / small["harness_cpu_ms_per_message"]
           if small.get("harness_cpu_ms_per_message") else None)
    rss = max(max(p["peak_rss_mib"], p.get("report_rss_mib") or 0.0) for p in points)
    verdicts = sorted({p["verdict"] for p in points})
    return {"compared": [small["size"], large["size"]],
            "checks_ratio": round(checks, 2) if checks else None, "checks_ratio_limit": CHECKS_RATIO_LIMIT,
            "cpu_per_message_ratio": round(cpu, 2) if cpu else None, "cpu_per_message_ratio_limit": CPU_RATIO_LIMIT,
            "max_rss_mib": round(rss, 1), "rss_limit_mib": RSS_LIMIT_MIB, "verdicts": verdicts,
            "met": bool(checks is not None and checks <= CHECKS_RATIO_LIMIT and cpu is not None
                        and cpu <= CPU_RATIO_LIMIT and rss < RSS_LIMIT_MIB and verdicts == ["pass"])}


def say_point(bench: Bench, p: dict[str, Any]) -> None:
    bench.say(f"  {p['size']}: {p['messages']} messages, {p['events']} events in {p['runs']} histories; "
              f"wall {p['wall_s']:.0f} s, harness CPU {p['harness_cpu_ms_per_message']} ms/message, "
              f"peak RSS {p['peak_rss_mib']:.0f} MiB, check {p['check_s']} s (replay {p['replay_s']} s, "
              f"{p['replay_ms_per_history']} ms/history), run dir {p['run_dir_bytes'] / 2**20:.1f} MiB, "
              f"report {p['report_s']:.1f} s, verdict {p['verdict']}")


async def scale(bench: Bench) -> dict[str, Any]:
    """Every size, smallest first, each saved as soon as it is measured (``scale.json``)."""
    o = bench.options
    points: list[dict[str, Any]] = []
    todo = sizes(o.scale_conversations, o.scale_messages, o.scale_chain)
    for n, size in enumerate(todo, 1):
        bench.say(f"  size {n}/{len(todo)}: {size.label} ({size.conversations} conversations x at least "
                  f"{size.messages} messages" + (f", continue-as-new every {size.max_history_events} events"
                                                  if size.max_history_events else "") + ")")
        point = await measure(bench, size, bench.run_dir / "scale" / size.label)
        points.append(point)
        say_point(bench, point)
        bench.run.write_json("scale.json", result(points))
    return result(points)


def result(points: list[dict[str, Any]]) -> dict[str, Any]:
    return {"scenario": SCENARIO, "points": points, "fits": fits(points), "acceptance": acceptance(points)}

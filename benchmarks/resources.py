"""CPU and memory of the processes under benchmark, sampled with psutil.

    sampler = ResourceSampler(interval_s=0.5)
    with sampler.section("table2", lambda: {"temporal-server": server.pid, "bench": os.getpid()}):
        ...
    sampler.results  # {"table2": {"temporal-server": {"cpu_mean_pct": ..., ...}}}

The process map is a callable, read at every sample, because a section may
restart processes (a killed worker comes back with a new pid). CPU is in
percent of one core. Sampling runs in a thread and never raises into the
benchmark: a process that is gone is skipped until its label maps to a live pid.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil

log = logging.getLogger(__name__)

ProcessMap = Callable[[], dict[str, int | None]]


class ResourceSampler:
    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.results: dict[str, dict[str, dict[str, Any]]] = {}

    @contextlib.contextmanager
    def section(self, name: str, processes: ProcessMap) -> Iterator[None]:
        samples: dict[str, list[tuple[float, float]]] = {}
        handles: dict[tuple[str, int], psutil.Process] = {}
        stop = threading.Event()

        def sample() -> None:
            for label, pid in processes().items():
                if not pid:
                    continue
                try:
                    proc = handles.get((label, pid))
                    if proc is None:  # first sight of this pid: cpu_percent starts its interval now
                        proc = handles[(label, pid)] = psutil.Process(pid)
                        proc.cpu_percent(None)
                        continue
                    with proc.oneshot():
                        samples.setdefault(label, []).append((proc.cpu_percent(None), proc.memory_info().rss / 2**20))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    handles.pop((label, pid), None)

        def loop() -> None:
            while not stop.wait(self.interval_s):
                try:
                    sample()
                except Exception:  # the benchmark matters more than one sample
                    log.exception("resource sample failed")

        try:
            sample()
        except Exception:
            log.exception("resource sample failed")
        thread = threading.Thread(target=loop, name=f"resources-{name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            self.results[name] = {label: _stats(values) for label, values in samples.items() if values}

    def as_dict(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "sections": self.results}


def _stats(values: list[tuple[float, float]]) -> dict[str, Any]:
    cpu = [c for c, _ in values]
    rss = [r for _, r in values]
    return {"cpu_mean_pct": round(statistics.fmean(cpu), 1), "cpu_max_pct": round(max(cpu), 1),
            "rss_mean_mb": round(statistics.fmean(rss), 1), "rss_max_mb": round(max(rss), 1), "samples": len(values)}

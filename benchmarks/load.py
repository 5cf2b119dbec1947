"""CPU-bound processes beside a measurement: what a shared or busy machine looks like, on demand.

    with cpu_hogs(2) as pids:   # two processes spinning on the CPU until the block ends
        ...

Each is a child in its own session (``testbed.processes.spawn``) that the kernel kills if this process dies, and
that the block kills by its pid on any exit, Ctrl-C included: nothing started here outlives it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from testbed.processes import spawn

HOG = "while True:\n    pass\n"


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[list[int]]:
    """``n`` processes spinning on the CPU at this process's priority for the block; their pids."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(spawn([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL))
        yield [p.pid for p in procs]
    finally:
        for p in procs:  # only the processes started here, by pid
            p.kill()
            p.wait()

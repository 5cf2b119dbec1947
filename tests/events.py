"""Waiting on an event in a test: the event decides the verdict, never a fixed wall-clock deadline.

The suite runs on shared CI runners beside other work, where anything can take several times longer than on an
idle machine. A wait polls for its event; its limit (``HANG_S``) only bounds a hang, and a wait that runs out, or
whose process exits first, says which event never came.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")

#: how long a wait goes on before it calls the event lost: a hang, not a slow machine (pytest-timeout: 300 s)
HANG_S = 240.0


def _lost(what: str, limit_s: float, proc: subprocess.Popen | None, log: Path | None) -> str:
    if proc is not None and proc.returncode is not None:
        command = proc.args if isinstance(proc.args, str) else " ".join(map(str, proc.args))
        why = f"{what} never came: {command[:200]} exited with {proc.returncode}"
    else:
        why = f"{what} never came within {limit_s:g} s"
    if log is not None:
        why += f"\n{log}:\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "(no such file)")
    return why


def wait_for(event: Callable[[], T], what: str, *, proc: subprocess.Popen | None = None, log: Path | None = None,
             limit_s: float = HANG_S, every_s: float = 0.1) -> T:
    """``event()``'s first truthy value, asked every ``every_s``; AssertionError naming ``what`` if ``proc`` exits
    first or ``limit_s`` passes (with the tail of ``log``, if given)."""
    limit = time.monotonic() + limit_s
    while not (seen := event()):
        if proc is not None and proc.poll() is not None and not (seen := event()):
            raise AssertionError(_lost(what, limit_s, proc, log))
        if time.monotonic() > limit:
            raise AssertionError(_lost(what, limit_s, None, log))
        time.sleep(every_s)
    return seen


async def wait_for_async(event: Callable[[], Awaitable[T]], what: str, *, limit_s: float = HANG_S,
                         every_s: float = 0.05) -> T:
    """``await event()``'s first truthy value, asked every ``every_s``; AssertionError naming ``what`` once
    ``limit_s`` passes."""
    limit = time.monotonic() + limit_s
    while not (seen := await event()):
        if time.monotonic() > limit:
            raise AssertionError(_lost(what, limit_s, None, None))
        await asyncio.sleep(every_s)
    return seen


def running(p: psutil.Process) -> bool:
    """Whether ``p`` (the very process psutil saw, not a later one with its pid) has yet to end; a zombie nobody
    has reaped yet has ended."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

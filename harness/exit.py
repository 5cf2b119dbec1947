"""Leave the process without interpreter finalization.

Temporal's Rust bridge keeps threads that can call into CPython while it
finalizes, which aborts a short-lived process with SIGABRT ("PyGILState_Release
... must be current", temporalio/sdk-python#300) after it has done its work.
Entry points finish everything (their ``with`` blocks have stopped servers and
workers), flush, and exit here instead.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Callable

_BEFORE_EXIT: list[Callable[[], None]] = []


def before_exit(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the process ends, by ``exit_now`` (which skips ``atexit``) or normally; it may run twice
    (make it idempotent)."""
    _BEFORE_EXIT.append(fn)
    atexit.register(fn)


def exit_now(code: int) -> None:
    for fn in reversed(_BEFORE_EXIT):
        try:
            fn()
        except Exception:  # noqa: BLE001 - the exit goes on; say what failed
            logging.getLogger(__name__).exception("before-exit %r failed", fn)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

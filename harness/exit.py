"""Leave the process without interpreter finalization.

Temporal's Rust bridge keeps threads that can call into CPython while it
finalizes, which aborts a short-lived process with SIGABRT ("PyGILState_Release
... must be current", temporalio/sdk-python#300) after it has done its work.
Entry points finish everything (their ``with`` blocks have stopped servers and
workers), flush, and exit here instead.
"""

from __future__ import annotations

import logging
import os
import sys


def exit_now(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

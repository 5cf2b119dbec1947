"""The harness's contract with what it runs and what it saves: standard library only (and temporalio for event
histories), so it imports in an agent's own Python as well as in the harness's.

    rundir          the run directory: layout, atomic writes, ``latest``, names, machine info (RUN_DIRECTORY.md)
    run_files       reading a file a run names without leaving its directory (no ``..``, no symlink, bounded)
    operations      the operation log: invoke / ok / fail / info, Jepsen's model
    event_history   Temporal event histories: fetch, save, load, parse
    verdict         pass / fail / unknown and how checks compose
    recording       the effect ledger an agent's activities record executions and effects in (the public API)
    faults          the faults injected into an agent itself and into its model API
    driver_host     a target's driver, run in the target's own Python and spoken to over its stdin/stdout
    replayer        Temporal's replayer, run in the target's own Python
    private         paths only the invoking user controls: private temporary directories, trusted files
    percentiles     percentiles and the latency summary (n, mean, sd, p50, p95, p99) the benchmarks and reports show

``own_module`` is how the harness starts its own code in a child of its own interpreter: with ``-P``
(``SAFE_PATH``), so the directory the child runs in (a user's project, which may hold an ``agent/``, ``harness/``
or ``testbed/`` folder of its own) is not on the child's ``sys.path`` and the harness's packages, installed in its
environment, are the ones imported.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from harness.owner import owned_tempdir
from harness.private import private_dir

PACKAGE = Path(__file__).resolve().parent
#: the interpreter flag of every child that runs the harness's own code: the child's directory is not on its sys.path
SAFE_PATH = "-P"


def own_module(module: str, *args: str) -> list[str]:
    """``python -P -m module args...`` in this interpreter: one of the harness's own modules as a child process."""
    return [sys.executable, SAFE_PATH, "-m", module, *args]


def pythonpath_for_targets() -> str:
    """A directory that holds this package and nothing else, for a target interpreter's ``PYTHONPATH``.

    A target agent runs in its own Python (its own pins); it gets ``harness`` (for ``harness.recording``, the
    driver host and the replayer) without the harness's other packages or any of its dependencies. The
    directory holds one symlink and is named after the user and this package's path, so every run reuses it;
    it is private (``harness.private.private_dir``): one made first by anyone else (a ``sitecustomize.py`` in it
    would run in every target process) is never used, and this process makes a fresh one of its own instead
    (``harness.owner.owned_tempdir``: it goes with this process, however that ends)."""
    global _fallback
    digest = hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:12]
    base = private_dir(Path(tempfile.gettempdir()) / f"dah-harness-path-{os.geteuid()}-{digest}")
    if base is None:
        if _fallback is None:
            _fallback = owned_tempdir("harness-path")  # 0700, ours, a new name
            logging.getLogger(__name__).warning("the shared harness path directory is not this user's alone; "
                                                "using %s", _fallback)
        base = _fallback
    link = base / "harness"
    if not link.is_symlink() or link.resolve() != PACKAGE:
        tmp = base / f".harness.{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(PACKAGE, target_is_directory=True)
        os.replace(tmp, link)
    return str(base)


#: this process's own harness path directory, when the shared one is not private
_fallback: Path | None = None


def target_pythonpath(own: str | None = None) -> str:
    """``PYTHONPATH`` for a process in a target's interpreter: ``harness`` first, then the target's own entries."""
    return os.pathsep.join([pythonpath_for_targets(), *filter(None, [own])])

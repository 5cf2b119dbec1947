"""The docs' quick commands (the fenced blocks marked ``<!-- quick: ... -->``, ``tests.test_docs.quick_commands``)
run as printed, by a shell without the virtual environment on its PATH, in a directory that reads as a fresh clone
after ``make venv``, and exit 0.

The clone links every entry of the source tree but ``runs/`` and ``.dah/`` (what the commands write lands in the
clone, not in the tree), and holds the run the README's tour re-checks: made by step 1 of the tour, as printed
(``.venv/bin/dah-chaos run kill_mid_turn``), once per session. The slow commands (``make chaos``, ``make test``) are
only checked to exist (``tests/test_docs.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs import ROOT, SAVED_RUN, quick_commands

#: the tour's step 1, as the README prints it
TOUR_RUN = f".venv/bin/dah-chaos run {SAVED_RUN}"


def _shell(command: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DAH_", "VIRTUAL_ENV"))}
    # A fresh shell: the virtual environment not activated (a command that needs it must name .venv/bin/ itself)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and p != venv_bin)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The clone's .venv is the tree's: `make venv` there must find it made (were it stale, pip would reinstall the
    # tree's environment from the clone, and its console scripts would name the clone's interpreter).
    stale = subprocess.run(["make", "-q", "venv"], cwd=ROOT, capture_output=True).returncode
    assert stale == 0, "the virtual environment is older than pyproject.toml: run `make venv`, then these tests"
    clone = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", ".dah", ".git"}:
            (clone / entry.name).symlink_to(entry)
    if any(f"runs/{SAVED_RUN}/" in command for _, command in quick_commands()):
        assert TOUR_RUN in (ROOT / "README.md").read_text(), "the README's tour no longer makes the run it re-checks"
        out = _shell(TOUR_RUN, clone, 600)
        assert out.returncode == 0, f"`{TOUR_RUN}` exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return clone


@pytest.mark.parametrize(("doc", "command"), quick_commands(), ids=lambda v: v[:60])
def test_a_quick_command_runs_as_printed(doc: str, command: str, fresh_clone: Path) -> None:
    out = _shell(command, fresh_clone, 120)
    assert out.returncode == 0, f"{doc}: `{command}` exited {out.returncode}:\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}"

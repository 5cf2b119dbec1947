"""Run the harness's chaos commands in the harness's own Python, and read what they concluded.

Standard library only, and no import of the harness: the harness runs as a subprocess in its own interpreter
(``<home>/.venv/bin/python -I -m chaos``), as a bring-your-own target's workers run in theirs, so its pins never
meet the test environment's. Isolated (``-I``): the directory it runs in is not on its ``sys.path``, so a folder of
the user's project named ``chaos/``, ``agent/``, ``harness/`` or ``testbed/`` never stands in for the harness's own
code (installed in its venv: editable after ``make``). Every call gets a fresh output directory of its own; once
the command ends, ``python -m chaos summary`` reads the run directories in it (the same reader as CI's: a verdict
is never better than its checks, a run that never ended is never a pass), and each run's ``verdict.json`` gives
the per-check summaries.
What a run directory holds is read as data: bounded, regular files only, paths kept inside the output directory;
what the plugin shows of it (names, summaries, paths, the reproduce command) goes through ``printable``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, TextIO

ENV_HOME, ENV_PYTHON = "DAH_HOME", "DAH_PYTHON"
PASS, FAIL, UNKNOWN, ERROR = "pass", "fail", "unknown", "error"
#: the files ``python -m chaos summary`` writes into a call's output directory
SUMMARY_FILE, JUNIT_FILE = "pytest-dah-summary.json", "pytest-dah-junit.xml"
#: the most diagnosis lines a failure message quotes of one run (the rest are in its verdict.json)
MAX_DIAGNOSES = 8
#: the largest summary or verdict.json read (a run directory is data, not trusted to be small)
MAX_JSON_BYTES = 64 * 1024 * 1024
#: what the harness's interpreter must not inherit from the test environment's
_NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")
#: how long a stopped command (timeout, Ctrl-C) has to end its runs as ``terminated`` before it is killed
STOP_GRACE_S = 60.0
#: how the harness's interpreter is started: isolated (no cwd on sys.path, no PYTHON* variables, no user site)
ISOLATED = "-I"

#: C0 and C1 controls and DEL; bidirectional marks, embeddings, overrides and isolates (they reorder what a reader
#: sees); line and paragraph separators; surrogates and U+FFFE/U+FFFF. The harness's own rule
#: (``harness/printable.py``), repeated here because the plugin imports nothing of the harness; a test holds the
#: two to the same answer for every character.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def printable(text: object, keep: str = "") -> str:
    """``str(text)`` with every character that could act on a terminal, reorder what a reader sees or break an XML
    report shown as a visible escape (``\\x1b``, ``\\u202e``), but those in ``keep``; a backslash stays one. Run
    data (a check's name or summary, a path, the reproduce command) is shown only through it."""
    def escape(match: "re.Match[str]") -> str:
        char = match.group()
        if char in keep:
            return char
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    return _UNSAFE.sub(escape, str(text))


class HarnessNotFound(Exception):
    """The harness's interpreter could not be found: the message is one line saying what to set."""


@dataclass(frozen=True)
class Harness:
    """Where the harness is: its interpreter, and the clone it runs in (None: only the interpreter was given)."""

    python: Path
    home: Optional[Path] = None

    @classmethod
    def locate(cls, python: Optional[str] = None, home: Optional[str] = None, *, python_from: str = "--dah-python",
               home_from: str = "--dah-home") -> "Harness":
        """The harness from an interpreter (``python``) or a clone (``home``: its ``.venv/bin/python``), each
        falling back to ``$DAH_PYTHON`` and ``$DAH_HOME``; ``HarnessNotFound`` saying what to set."""
        if not python and os.environ.get(ENV_PYTHON):
            python, python_from = os.environ[ENV_PYTHON], f"${ENV_PYTHON}"
        if not home and os.environ.get(ENV_HOME):  # with an interpreter too: where it runs (cwd)
            home, home_from = os.environ[ENV_HOME], f"${ENV_HOME}"
        if python:
            path = Path(python).expanduser() if "/" in python else Path(shutil.which(python) or python)
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise HarnessNotFound(f"pytest-dah: {python_from} {python}: no such executable; give the harness's "
                                      "interpreter (a clone's .venv/bin/python, after make there)")
            return cls(path.absolute(), Path(home).expanduser().absolute() if home else None)
        if not home:
            raise HarnessNotFound("pytest-dah: where is the harness? Set DAH_HOME to a durable-agent-harness clone "
                                  "(after make there), or pass --dah-home DIR (ini: dah_home), or --dah-python "
                                  "PATH (its interpreter)")
        root = Path(home).expanduser().absolute()
        path = root / ".venv" / "bin" / "python"
        if not (root / "chaos").is_dir():
            raise HarnessNotFound(f"pytest-dah: {home_from} {home}: not a durable-agent-harness clone (no chaos/ "
                                  "in it)")
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise HarnessNotFound(f"pytest-dah: {home_from} {home}: {path} is missing; run make in {root} first")
        return cls(path, root)

    def command(self, *args: str) -> List[str]:
        return [str(self.python), ISOLATED, "-m", "chaos", *args]

    def cwd(self) -> Path:
        return self.home or Path.cwd()

    def environment(self) -> Dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}


@dataclass(frozen=True)
class Check:
    """One checker's result, as the run's ``verdict.json`` has it."""

    name: str
    verdict: str
    summary: str = ""


@dataclass(frozen=True)
class ChaosRun:
    """One run (a scenario on a seed), as ``python -m chaos summary`` read it from its run directory."""

    scenario: str
    seed: int
    verdict: str  # pass, fail, unknown or error
    status: str  # complete, failed, interrupted, terminated, running, not_run, missing, skipped, unreadable
    checks: List[Check]
    run_dir: Optional[Path]
    reproduce: str
    error: Optional[str] = None
    wall_s: Optional[float] = None
    #: verdict.json's diagnoses: what made the run slow or fail, and what to change, one line each
    diagnoses: List[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == PASS and self.status == "complete"

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    def non_pass(self) -> List[Check]:
        return [c for c in self.checks if c.verdict in (FAIL, UNKNOWN)]

    def headline(self) -> str:
        """``crash_after_effect seed 1 fail (lost fail, effects fail)`` (``printable``)"""
        why = ", ".join(f"{c.name} {c.verdict}" for c in self.non_pass())
        return printable(f"{self.scenario} seed {self.seed} {self.verdict}" + (f" ({why})" if why else ""))


@dataclass
class ChaosResult:
    """What one chaos command concluded: its runs, the directory they are in, and how the command ended."""

    command: List[str]
    cwd: Path
    exit_code: int
    out: Path
    runs: List[ChaosRun] = field(default_factory=list)
    problem: Optional[str] = None  # why nothing (or not everything) could be read
    stderr_tail: List[str] = field(default_factory=list)
    python: str = ""

    @property
    def verdict(self) -> str:
        """``pass`` only if the command exited 0 and every run that was meant to run completed and passed; else
        ``fail`` (a checker said so), ``error`` (a run crashed, or nothing could be read) or ``unknown``."""
        ran = [r for r in self.runs if not r.skipped]
        if any(r.verdict == FAIL for r in ran):
            return FAIL
        if not ran or any(r.verdict == ERROR for r in ran):
            return ERROR
        if all(r.passed for r in ran) and self.exit_code == 0 and not self.problem:
            return PASS
        return UNKNOWN

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def run(self) -> Optional[ChaosRun]:
        """The one run, when the command made exactly one."""
        return self.runs[0] if len(self.runs) == 1 else None

    @property
    def run_dir(self) -> Optional[Path]:
        return self.run.run_dir if self.run else None

    @property
    def reproduce(self) -> str:
        """The command that runs the one run again, runnable as printed (empty when there is not exactly one)."""
        return self.runnable(self.run.reproduce) if self.run else ""

    def runnable(self, reproduce: str) -> str:
        """The harness's reproduce command as it runs from any directory: in its cwd, with its interpreter."""
        if not reproduce:
            return ""
        text = (re.sub(r"^python3? -m ", lambda _: f"{shlex.quote(self.python)} {ISOLATED} -m ", reproduce)
                if self.python else reproduce)
        return f"cd {shlex.quote(str(self.cwd))} && {text}"

    def describe(self) -> str:
        """Why it did not pass, for an assertion message: each run that did not pass with its checkers' summaries,
        its run directory and the command that reproduces it; every line ``printable`` (it quotes run data)."""
        bad = [r for r in self.runs if not (r.passed or r.skipped)]
        said = "; ".join(r.headline() for r in bad)
        if not said and not self.runs:  # the command itself went wrong: its own last words say why
            said = (self.stderr_tail or [self.problem or ""])[-1]
        lines = [f"chaos {self.verdict}" + (f": {said}" if said else ""),
                 f"  ran: {shlex.join(self.command)} (exit status {self.exit_code})"]
        if self.problem:
            lines.append(f"  {self.problem}")
        for r in bad:
            lines.append(f"  {r.scenario} seed {r.seed}: {r.verdict} (run {r.status})")
            lines += [f"    {c.name}: {c.verdict}: {c.summary}" for c in r.non_pass()]
            lines += [f"    diagnosis: {d}" for d in r.diagnoses[:MAX_DIAGNOSES]]
            if len(r.diagnoses) > MAX_DIAGNOSES:
                lines.append(f"    ... {len(r.diagnoses) - MAX_DIAGNOSES} more diagnoses in its verdict.json")
            if r.error:
                lines.append(f"    error: {r.error.strip().splitlines()[0] if r.error.strip() else '?'}")
            if r.run_dir:
                lines.append(f"    run dir: {r.run_dir}")
            if r.reproduce:
                lines.append(f"    reproduce: {self.runnable(r.reproduce)}")
        if not self.runs and self.stderr_tail:
            lines.append("  the command's last words:")
            lines += [f"    {line}" for line in self.stderr_tail]
        passed = sum(r.passed for r in self.runs)
        if self.runs:
            lines.append(f"  {passed} of {len(self.runs)} run(s) passed; all runs under {self.out}")
        return "\n".join(printable(line) for line in lines)

    def assert_passed(self) -> None:
        if not self.passed:
            raise AssertionError(self.describe())


def fresh_directory(parent: Path, name: str) -> Path:
    """``parent/name/<UTC stamp>``, created here and nowhere else (``-2``, ``-3``... on a clash)."""
    base = parent / _slug(name) / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: 999 directories of that name already")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:100] or "chaos"


def run_chaos(harness: Harness, commands: Sequence[Sequence[str]], out: Path, *, timeout_s: Optional[float] = None,
              stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> ChaosResult:
    """Run each of ``commands`` (``python -m chaos`` arguments, each writing into ``out``) in turn, then read
    every run in ``out``. ``timeout_s`` bounds them all together: past it, the command is stopped as a CI job's
    timeout stops it (SIGTERM: its runs end ``terminated``), never counted as a pass."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    code, problem = 0, None
    tail: deque = deque(maxlen=20)
    shown: List[str] = []
    for args in commands:
        cmd = harness.command(*args)
        shown = cmd
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        code, timed_out = _run(cmd, harness, left, tail, stdout or sys.stdout, stderr or sys.stderr)
        if timed_out:
            problem = f"stopped after the {timeout_s:g} s timeout (--chaos-timeout)"
            break
        if code not in (0, 1):  # 1: a run did not pass; anything else: the command itself went wrong
            break
    result = ChaosResult(command=shown, cwd=harness.cwd(), exit_code=code, out=out, problem=problem,
                         stderr_tail=list(tail), python=str(harness.python))
    result.runs, read_problem = read_runs(harness, out)
    result.problem = "; ".join(p for p in (problem, read_problem) if p) or None
    return result


def _run(cmd: List[str], harness: Harness, timeout_s: Optional[float], tail: deque, stdout: TextIO,
         stderr: TextIO) -> "tuple[int, bool]":
    """Run one command, copying its output to ``stdout``/``stderr`` (pytest captures them) and keeping the last
    lines of its stderr; (exit status, whether it was stopped by the timeout)."""
    proc = subprocess.Popen(cmd, cwd=harness.cwd(), env=harness.environment(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    copiers = [threading.Thread(target=_copy, args=(proc.stdout, stdout, None), daemon=True),
               threading.Thread(target=_copy, args=(proc.stderr, stderr, tail), daemon=True)]
    for t in copiers:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    except BaseException:  # Ctrl-C, or pytest's own timeout: the runs end terminated, nothing is left behind
        _stop(proc)
        raise
    finally:
        for t in copiers:
            t.join(timeout=10)
    return proc.returncode, timed_out


def _copy(source: Iterable[str], sink: TextIO, tail: Optional[deque]) -> None:
    for line in source:
        line = printable(line, keep="\t\n")  # the harness's output quotes run data too
        try:
            sink.write(line)
            sink.flush()
        except (OSError, ValueError):  # the sink closed (pytest's capture ended): keep draining the pipe
            pass
        if tail is not None:
            tail.append(line.rstrip("\n"))


def _stop(proc: "subprocess.Popen[str]") -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_runs(harness: Harness, out: Path) -> "tuple[List[ChaosRun], Optional[str]]":
    """Every run in ``out``, read by ``python -m chaos summary`` (its summary JSON, written into ``out``), with
    each run's checks from its ``verdict.json``; and what could not be read (None: nothing)."""
    if not any(out.iterdir()):
        out.rmdir()  # nothing to keep: no empty directory stays behind
        return [], "it left no run directory"
    summary = out / SUMMARY_FILE
    done = subprocess.run(harness.command("summary", str(out), "--summary", str(summary), "--junit",
                                          str(out / JUNIT_FILE)),
                          cwd=harness.cwd(), env=harness.environment(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, errors="replace")
    doc = _read_json(summary)
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        said = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
        return [], f"python -m chaos summary {out} read no runs: {said[-1] if said else '?'}"
    runs = [r for r in (_run_from_row(row, out) for row in doc["runs"]) if r is not None]
    return runs, None if runs else f"python -m chaos summary {out} found no runs"


def _run_from_row(row: Any, out: Path) -> Optional[ChaosRun]:
    if not isinstance(row, dict) or not isinstance(row.get("scenario"), str):
        return None
    run_dir = _inside(out, row.get("run_dir"))
    checks = _checks(run_dir) if run_dir else None
    if checks is None:  # no readable verdict.json: the summary's own account of the checks
        said = {c.get("check"): c for c in row.get("non_pass") or [] if isinstance(c, dict)}
        checks = [Check(str(name), str(verdict), str((said.get(name) or {}).get("summary") or ""))
                  for name, verdict in (row.get("checkers") or {}).items()]
    seed = row.get("seed")
    wall = row.get("wall_s")
    return ChaosRun(scenario=row["scenario"], seed=seed if isinstance(seed, int) else 0,
                    verdict=str(row.get("verdict") or UNKNOWN), status=str(row.get("status") or "missing"),
                    checks=checks, run_dir=run_dir, reproduce=str(row.get("reproduce") or ""),
                    error=str(row["error"]) if row.get("error") else None,
                    wall_s=float(wall) if isinstance(wall, (int, float)) else None,
                    diagnoses=_diagnoses(run_dir) if run_dir else [])


def _inside(out: Path, relative: Any) -> Optional[Path]:
    """``out / relative`` if it stays inside ``out`` (a run directory's path is data, not trusted)."""
    if not isinstance(relative, str) or not relative:
        return None
    root = out.resolve()
    path = (root / relative).resolve()
    return path if path == root or root in path.parents else None


def _checks(run_dir: Path) -> Optional[List[Check]]:
    doc = _read_json(run_dir / "verdict.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        return None
    return [Check(str(c.get("name")), str(c.get("verdict")), str(c.get("summary") or ""))
            for c in doc["checks"] if isinstance(c, dict)]


def _diagnoses(run_dir: Path) -> List[str]:
    doc = _read_json(run_dir / "verdict.json")
    found = doc.get("diagnoses") if isinstance(doc, dict) else None
    return [str(d.get("line"))[:2000] for d in found if isinstance(d, dict)] if isinstance(found, list) else []


def _read_json(path: Path) -> Any:
    """A JSON file's content if it is a regular file (not a symlink) of at most ``MAX_JSON_BYTES``; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_size <= MAX_JSON_BYTES):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_JSON_BYTES + 1)
        return json.loads(data.decode("utf-8"), parse_constant=lambda c: None)
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)

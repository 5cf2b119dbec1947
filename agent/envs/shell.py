"""``ShellLocalEnv``: a fresh, isolated workspace per run and a ``bash`` tool that works only in it.

Every ``bash`` call is one transaction on the workspace, so a command's
effects are applied once even when its worker is killed mid-command:

1. under an exclusive lock on the environment (``flock``: held by one
   process at a time, released by the kernel if the holder dies), copy the
   current generation of the workspace to a new one;
2. run the command in the new generation (``agent.envs.sandbox``);
3. commit: write the result, then replace ``HEAD.json`` atomically (the
   commit point) with the new generation and the call's idempotency key,
   and point the ``workspace`` symlink at it.

A command killed before the commit leaves only an abandoned generation that
the next call deletes, so its retry starts from the workspace as it was. The
effect ledger records each commit once per idempotency key (``bash`` is a
side-effecting tool like ``write_file``); a retry that finds its key in
``HEAD.json`` (committed, but the ledger was not told) returns the recorded
result instead of running the command again.

Layout of ``<envs root>/<env id>/``: ``HEAD.json``, ``gens/<generation>/``,
``workspace`` (symlink to the current generation), ``results/<key>.json``,
``lock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import stat
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import psutil

from agent.contracts import EnvRecord
from harness.durable_files import write_atomic
from agent.envs.base import Env, EnvConfigError, EnvUnavailableError
from agent.envs.sandbox import SANDBOX_PATH, CommandResult, Limits, bwrap_available, run_command, running_as_root
from agent.errors import ToolValidationError
from agent.tools import Tool, ToolContext

MAX_COMMAND_CHARS = 10_000
_SANDBOX_UIDS = (2_100_000_000, 100_000_000)  # a uid of its own per environment: base + crc32(env id) % span


@dataclasses.dataclass
class ShellSettings:
    # "bwrap": bubblewrap isolation, refused where it cannot work; "none": opt out explicitly (limits still apply).
    isolation: Literal["bwrap", "none"] = "bwrap"
    timeout_s: float = 30.0  # wall clock per command
    cpu_s: int = 20  # CPU seconds per process
    max_processes: int = 64
    memory_mb: int = 1024  # address space per process
    max_file_mb: int = 64  # largest file a command may write
    max_output_bytes: int = 16384  # the model sees at most this much output
    keep_workspace: bool = True  # cleanup keeps the workspace's files (and drops old generations)

    def check(self) -> None:
        for name in ("timeout_s", "cpu_s", "max_processes", "memory_mb", "max_file_mb", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise EnvConfigError(f"env.{name}: must be greater than 0, got {getattr(self, name)}")
        if self.max_processes < 4:
            raise EnvConfigError(f"env.max_processes: must be at least 4 (bwrap and bash need some), "
                                 f"got {self.max_processes}")

    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, max_processes=self.max_processes,
                      memory_mb=self.memory_mb, max_file_mb=self.max_file_mb,
                      max_output_bytes=self.max_output_bytes)


def _copy_entry(src: str, dst: str) -> None:
    """copytree's copier: regular files with metadata, FIFOs recreated, sockets and devices skipped."""
    mode = os.lstat(src).st_mode
    if stat.S_ISREG(mode):
        shutil.copy2(src, dst)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(dst, stat.S_IMODE(mode))


def _chown_tree(root: Path, uid: int) -> None:
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)


class ShellLocalEnv(Env):
    name = "shell_local"
    settings_class = ShellSettings
    settings: ShellSettings

    # -- layout -------------------------------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        return self.directory / "workspace"

    @property
    def sandbox_uid(self) -> int | None:
        if not running_as_root():
            return None
        base, span = _SANDBOX_UIDS
        return base + zlib.crc32(self.env_id.encode()) % span

    def _head(self) -> dict[str, Any]:
        return json.loads((self.directory / "HEAD.json").read_text())

    def _generation(self, name: str) -> Path:
        return self.directory / "gens" / name

    def _relink(self, generation: str) -> None:
        tmp = self.directory / ".workspace.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(Path("gens") / generation)
        os.replace(tmp, self.workspace)

    def _isolate(self) -> bool:
        if self.settings.isolation == "none":
            return False
        ok, why = bwrap_available()
        if not ok:
            raise EnvUnavailableError(
                f"shell_local refuses to run commands without isolation: {why}. Install it, or set "
                "'isolation: none' in the env section of the agent config to run commands unisolated "
                "(limits still apply; the host file system is then reachable)")
        return True

    # -- lifecycle ----------------------------------------------------------------------------------

    def _make_record(self, note: str) -> EnvRecord:
        return EnvRecord(name=self.name, env_id=self.env_id, note=note,
                         data={"directory": str(self.directory), "workspace": str(self.workspace),
                               "isolation": self.settings.isolation},
                         tools=[t.spec() for t in self.get_tools()])

    async def build(self) -> EnvRecord:
        self._isolate()  # refuse at build time, before the model is ever asked anything
        if (self.directory / "HEAD.json").exists():
            # A retried build (the first attempt's worker died after building): use what it made.
            self.record = self._make_record(f"workspace {self.workspace} (built by an earlier attempt)")
            return self.record
        for sub in ("gens", "results"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        first = "g000000"
        self._generation(first).mkdir(exist_ok=True)
        if self.sandbox_uid is not None:
            os.chown(self._generation(first), self.sandbox_uid, self.sandbox_uid)
        write_atomic(self.directory / "HEAD.json", json.dumps({"gen": first, "applied": []}).encode())
        self._relink(first)
        self.record = self._make_record(f"built a fresh workspace {self.workspace}")
        return self.record

    async def attach(self, record: EnvRecord) -> str:
        if (self.directory / "HEAD.json").exists():
            self.record = record
            return f"re-attached to workspace {self.workspace} (generation {self._head()['gen']})"
        await self.build()
        return f"rebuilt: the workspace {self.workspace} was gone, so an empty one was made"

    async def get_state(self) -> str:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        s = self.settings
        limits = (f"limits per command: {s.timeout_s:g} s wall clock, {s.cpu_s} s CPU, {s.max_processes} "
                  f"processes, {s.memory_mb} MiB memory, output cut at {s.max_output_bytes} bytes")
        if s.isolation == "none":
            where = f"Your workspace: {self.workspace}"
            how = f"Commands run without isolation (isolation: none); {limits}."
        else:
            where = f"Your workspace: {SANDBOX_PATH} (on the host: {self.workspace})"
            how = (f"Commands run in a bubblewrap sandbox: no network, the system read-only, only the workspace "
                   f"writable; {limits}.")
        return (f"Current time: {now}\n{where}\n"
                f"You can only run bash commands in your workspace!!!\n{how}")

    def get_tools(self) -> list[Tool]:
        s = self.settings
        return [Tool(
            "bash",
            "Run a bash command with your workspace as the working directory and return its output and exit code. "
            f"Only the workspace is writable; there is no network; the command is killed after {s.timeout_s:g} s.",
            {"type": "object", "additionalProperties": False, "required": ["command"],
             "properties": {"command": {"type": "string", "description": "a bash command line"}}},
            self._bash, side_effects=True, expected_seconds=s.timeout_s,
        )]

    async def cleanup(self) -> str:
        killed = self._kill_sandbox_processes()
        extra = f"; killed {killed} leftover process(es)" if killed else ""
        if not self.directory.exists():
            return f"nothing to clean up (no {self.directory}){extra}"
        if not self.settings.keep_workspace:
            shutil.rmtree(self.directory, ignore_errors=True)
            return f"removed {self.directory}{extra}"
        async with self._locked():
            self._prune(self._head()["gen"])
        return f"kept workspace {self.workspace}; removed old generations{extra}"

    def _kill_sandbox_processes(self) -> int:
        """Processes still running as this environment's own uid (a background job of isolation: none)."""
        uid = self.sandbox_uid
        if uid is None:
            return 0
        killed = 0
        for p in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error, TypeError):
                if p.info["uids"].real == uid:
                    p.kill()
                    killed += 1
        return killed

    # -- the bash tool --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        fd = os.open(self.directory / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.02)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _prune(self, keep: str) -> None:
        for gen in (self.directory / "gens").iterdir():
            if gen.name != keep:
                shutil.rmtree(gen, ignore_errors=True)

    def _result_path(self, key: str) -> Path:
        return self.directory / "results" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    async def _transaction(self, command: str, key: str) -> dict[str, Any]:
        isolate = self._isolate()
        async with self._locked():
            head = self._head()
            if key in head["applied"]:
                return json.loads(self._result_path(key).read_text())
            self._prune(head["gen"])  # a generation a killed command left behind
            new = f"g{int(head['gen'][1:]) + 1:06d}"
            shutil.copytree(self._generation(head["gen"]), self._generation(new), symlinks=True,
                            copy_function=_copy_entry)
            if self.sandbox_uid is not None:
                _chown_tree(self._generation(new), self.sandbox_uid)
            result: CommandResult = await run_command(command, self._generation(new), self.settings.limits(),
                                                      isolate=isolate, sandbox_uid=self.sandbox_uid)
            record = {**dataclasses.asdict(result), "generation": new}
            write_atomic(self._result_path(key), json.dumps(record).encode())
            applied = [*head["applied"], key][-10_000:]
            write_atomic(self.directory / "HEAD.json", json.dumps({"gen": new, "applied": applied}).encode())
            self._relink(new)
            shutil.rmtree(self._generation(head["gen"]), ignore_errors=True)
            return record

    async def _bash(self, args: dict[str, Any], ctx: ToolContext) -> str:
        command = args["command"]
        if not command.strip():
            raise ToolValidationError("bash: command is empty")
        if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
            raise ToolValidationError(f"bash: command longer than {MAX_COMMAND_CHARS} characters or contains NUL")
        key = ctx.ident.idempotency_key
        digest = hashlib.sha256(command.encode()).hexdigest()
        result, _ = await ctx.ledger.apply_once_async(
            ctx.ident, "bash", f"{self.env_id}:workspace", digest,
            lambda: self._transaction(command, key),
            lambda: key in self._head()["applied"],
        )
        if result.get("recovered"):  # committed by an attempt whose worker died before telling the ledger
            result = json.loads(self._result_path(key).read_text())
        return format_result(command, result, self.settings.max_output_bytes)


def format_result(command: str, result: dict[str, Any], limit: int) -> str:
    r = CommandResult(**{k: v for k, v in result.items() if k in CommandResult.__dataclass_fields__})
    lines = [f"$ {command}", r.output.rstrip("\n")] if r.output.strip() else [f"$ {command}"]
    if r.truncated:
        lines.append(f"[output truncated to {limit} bytes]")
    lines.append(f"[{r.describe()}]")
    return "\n".join(lines)

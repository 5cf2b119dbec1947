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

Quotas. A workspace holds at most ``max_workspace_files`` entries (files,
directories, links...) and ``max_workspace_mb`` (each file counted at its
length or its disk usage, whichever is larger; hard links once), which bounds
what every later call copies (``cp -a``, in a subprocess, off the event loop:
measured on ext4 0.15-2 s of kernel time for 10,000 files and 0.2-1.6 s for
512 MiB, depending on the host's load and on writeback). The new generation
is measured after the command, before the commit: over the quota, it is not
committed; the call's result says so, and
the workspace is as it was before (the outcome is recorded under the call's
key like any other). A monitor also measures it while the command runs and
kills the command once it is over, so a command cannot fill the host's disk
until its time limit. A workspace already over the quota (made by an older
version, or the quota was lowered) is not copied: the call is refused
(``ToolExecutionError``) until the operator removes files or raises the quota.
Its usage is kept in ``HEAD.json``, so a call measures only the new generation.

Layout of ``<envs root>/<env id>/``: ``HEAD.json``, ``gens/<generation>/``,
``workspace`` (symlink to the current generation), ``results/<key>.json``,
``lock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import psutil

from agent.contracts import EnvRecord
from harness.durable_files import write_atomic
from agent.envs.base import Env, EnvConfigError, EnvUnavailableError
from agent.envs.sandbox import (_SAFE_PATH, MIB, SANDBOX_PATH, CommandResult, Limits, SandboxStartError,
                                bwrap_available, run_command, running_as_root, sandbox_tmp_usage)
from agent.errors import ToolError, ToolExecutionError, ToolRetryableError, ToolValidationError
from agent.tools import Tool, ToolContext

MAX_COMMAND_CHARS = 10_000
#: a uid of its own per environment: base + crc32(its directory) % span. The directory, not the env id alone:
#: two environments with one id under two roots (two runs, two tests) would share a uid, and the end of a command
#: in one (``_kill_sandbox_processes``) would kill the other's commands.
_SANDBOX_UIDS = (2_100_000_000, 100_000_000)


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
    # The workspace's quota: every call copies the workspace, so these bound its cost (module docstring).
    max_workspace_mb: int = 512
    max_workspace_files: int = 10_000
    # The sandbox's /tmp: a tmpfs, so host memory, counted apart from memory_mb (per-process address space);
    # writing past it fails with ENOSPC. Its number of files is bounded by max_workspace_files (a monitor).
    tmp_mb: int = 64

    def check(self) -> None:
        for name in ("timeout_s", "cpu_s", "max_processes", "memory_mb", "max_file_mb", "max_output_bytes",
                     "max_workspace_mb", "max_workspace_files", "tmp_mb"):
            if getattr(self, name) <= 0:
                raise EnvConfigError(f"env.{name}: must be greater than 0, got {getattr(self, name)}")
        if self.max_processes < 4:
            raise EnvConfigError(f"env.max_processes: must be at least 4 (bwrap and bash need some), "
                                 f"got {self.max_processes}")

    def limits(self) -> Limits:
        # No single file larger than the whole workspace may hold (RLIMIT_FSIZE).
        return Limits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, max_processes=self.max_processes,
                      memory_mb=self.memory_mb, max_file_mb=min(self.max_file_mb, self.max_workspace_mb),
                      max_output_bytes=self.max_output_bytes, tmp_mb=self.tmp_mb)

    def quota_text(self) -> str:
        return f"{self.max_workspace_files} files and {self.max_workspace_mb} MiB"


@dataclasses.dataclass
class Usage:
    """What a workspace holds; ``over`` says which quota it exceeds (the count stopped there), if any."""

    files: int = 0
    bytes: int = 0
    over: str | None = None


def measure(root: Path, max_files: int, max_bytes: int, *, repair: bool = False, racing: bool = False) -> Usage:
    """Count ``root``'s entries and bytes, stopping as soon as either is over its limit.

    Bytes: each inode once (``cp -a`` keeps hard links), at its length or its disk usage, whichever is larger
    (a sparse file counts at its length). ``repair`` (no command runs): clear set-user/group-ID bits, and when
    not root give the owner read (and directory search) permission back, so that the next copy can read
    everything. ``racing`` (the command is running): entries that vanish mid-count are skipped."""
    usage = Usage()
    seen: set[tuple[int, int]] = set()
    me_root = running_as_root()
    stack = [str(root)]
    while stack:
        top = stack.pop()
        try:
            entries = os.scandir(top)
        except OSError:
            if racing:  # gone, or (not root) made unreadable: the count after the command repairs and sees it
                continue
            raise
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    if racing:
                        continue
                    raise
                usage.files += 1
                mode = st.st_mode
                if repair:
                    clear = stat.S_ISUID | stat.S_ISGID if stat.S_ISREG(mode) else 0
                    need = 0 if me_root else stat.S_IRWXU if stat.S_ISDIR(mode) else (
                        stat.S_IRUSR if stat.S_ISREG(mode) else 0)  # read, and (directories) empty it
                    if mode & clear or mode & need != need:
                        _chmod_beneath(root, os.path.relpath(entry.path, root), st, clear, need)
                if st.st_nlink < 2 or stat.S_ISDIR(mode) or (st.st_dev, st.st_ino) not in seen:
                    if st.st_nlink > 1 and not stat.S_ISDIR(mode):
                        seen.add((st.st_dev, st.st_ino))
                    usage.bytes += max(st.st_size, st.st_blocks * 512)
                if stat.S_ISDIR(mode):
                    stack.append(entry.path)
                if usage.files > max_files:
                    usage.over = f"more than {max_files} files"
                elif usage.bytes > max_bytes:
                    usage.over = f"more than {max_bytes // MIB} MiB"
                if usage.over:
                    return usage
    return usage


def _chmod_beneath(root: Path, relative: str, seen: os.stat_result, clear: int, add: int) -> None:
    """chmod ``root/relative`` (clearing ``clear``, adding ``add``) without following a symbolic link anywhere
    on the way: it is resolved one component at a time (O_PATH, O_NOFOLLOW), and changed only if it is still
    the inode the count saw. (Root would otherwise follow a link a dying sandbox process swapped in.)"""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for part in relative.split(os.sep):
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (seen.st_dev, seen.st_ino) and not stat.S_ISLNK(st.st_mode):
            os.chmod(f"/proc/self/fd/{fd}", (stat.S_IMODE(st.st_mode) & ~clear) | add)
    finally:
        os.close(fd)


_T = TypeVar("_T")


async def _off_loop(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run file system work in a thread (the event loop keeps heartbeating); a cancellation waits for it to end,
    so nothing still writes in the environment's directory once its lock is released."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()
    return result


_HOST_PATH = re.compile(r"(?<![\w./~-])/(?!workspace\b)[\w.+~-]+(?:/[\w.+~-]+)*")


def _hide(text: str, paths: dict[Path, str]) -> str:
    """``text`` for the model: the generations' host paths as ``/workspace``, any other host path by its last
    component only."""
    for path, shown in sorted(paths.items(), key=lambda kv: -len(str(kv[0]))):
        text = text.replace(str(path), shown)
    return _HOST_PATH.sub(lambda m: os.path.basename(m.group()), text)


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
        return base + zlib.crc32(os.fsencode(self.directory.resolve())) % span

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
        if shutil.which("cp", path=_SAFE_PATH) is None:
            raise EnvUnavailableError(f"shell_local copies the workspace with cp (coreutils); none on {_SAFE_PATH}")
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
        # tool_timeout_s: the workflow gives a call this plus a margin (the copy and the measuring fit in it).
        return EnvRecord(name=self.name, env_id=self.env_id, note=note,
                         data={"directory": str(self.directory), "workspace": str(self.workspace),
                               "isolation": self.settings.isolation, "tool_timeout_s": self.settings.timeout_s},
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
        write_atomic(self.directory / "HEAD.json",
                     json.dumps({"gen": first, "applied": [], "usage": dataclasses.asdict(Usage())}).encode())
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
                  f"processes, {s.memory_mb} MiB memory, output cut at {s.max_output_bytes} bytes; the workspace "
                  f"may hold at most {s.quota_text()} (a command that leaves more is undone)")
        if s.isolation == "none":
            where = f"Your workspace: {self.workspace}"
            how = f"Commands run without isolation (isolation: none); {limits}."
        else:
            where = f"Your workspace: {SANDBOX_PATH} (on the host: {self.workspace})"
            how = (f"Commands run in a bubblewrap sandbox: no network, the system read-only, only the workspace "
                   f"and /tmp (at most {s.tmp_mb} MiB and {s.max_workspace_files} files, emptied after each "
                   f"command) writable; {limits}.")
        return (f"Current time: {now}\n{where}\n"
                f"You can only run bash commands in your workspace!!!\n{how}")

    def get_tools(self) -> list[Tool]:
        s = self.settings
        return [Tool(
            "bash",
            "Run a bash command with your workspace as the working directory and return its output and exit code. "
            f"Only the workspace is writable; there is no network; the command is killed after {s.timeout_s:g} s. "
            f"The workspace may hold at most {s.quota_text()}: a command that leaves more is undone.",
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

    def _measure(self, gen: Path, **kwargs: Any) -> Usage:
        s = self.settings
        return measure(gen, s.max_workspace_files, s.max_workspace_mb * MIB, **kwargs)

    def _shown(self, *gens: Path) -> dict[Path, str]:
        """Host paths in messages -> what the model sees (the workspace's own path in the sandbox)."""
        return {**{g: SANDBOX_PATH for g in gens}, self.directory: "environment-directory"}

    async def _copy(self, src: Path, dst: Path) -> None:
        """``cp -a``: contents, modes, times and owners (no chown pass), hard links kept, in a subprocess (the
        event loop keeps heartbeating) that a cancellation kills."""
        cp = shutil.which("cp", path=_SAFE_PATH)
        if cp is None:
            raise ToolExecutionError("bash: the command was not run: this worker has no cp (coreutils)")
        try:
            proc = await asyncio.create_subprocess_exec(
                cp, "-a", "--no-target-directory", "--", str(src), str(dst), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                env={"PATH": _SAFE_PATH, "LC_ALL": "C"})
        except OSError as exc:
            raise self._copy_failed(exc.strerror or str(exc), exc.errno) from None
        try:
            _, err = await proc.communicate()
        finally:
            if proc.returncode is None:  # cancelled: stop the copy before the lock is released
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.shield(proc.wait())
        if proc.returncode != 0:
            text = _hide(err.decode(errors="replace").strip(), self._shown(src, dst))
            full = "No space left on device" in text or "Disk quota exceeded" in text
            raise self._copy_failed(text.splitlines()[-1][:300] if text else f"cp exit {proc.returncode}",
                                    errno.ENOSPC if full else None)

    @staticmethod
    def _copy_failed(reason: str, code: int | None) -> ToolError:
        if code in (errno.ENOSPC, errno.EDQUOT):
            return ToolExecutionError(f"bash: the command was not run: the host has no space left to copy the "
                                      f"workspace ({reason}); the workspace is unchanged")
        if code in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE):
            return ToolRetryableError(f"bash: could not copy the workspace ({reason}); will retry")
        return ToolExecutionError(f"bash: the command was not run: the workspace could not be copied ({reason}); "
                                  "the workspace is unchanged")

    def _commit(self, key: str, head: dict[str, Any], gen: str, usage: Usage, record: dict[str, Any]) -> None:
        write_atomic(self._result_path(key), json.dumps(record).encode())
        applied = [*head["applied"], key][-10_000:]
        write_atomic(self.directory / "HEAD.json", json.dumps(
            {"gen": gen, "applied": applied, "usage": dataclasses.asdict(usage)}).encode())

    def _head_gen(self) -> str | None:
        try:
            return self._head()["gen"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    async def _transaction(self, command: str, key: str) -> dict[str, Any]:
        try:
            isolate = self._isolate()
        except EnvUnavailableError as exc:  # this worker cannot isolate (the one that built the env could)
            raise ToolExecutionError(f"bash: the command was not run: this worker cannot run it "
                                     f"({_hide(str(exc), self._shown())})") from None
        async with self._locked():
            head = self._head()
            if key in head["applied"]:
                return json.loads(self._result_path(key).read_text())
            try:
                return await self._apply(command, key, head, isolate)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ToolExecutionError("bash: the host ran out of disk space; the command's changes (if it "
                                             "ran) were discarded and the workspace is unchanged") from None
                raise  # anything else is a bug here (retried)

    async def _apply(self, command: str, key: str, head: dict[str, Any], isolate: bool) -> dict[str, Any]:
        """The transaction under the lock: check the quota, copy, run, measure, commit (or discard)."""
        s = self.settings
        await _off_loop(self._prune, head["gen"])  # a generation a killed command left behind
        current = self._generation(head["gen"])
        known = head.get("usage")
        usage = Usage(files=known.get("files", 0), bytes=known.get("bytes", 0)) if isinstance(known, dict) else None
        if usage is None or usage.files > s.max_workspace_files or usage.bytes > s.max_workspace_mb * MIB:
            usage = await self._checked(current)  # an older version's HEAD, or a lowered quota: count (bounded)
        if usage.over:
            raise ToolExecutionError(
                f"bash: the command was not run: the workspace is already over its quota ({usage.over}; the "
                f"quota is {s.quota_text()}), so it is not copied. It was filled before this quota applied (an "
                f"older version, or a lowered quota): the operator must remove files from it or raise "
                f"env.max_workspace_files / env.max_workspace_mb")
        new = f"g{int(head['gen'][1:]) + 1:06d}"
        path = self._generation(new)
        committed = False
        try:
            await self._copy(current, path)

            async def over_quota(pid: int) -> str | None:
                return await asyncio.to_thread(self._watch, path, pid if isolate else None)

            try:
                result = await run_command(command, path, s.limits(), isolate=isolate, sandbox_uid=self.sandbox_uid,
                                           monitor=over_quota)
            except SandboxStartError as exc:
                text = f"bash: the command was not run: {_hide(str(exc), self._shown(path))}"
                raise (ToolRetryableError(text) if exc.transient else ToolExecutionError(text)) from None
            if not isolate:
                await _off_loop(self._kill_sandbox_processes)  # a background job would write after the count
            after = await self._checked(path, repair=True)
            record = {**dataclasses.asdict(result), "generation": new}
            if after.over or result.stopped_by:
                why = f"the workspace holds {after.over}" if after.over else result.stopped_by
                record.update(generation=head["gen"], quota=(
                    f"quota exceeded ({why}; the quotas: the workspace {s.quota_text()}, /tmp {s.tmp_mb} MiB and "
                    f"{s.max_workspace_files} files): the command's changes were discarded and the workspace is as "
                    f"it was before the command"))
                self._commit(key, head, head["gen"], usage, record)  # the outcome, recorded; no new generation
                return record
            try:
                self._commit(key, head, new, after, record)
            except OSError:
                if self._head_gen() != new:
                    raise
            committed = True  # HEAD.json names the new generation
        finally:
            if not committed and self._head_gen() not in (new, None):
                await _off_loop(shutil.rmtree, path, ignore_errors=True)
        with contextlib.suppress(OSError):  # the symlink is for people; HEAD.json is the truth
            self._relink(new)
            await _off_loop(shutil.rmtree, current, ignore_errors=True)
        return record

    def _watch(self, path: Path, bwrap_pid: int | None) -> str | None:
        """While the command runs: a reason to stop it, if the workspace or the sandbox's /tmp is over quota."""
        now = self._measure(path, racing=True)
        if now.over:
            return f"the workspace went over its quota ({now.over})"
        tmp = sandbox_tmp_usage(bwrap_pid) if bwrap_pid is not None else None
        if tmp is not None and tmp[0] > self.settings.max_workspace_files:
            return f"/tmp went over {self.settings.max_workspace_files} files"
        return None

    async def _checked(self, path: Path, **kwargs: Any) -> Usage:
        """``measure`` off the event loop, its failures (a file it cannot read) classified."""
        try:
            return await _off_loop(self._measure, path, **kwargs)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            why = _hide(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc), self._shown(path))
            raise ToolExecutionError(f"bash: the workspace could not be measured ({why}); the command's changes "
                                     "(if it ran) were discarded and the workspace is unchanged") from None

    async def _bash(self, args: dict[str, Any], ctx: ToolContext) -> str:
        command = args.get("command") if isinstance(args, dict) else None
        if not isinstance(command, str):
            raise ToolValidationError(f"bash: argument 'command' must be a string, got {type(command).__name__}")
        if not command.strip():
            raise ToolValidationError("bash: command is empty")
        if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
            raise ToolValidationError(f"bash: command longer than {MAX_COMMAND_CHARS} characters or contains NUL")
        try:
            encoded = command.encode()
        except UnicodeEncodeError:
            raise ToolValidationError("bash: command is not valid text (it has a lone surrogate)") from None
        key = ctx.ident.idempotency_key
        digest = hashlib.sha256(encoded).hexdigest()
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
    if result.get("quota"):
        lines.append(f"[{result['quota']}]")
    return "\n".join(lines)

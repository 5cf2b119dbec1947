"""Run one shell command isolated and limited: bubblewrap, rlimits, a time limit, truncated output.

Isolation (``bwrap``): new user, PID, network, IPC, UTS and cgroup
namespaces; the system (``/usr``) read-only, ``/`` and ``/dev`` read-only, a
private ``/tmp`` of at most ``tmp_mb`` (a tmpfs: host memory, counted apart
from ``memory_mb``, which bounds each process's address space), no ``/etc``
and no home; the only writable host path is the workspace, mounted at
``/workspace``; no network at all. The sandbox dies with its parent
(``--die-with-parent``): a killed worker takes its commands with it.
``bwrap`` is the absolute path found on the worker's ``PATH`` when
``bwrap_available`` checked it, not looked up again in the scrubbed ``PATH``
the command gets.

Limits, enforced by the kernel: CPU seconds (``RLIMIT_CPU``), address space
(``RLIMIT_AS``), file size (``RLIMIT_FSIZE``), open files, and processes
(``RLIMIT_NPROC``). The kernel does not apply ``RLIMIT_NPROC`` to root, so
when this process is root the command runs as an unprivileged uid of its
own (``sandbox_uid``), which makes the process limit real and keeps the
command away from root-owned files even without bubblewrap. The wall-clock
limit kills the whole process group, and so does a ``monitor`` (the shell
environment's workspace quota) that reports a reason to stop.

A sandbox that cannot be started at all raises ``SandboxStartError``; what
the command itself does never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_PATH = "/workspace"
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
PROBE_UID = 2_099_999_999
MIB = 1024 * 1024
_bwrap_exe: str | None = None  # the absolute path bwrap_available found (set by it)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 30.0
    cpu_s: int = 20
    max_processes: int = 64
    memory_mb: int = 1024
    max_file_mb: int = 64
    max_output_bytes: int = 16384
    tmp_mb: int = 64  # the sandbox's /tmp (tmpfs: host memory, not counted in memory_mb)


class SandboxStartError(RuntimeError):
    """The sandbox could not be started (bwrap missing or not executable, no processes left...)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient  # a shortage of host resources that may pass (EAGAIN, ENOMEM...)


@dataclass
class CommandResult:
    exit_code: int | None  # None: killed by the time limit
    output: str  # stdout and stderr interleaved, truncated to the limit
    truncated: bool
    timed_out: bool
    duration_s: float
    signal_name: str | None = None  # the signal that ended it (SIGXCPU: the CPU limit)
    stopped_by: str | None = None  # why the monitor killed it (the workspace quota)

    def describe(self) -> str:
        if self.stopped_by:
            return f"killed after {self.duration_s:.1f} s: {self.stopped_by}"
        if self.timed_out:
            return f"killed by the time limit after {self.duration_s:.1f} s"
        if self.signal_name:
            why = {"SIGXCPU": " (CPU time limit)", "SIGKILL": " (killed)", "SIGSEGV": " (crashed)"}
            return f"killed by {self.signal_name}{why.get(self.signal_name, '')}"
        return f"exit code {self.exit_code}"


def running_as_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def bwrap_available() -> tuple[bool, str]:
    """Whether bubblewrap can isolate a command here, and if not, why (cached per process).

    Finds ``bwrap`` on this process's ``PATH`` and keeps its absolute path (``bwrap_executable``): the
    command's own, scrubbed ``PATH`` may not have it."""
    global _bwrap_exe
    _bwrap_exe = None
    found = shutil.which("bwrap")
    if found is None:
        return False, "bubblewrap (bwrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap"
    exe = os.path.abspath(found)
    if running_as_root() and not os.access("/usr/bin/setpriv", os.X_OK):
        return False, "/usr/bin/setpriv (util-linux) is missing; it drops the sandbox to an unprivileged uid"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dah-bwrap-probe-") as probe_dir:
        uid = PROBE_UID if running_as_root() else None
        try:
            probe = subprocess.run(bwrap_command("true", Path(probe_dir), uid, bwrap=exe), capture_output=True,
                                   text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"bubblewrap at {exe} could not be started ({exc})"
    if probe.returncode != 0:
        return False, (f"bubblewrap at {exe} cannot create a sandbox here ({probe.stderr.strip()[:200]}); "
                       "it needs root or unprivileged user namespaces, and version 0.5 or later (--size)")
    _bwrap_exe = exe
    return True, f"bubblewrap at {exe}"


def bwrap_executable() -> str | None:
    """The absolute path of the bwrap that ``bwrap_available`` checked; None if it found none that works."""
    bwrap_available()
    return _bwrap_exe


def _bwrap_system_args() -> list[str]:
    """Read-only system directories: /usr, and /bin, /lib... as symlinks (merged /usr) or binds."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def bwrap_command(command: str, workdir: Path, sandbox_uid: int | None, *, tmp_mb: int = Limits.tmp_mb,
                  bwrap: str | None = None) -> list[str]:
    """The bwrap argv. As root: no user namespace; inside the sandbox ``setpriv`` drops to ``sandbox_uid``
    with no capabilities (a real uid, so the kernel's process limit applies). Otherwise: a user namespace.

    ``bwrap``: the executable, by default the absolute path ``bwrap_available`` checked."""
    if bwrap is None:
        bwrap = bwrap_executable()
        if bwrap is None:
            raise SandboxStartError(f"bubblewrap is not usable here: {bwrap_available()[1]}", transient=False)
    if sandbox_uid is not None:
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        drop = ["/usr/bin/setpriv", f"--reuid={sandbox_uid}", f"--regid={sandbox_uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    else:
        namespaces, drop = ["--unshare-all"], []
    return [
        bwrap, *namespaces, "--die-with-parent", "--new-session",
        *_bwrap_system_args(),
        # /tmp: a tmpfs of bounded size (ENOSPC past it); /dev read-only (in a user namespace its tmpfs, with
        # /dev/shm, would otherwise be writable and unbounded: host memory).
        "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--size", str(tmp_mb * MIB), "--tmpfs", "/tmp", "--chmod", "1777", "/tmp",
        "--bind", str(workdir), SANDBOX_PATH, "--chdir", SANDBOX_PATH,
        "--hostname", "sandbox",
        "--clearenv", "--setenv", "PATH", _SAFE_PATH, "--setenv", "HOME", SANDBOX_PATH,
        "--setenv", "LANG", "C.UTF-8", "--setenv", "TERM", "dumb", "--setenv", "TMPDIR", "/tmp",
        "--remount-ro", "/",
        "--", *drop, "/bin/bash", "--noprofile", "--norc", "-c", command,
    ]


def _scrubbed_env(workdir: Path) -> dict[str, str]:
    # Nothing of the worker's environment (API keys, tokens, proxies) reaches the command.
    return {"PATH": _SAFE_PATH, "HOME": str(workdir), "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": str(workdir)}


def _user_process_count(uid: int) -> int:
    import psutil

    count = 0
    for p in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error, TypeError):
            count += p.info["uids"].real == uid
    return count


def _limit_child(limits: Limits, uid: int | None, nproc: int, workdir: str | None) -> None:
    """Runs in the child between fork and exec: cwd (while still privileged), rlimits, then the sandbox uid."""
    if workdir is not None:
        os.chdir(workdir)
    mib = MIB
    # CPU: SIGXCPU at the soft limit (reported as the CPU limit), SIGKILL a second later if it is ignored.
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    for res, value in ((resource.RLIMIT_AS, limits.memory_mb * mib), (resource.RLIMIT_FSIZE, limits.max_file_mb * mib),
                       (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        resource.setrlimit(res, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


_OWN_ROOT = (os.stat("/").st_dev, os.stat("/").st_ino)


def sandbox_tmp_usage(bwrap_pid: int) -> tuple[int, int] | None:
    """(entries, bytes) in the /tmp of the sandbox that ``bwrap_pid`` runs, seen through its first process's
    root (``/proc/<pid>/root``); None if it is not there (yet). Its size is bounded by ``--size``, its number of
    inodes (kernel memory, not counted by ``--size``) is not: a monitor counts it. Until that process has moved
    into the sandbox's root (a moment after it starts, longer on a busy machine), its root is this machine's, whose
    /tmp is not the sandbox's: None then too."""
    try:
        with open(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN
        import psutil

        try:
            children = [c.pid for c in psutil.Process(bwrap_pid).children()]
        except psutil.Error:
            return None
    if not children:
        return None
    try:
        root = os.stat(f"/proc/{children[0]}/root")
        if (root.st_dev, root.st_ino) == _OWN_ROOT:
            return None
        st = os.statvfs(f"/proc/{children[0]}/root/tmp")
    except OSError:
        return None
    return st.f_files - st.f_ffree - 1, (st.f_blocks - st.f_bfree) * st.f_frsize  # minus /tmp itself


#: errnos of a failed start that may pass: the host is short of processes, memory or file descriptors
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE}


async def _start(command: str, workdir: Path, limits: Limits, isolate: bool,
                 sandbox_uid: int | None) -> asyncio.subprocess.Process:
    """bash (in bwrap if ``isolate``) started under the limits, its output on a pipe; ``SandboxStartError`` if not."""
    if isolate:
        argv = bwrap_command(command, workdir, sandbox_uid, tmp_mb=limits.tmp_mb)
        cwd, env = None, _scrubbed_env(Path(SANDBOX_PATH))
    else:
        argv, cwd, env = ["/bin/bash", "--noprofile", "--norc", "-c", command], str(workdir), _scrubbed_env(workdir)
    # RLIMIT_NPROC counts every process of the uid: exact for a uid of its own, approximate otherwise.
    uid_for_count = sandbox_uid if sandbox_uid is not None else os.getuid()
    nproc = limits.max_processes + (0 if sandbox_uid is not None else _user_process_count(uid_for_count))
    what = "the bubblewrap sandbox" if isolate else "bash"
    try:
        return await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
            # bwrap as root drops to the sandbox uid itself (setpriv, after mounting); unisolated, the child does.
            preexec_fn=functools.partial(_limit_child, limits, None if isolate else sandbox_uid, nproc, cwd),
        )
    except OSError as exc:  # no such file, not executable, no processes or memory left
        reason = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        raise SandboxStartError(f"{what} could not be started ({reason})",
                                transient=exc.errno in _TRANSIENT_ERRNOS) from None
    except subprocess.SubprocessError as exc:  # the limits could not be applied in the child (preexec_fn)
        raise SandboxStartError(f"{what} could not be started: its limits could not be applied ({exc})",
                                transient=False) from None


@dataclass
class _Output:
    """A command's output as it is read, kept up to ``limit`` bytes (what is read by a timeout stays)."""

    limit: int
    chunks: list[bytes] = field(default_factory=list)
    kept: int = 0
    truncated: bool = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while data := await stream.read(65536):
            room = self.limit - self.kept
            if len(data) > room:
                self.truncated = True
                data = data[:max(room, 0)]
            if data:
                self.chunks.append(data)
                self.kept += len(data)


async def _watch(proc: asyncio.subprocess.Process, monitor: Callable[[int], Awaitable[str | None]],
                 monitor_interval_s: float) -> str | None:
    """Ask ``monitor`` about ``proc`` until it exits or the monitor gives a reason, which kills the command."""
    interval = monitor_interval_s
    while proc.returncode is None:
        await asyncio.sleep(interval)
        began = time.monotonic()
        try:
            reason = await monitor(proc.pid)
        except Exception:  # noqa: BLE001 - a monitor that fails does not stop the command (nor the watch)
            reason = None
        if reason is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            return reason
        interval = max(monitor_interval_s, 10 * (time.monotonic() - began))  # at most ~10% of the time
    return None


def _signal_name(code: int | None) -> str | None:
    """The signal that ended a process with exit ``code``, if one did."""
    if code is not None and code < 0:
        return signal.Signals(-code).name
    if code is not None and code > 128 and code - 128 in signal.valid_signals():
        return signal.Signals(code - 128).name  # bash and bwrap report a child's signal as 128+n
    return None


async def run_command(command: str, workdir: Path, limits: Limits, *, isolate: bool,
                      sandbox_uid: int | None, monitor: Callable[[int], Awaitable[str | None]] | None = None,
                      monitor_interval_s: float = 0.1) -> CommandResult:
    """Run ``command`` with bash in ``workdir`` under the limits; never raises for what the command does.

    ``monitor``, if given, is awaited with the pid of bwrap (or bash) every ``monitor_interval_s`` (or ten
    times its own last duration, if that is longer) while the command runs; a reason it returns kills the
    command (``stopped_by``).
    Raises ``SandboxStartError`` if the sandbox cannot be started."""
    if sandbox_uid is not None and not running_as_root():
        raise ValueError("sandbox_uid needs root")
    started = time.monotonic()
    proc = await _start(command, workdir, limits, isolate, sandbox_uid)
    assert proc.stdout is not None
    output = _Output(limits.max_output_bytes)
    watcher = asyncio.create_task(_watch(proc, monitor, monitor_interval_s)) if monitor is not None else None
    timed_out = False
    stopped_by: str | None = None
    try:
        await asyncio.wait_for(asyncio.gather(output.drain(proc.stdout), proc.wait()), timeout=limits.timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        if watcher is not None:
            watcher.cancel()  # a watch that has returned keeps its reason
            with contextlib.suppress(asyncio.CancelledError, Exception):
                stopped_by = await watcher
        # The wall-clock limit, a cancelled activity, or children left behind in the background: kill the
        # whole group (bwrap's sandbox and everything in its PID namespace die with it, --die-with-parent).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    if stopped_by is not None:
        timed_out = False
    return CommandResult(exit_code=None if timed_out else proc.returncode,
                         output=b"".join(output.chunks).decode(errors="replace"), truncated=output.truncated,
                         timed_out=timed_out, duration_s=time.monotonic() - started,
                         signal_name=_signal_name(proc.returncode), stopped_by=stopped_by)

"""Run one shell command isolated and limited: bubblewrap, rlimits, a time limit, truncated output.

Isolation (``bwrap``): new user, PID, network, IPC, UTS and cgroup
namespaces; the system (``/usr``) read-only, ``/`` read-only, a private
``/tmp``, no ``/etc`` and no home; the only writable host path is the
workspace, mounted at ``/workspace``; no network at all. The sandbox dies
with its parent (``--die-with-parent``): a killed worker takes its commands
with it.

Limits, enforced by the kernel: CPU seconds (``RLIMIT_CPU``), address space
(``RLIMIT_AS``), file size (``RLIMIT_FSIZE``), open files, and processes
(``RLIMIT_NPROC``). The kernel does not apply ``RLIMIT_NPROC`` to root, so
when this process is root the command runs as an unprivileged uid of its
own (``sandbox_uid``), which makes the process limit real and keeps the
command away from root-owned files even without bubblewrap. The wall-clock
limit kills the whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_PATH = "/workspace"
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
PROBE_UID = 2_099_999_999


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 30.0
    cpu_s: int = 20
    max_processes: int = 64
    memory_mb: int = 1024
    max_file_mb: int = 64
    max_output_bytes: int = 16384


@dataclass
class CommandResult:
    exit_code: int | None  # None: killed by the time limit
    output: str  # stdout and stderr interleaved, truncated to the limit
    truncated: bool
    timed_out: bool
    duration_s: float
    signal_name: str | None = None  # the signal that ended it (SIGXCPU: the CPU limit)

    def describe(self) -> str:
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
    """Whether bubblewrap can isolate a command here, and if not, why (cached per process)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bubblewrap (bwrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap"
    if running_as_root() and not os.access("/usr/bin/setpriv", os.X_OK):
        return False, "/usr/bin/setpriv (util-linux) is missing; it drops the sandbox to an unprivileged uid"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dah-bwrap-probe-") as probe_dir:
        uid = PROBE_UID if running_as_root() else None
        try:
            probe = subprocess.run(bwrap_command("true", Path(probe_dir), uid), capture_output=True, text=True,
                                   timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"bubblewrap at {exe} could not be started ({exc})"
    if probe.returncode != 0:
        return False, (f"bubblewrap at {exe} cannot create a sandbox here ({probe.stderr.strip()[:200]}); "
                       "it needs root or unprivileged user namespaces")
    return True, f"bubblewrap at {exe}"


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


def bwrap_command(command: str, workdir: Path, sandbox_uid: int | None) -> list[str]:
    """The bwrap argv. As root: no user namespace; inside the sandbox ``setpriv`` drops to ``sandbox_uid``
    with no capabilities (a real uid, so the kernel's process limit applies). Otherwise: a user namespace."""
    if sandbox_uid is not None:
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        drop = ["/usr/bin/setpriv", f"--reuid={sandbox_uid}", f"--regid={sandbox_uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    else:
        namespaces, drop = ["--unshare-all"], []
    return [
        "bwrap", *namespaces, "--die-with-parent", "--new-session",
        *_bwrap_system_args(),
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chmod", "1777", "/tmp",
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
    mib = 1024 * 1024
    # CPU: SIGXCPU at the soft limit (reported as the CPU limit), SIGKILL a second later if it is ignored.
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    for res, value in ((resource.RLIMIT_AS, limits.memory_mb * mib), (resource.RLIMIT_FSIZE, limits.max_file_mb * mib),
                       (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        resource.setrlimit(res, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


async def run_command(command: str, workdir: Path, limits: Limits, *, isolate: bool,
                      sandbox_uid: int | None) -> CommandResult:
    """Run ``command`` with bash in ``workdir`` under the limits; never raises for what the command does."""
    if sandbox_uid is not None and not running_as_root():
        raise ValueError("sandbox_uid needs root")
    if isolate:
        argv, cwd, env = bwrap_command(command, workdir, sandbox_uid), None, _scrubbed_env(Path(SANDBOX_PATH))
    else:
        argv, cwd, env = ["/bin/bash", "--noprofile", "--norc", "-c", command], str(workdir), _scrubbed_env(workdir)
    # RLIMIT_NPROC counts every process of the uid: exact for a uid of its own, approximate otherwise.
    uid_for_count = sandbox_uid if sandbox_uid is not None else os.getuid()
    nproc = limits.max_processes + (0 if sandbox_uid is not None else _user_process_count(uid_for_count))
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
        # bwrap as root drops to the sandbox uid itself (setpriv, after mounting); unisolated, the child does.
        preexec_fn=functools.partial(_limit_child, limits, None if isolate else sandbox_uid, nproc, cwd),
    )
    chunks: list[bytes] = []
    kept = 0
    truncated = False

    async def drain() -> None:
        nonlocal kept, truncated
        assert proc.stdout is not None
        while data := await proc.stdout.read(65536):
            room = limits.max_output_bytes - kept
            if len(data) > room:
                truncated = True
                data = data[:max(room, 0)]
            if data:
                chunks.append(data)
                kept += len(data)

    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(drain(), proc.wait()), timeout=limits.timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        # The wall-clock limit, a cancelled activity, or children left behind in the background: kill the
        # whole group (bwrap's sandbox and everything in its PID namespace die with it, --die-with-parent).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    code = proc.returncode
    sig = None
    if code is not None and code < 0:
        sig = signal.Signals(-code).name
    elif code is not None and code > 128 and code - 128 in signal.valid_signals():
        sig = signal.Signals(code - 128).name  # bash and bwrap report a child's signal as 128+n
    text = b"".join(chunks).decode(errors="replace")
    return CommandResult(exit_code=None if timed_out else code, output=text, truncated=truncated,
                         timed_out=timed_out, duration_s=time.monotonic() - started, signal_name=sig)

"""The Docker engine on this machine: use the one that answers, or start the installed ``dockerd`` and stop it after.

    engine = ensure_engine()        # None where no engine can run here; engine.reason says why
    ...
    engine.stop()                   # stops dockerd only if ensure_engine started it (also at exit;
                                    # stop_started_engines() where the process leaves by os._exit)

Nothing starts ``dockerd`` on a fresh machine (Debian's ``docker.io`` installs it but the harness's hosts often
have no init system), so the harness starts it itself when it is installed, this process is root and
``DOCKER_HOST`` names the default socket; it says so in one line on stderr and stops it (SIGTERM, then SIGKILL
after a grace period) when the run ends. An engine that was already running is used and left alone.

dockerd runs under a small supervisor (``python -m testbed.dockerd supervise OWNER``) that, when the harness's end
of a pipe closes, however the harness ended (a SIGKILL included), force-removes the harness's containers
(``testbed.containers.OWNER_LABEL``) and sends dockerd exactly one SIGTERM: dockerd then stops any other
containers and containerd. A parent-death signal straight to dockerd would not do: the kernel sends it again as
each of the dying harness's threads exits, and dockerd takes a third SIGTERM as "exit without cleanup", orphaning
its container shims.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.envs.docker_engine import DEFAULT_DOCKER_HOST, docker_engine_available, docker_host
from harness import own_module
from testbed.containers import OWNER, remove_owned
from testbed.processes import die_with_parent, spawn

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
_started: list[DockerDaemon] = []  # engines this process started, for stop_started_engines


@dataclass
class DockerDaemon:
    """The Docker engine this process uses: available or not (``reason`` says which), and whether we started it."""

    available: bool
    reason: str
    process: subprocess.Popen | None = field(default=None, repr=False)  # set only when we started dockerd
    log_path: Path | None = None

    @property
    def started_here(self) -> bool:
        return self.process is not None

    def stop(self) -> None:
        """Stop dockerd if this process started it (idempotent); an engine found running is left alone."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the supervisor's cue: SIGTERM to dockerd, which stops its containers and containerd
        try:
            proc.wait(STOP_TIMEOUT_S + 5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # its session: the supervisor, dockerd, containerd
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        self.available = False
        print(f"stopped the Docker engine this run started (dockerd's supervisor pid {proc.pid})", file=sys.stderr)


def ensure_engine(*, log_dir: Path | None = None) -> DockerDaemon:
    """An engine that answers: the running one, or ``dockerd`` started now (and stopped at exit). Never raises."""
    available, reason = docker_engine_available()
    if available:
        return DockerDaemon(True, reason)
    why_not = _cannot_start(reason)
    if why_not:
        return DockerDaemon(False, why_not)
    log_dir = log_dir or Path(tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    # A new file of ours (mkstemp: exclusive, 0600): a predictable name in a shared /tmp could be another user's link.
    fd, name = tempfile.mkstemp(prefix=f"dah-dockerd-{os.getpid()}-", suffix=".log", dir=log_dir)
    log_path = Path(name)
    with open(fd, "ab") as log:
        # Its own session: a Ctrl-C meant for the harness must not kill the engine under its containers. No
        # parent-death signal: the supervisor outlives us to stop dockerd cleanly; our end of its stdin is its cue.
        proc = spawn(own_module("testbed.dockerd", "supervise", OWNER), pdeathsig=0, stdout=log,
                     stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
    engine = DockerDaemon(False, "starting", process=proc, log_path=log_path)
    _started.append(engine)
    atexit.register(engine.stop)
    # Said when it happens, so the "stopped" line at the end has its "started" (even if it never answers)
    print(f"started the Docker engine (no engine was running; dockerd's supervisor pid {proc.pid}, log {log_path}); "
          "this run stops it when it ends", file=sys.stderr, flush=True)
    began = time.monotonic()
    deadline = began + START_TIMEOUT_S
    while time.monotonic() < deadline:
        available, reason = docker_engine_available()
        if available:
            engine.available, engine.reason = True, reason
            print(f"the Docker engine answers ({time.monotonic() - began:.1f} s after it started)", file=sys.stderr,
                  flush=True)
            return engine
        if proc.poll() is not None:  # e.g. another process's dockerd won the start: use that one if it answers
            engine.process = None
            available, reason = docker_engine_available()
            if available:
                engine.available, engine.reason = True, reason
                print(f"the Docker engine this run started exited (supervisor pid {proc.pid}); using the one that "
                      "answers instead (not this run's: it is left running)", file=sys.stderr, flush=True)
                return engine
            break
        time.sleep(0.2)
    engine.stop()
    tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
    engine.reason = (f"dockerd (supervisor pid {proc.pid}) did not come up within {START_TIMEOUT_S:g} s "
                     f"(exit {proc.returncode}); its log {log_path} ends: {' | '.join(tail)}")
    return engine


def _cannot_start(reason: str) -> str | None:
    """Why this process cannot start an engine (None if it can), given why none answered."""
    if docker_host() != DEFAULT_DOCKER_HOST:
        return f"{reason} (DOCKER_HOST names another engine, so none is started here)"
    if shutil.which("dockerd") is None:
        return f"{reason}; dockerd is not installed (as root on Debian: make system-deps, or apt-get install docker.io)"
    if os.geteuid() != 0:
        return f"{reason}; dockerd is installed but only root can start it (sudo dockerd &)"
    if "docker SDK not installed" in reason:
        return reason
    return None


def started_engines() -> list[DockerDaemon]:
    """The engines this process started and has not stopped yet."""
    return [engine for engine in _started if engine.started_here]


def stop_started_engines() -> None:
    """Stop every engine this process started: for entry points that leave through ``os._exit`` (no atexit)."""
    while _started:
        _started.pop().stop()


def _supervise(owner: str) -> int:
    """Run dockerd until our stdin closes (the harness stopped or died); then remove the containers ``owner``
    (that harness) left, at once, and SIGTERM dockerd once (it stops other containers in their grace time)."""
    import functools
    import selectors

    dockerd = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL,  # output: our stdout, the log
                               preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGTERM))
    sel = selectors.DefaultSelector()  # one thread: our death then sends dockerd a single SIGTERM
    sel.register(sys.stdin, selectors.EVENT_READ)
    while dockerd.poll() is None:
        if sel.select(timeout=0.5) and not os.read(sys.stdin.fileno(), 4096):
            break
    if dockerd.poll() is None:
        remove_owned(owner)
        dockerd.send_signal(signal.SIGTERM)
        try:
            dockerd.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(os.getpgid(0), signal.SIGKILL)  # dockerd, containerd, and us
    return dockerd.returncode or 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "supervise":
        raise SystemExit("usage: python -m testbed.dockerd supervise OWNER (started by the harness itself)")
    raise SystemExit(_supervise(sys.argv[2]))

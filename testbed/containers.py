"""Workers in containers, with the same fault surface as ``WorkerProcess``.

    with ContainerPool() as docker:
        with docker.worker(image="my-agent:dev", command=["python", "-m", "testbed", "worker",
                                                          "--identity", "{identity}"],
                           task_queue="q", network="dah-net") as w:
            w.kill()                  # SIGKILL the container: a crash, mid-whatever
            w.start()                 # a new container, a new identity
            w.pause(); w.resume()     # cgroup freezer: the container's SIGSTOP/SIGCONT
            w.disconnect_network()    # partition: the container leaves its network
            w.connect_network()       # heal

Everything goes through the docker SDK (``pip install 'docker>=7'``), imported
lazily so the rest of the harness works without it; the engine connection is
``agent.envs.docker_engine`` (shared with the ``browser_docker`` environment).
Images are never pulled: ``testbed.images`` builds the harness's worker image
locally (``python -m testbed.images build worker``), and ``testbed.dockerd``
starts an installed engine that is not running.
``ContainerPool.cleanup`` removes only containers this pool started (tracked by
id), never anything matched by name. A harness that dies without cleaning up
(SIGKILLed) leaves no container running either: every container carries this
process's owner label (``harness.owner``; a worker process's browser container
too), and a reaper started with the first container or worker process
(``python -m testbed.containers reap OWNER``, holding a pipe only we write to)
force-removes the containers with that label once the pipe closes, and the temporary directories that process
made for itself (``harness.owner.owned_tempdir``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.envs.docker_engine import connect, docker_host
from harness.faults import ENV_BUGS, ENV_CRASH_AT, ENV_MUTATIONS, NO_FAULTS, AgentFaults
from harness.owner import OWNER_LABEL, owner_value, remove_owned_dirs
from harness.commands import tool
from testbed.processes import ensure_reaper
from testbed.worker_process import WorkerStartError

log = logging.getLogger(__name__)

LABEL = "durable-agent-harness"  # every container we start carries this label key
IDENTITY_LABEL = f"{LABEL}.identity"
OWNER = owner_value()  # this process's value of OWNER_LABEL (pid and start time: a pid alone is reused)
STOP_GRACE_S = 15.0
# Docker's own rule for container names; the identity is part of the name.
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


def _process_alive(pid: int) -> bool:
    """Whether this host's process ``pid`` runs (a zombie does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class DockerWorker:
    """A worker in a container, with the same fault surface as WorkerProcess.

    Each ``start`` runs a new container (a new generation and identity). The
    identity reaches the container as env ``DAH_WORKER_IDENTITY`` (and the task
    queue as ``DAH_TASK_QUEUE``), and in the command wherever an element
    contains the placeholder ``{identity}`` (or ``{task_queue}``); nothing is
    appended to the command. ``start`` returns once the container's logs
    contain ``ready_line``. A killed container is kept (its logs stay readable)
    until the next ``start`` or ``stop`` removes it.
    """

    image: str
    command: list[str]
    task_queue: str
    network: str | None = None
    identity_prefix: str = "worker"
    environment: dict[str, str] = field(default_factory=dict)
    volumes: dict[str, str] = field(default_factory=dict)  # host path -> container path, bind-mounted read-write
    labels: dict[str, str] = field(default_factory=lambda: {LABEL: "worker"})
    start_timeout_s: float = 60.0
    ready_line: str = "READY"
    client: Any = field(default=None, repr=False)  # a docker.DockerClient; connected on first use if None
    # where each container's output is written when it is removed (``<identity>.log``, as a worker process's log)
    log_dir: Path | None = None
    generation: int = field(default=0, init=False)
    container_ids: list[str] = field(default_factory=list, init=False)  # every container started, all generations
    _container: Any = field(default=None, init=False, repr=False)
    _partitioned: bool = field(default=False, init=False, repr=False)
    _final_output: str = field(default="", init=False, repr=False)  # logs of the last removed container
    _stopped: list[int] = field(default_factory=list, init=False, repr=False)  # host pids SIGSTOPped by pause

    @property
    def identity(self) -> str:
        return f"{self.identity_prefix}-{self.generation}"

    @property
    def container_id(self) -> str | None:
        return self._container.id if self._container is not None else None

    @property
    def status(self) -> str | None:
        """Docker's state of the current container ("running", "paused", "exited", ...); None if there is none.
        When this host already sees the container's process gone (``alive``), waits up to 5 s for the engine to
        record the exit too, so ``status`` never says "running" of a worker ``alive`` calls dead."""
        if self._container is None:
            return None
        from docker.errors import NotFound

        pid = self._local_pid()
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self._container.reload()
            except NotFound:
                return None
            state = self._container.status
            if state not in ("running", "paused") or pid is None or _process_alive(pid) \
                    or time.monotonic() > deadline:
                return state
            time.sleep(0.05)

    @property
    def alive(self) -> bool:
        """Running or paused (a paused worker is frozen, not dead, like a SIGSTOPped process). Asked of this host's
        process table where the engine is local (no API round trip: the aimed faults ask it just before they
        freeze a worker); of the engine otherwise."""
        pid = self._local_pid()
        if pid is not None:
            return _process_alive(pid)
        return self.status in ("running", "paused")

    def exit_code(self, wait_s: float = 5.0) -> int | None:
        """The exit code of the current container, once the engine has recorded its exit (its process can be gone
        from this host a moment before); None if it is still running after ``wait_s`` or is gone."""
        if self._container is None:
            return None
        try:
            deadline = time.monotonic() + wait_s
            while True:
                self._container.reload()
                state = self._container.attrs.get("State", {})
                if state.get("Status") not in ("running", "paused"):
                    return state.get("ExitCode")
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        except Exception:  # the container is gone: its code is unknown
            return None

    def _local_pid(self) -> int | None:
        """The container's init as this host sees it, when the engine is local and this is root; else None."""
        if self._container is None or os.geteuid() != 0 or not docker_host().startswith("unix://"):
            return None
        if not self._container.attrs.get("State", {}).get("Pid"):
            from docker.errors import NotFound

            try:
                self._container.reload()
            except NotFound:
                return None
        pid = self._container.attrs.get("State", {}).get("Pid")
        return int(pid) if pid else None

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def container_spec(self) -> dict[str, Any]:
        """The keyword arguments for ``client.containers.run`` for the current generation (no Docker needed)."""
        if not _CONTAINER_NAME.match(self.identity):
            raise ValueError(
                f"identity_prefix {self.identity_prefix!r} makes identity {self.identity!r}, not a valid container "
                "name part; use letters, digits, '_', '.', '-' (starting with a letter or digit)"
            )
        # Plain replacement, not str.format: commands often hold code with literal braces.
        command = [
            str(arg).replace("{identity}", self.identity).replace("{task_queue}", self.task_queue)
            for arg in self.command
        ]
        spec: dict[str, Any] = {
            "image": self.image,
            "command": command,
            "name": f"dah-{self.identity}-{uuid.uuid4().hex[:6]}",
            "detach": True,
            "environment": {**self.environment, "DAH_WORKER_IDENTITY": self.identity, "DAH_TASK_QUEUE": self.task_queue},
            "labels": {LABEL: "worker", **self.labels, IDENTITY_LABEL: self.identity,
                       OWNER_LABEL: OWNER},
        }
        if self.network is not None:
            spec["network"] = self.network
        if self.volumes:
            spec["volumes"] = {host: {"bind": inside, "mode": "rw"} for host, inside in self.volumes.items()}
        return spec

    def _client(self) -> Any:
        if self.client is None:
            self.client = connect()
        return self.client

    def _ensure_network(self) -> None:
        from docker.errors import NotFound

        try:
            self._client().networks.get(self.network)
        except NotFound as e:
            raise WorkerStartError(
                f"docker network {self.network!r} does not exist; create it with `docker network create "
                f"{self.network}` or pass network=None"
            ) from e

    def _ensure_image(self) -> None:
        """The image must be on this engine already: nothing is pulled (no registry need be reachable)."""
        from docker.errors import ImageNotFound

        try:
            self._client().images.get(self.image)
        except ImageNotFound as e:
            raise WorkerStartError(
                f"docker image {self.image!r} is not on this engine (nothing is pulled); build the harness's worker "
                f"image with `{tool('testbed.images')} build worker`, or `docker build`/`docker load` {self.image!r}"
            ) from e

    def start(self) -> DockerWorker:
        """Run a new container (a new generation and identity); wait until its logs contain ready_line."""
        from docker.errors import APIError

        if self.alive:
            raise WorkerStartError(f"worker {self.identity} (container {self.container_id}) is still running")
        self._remove()  # the previous generation's container, if it was killed and kept
        if self.network is not None:
            self._ensure_network()
        self._ensure_image()
        self.generation += 1
        spec = self.container_spec()
        ensure_reaper()
        try:
            self._container = self._client().containers.run(**spec)
        except APIError as e:
            raise WorkerStartError(f"could not run worker {self.identity} from image {self.image!r}: {e}") from e
        self.container_ids.append(self._container.id)
        self._partitioned = False
        self._final_output = ""
        log.info("worker %s: container %s (%s) started", self.identity, spec["name"], self._container.id[:12])
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            text = self.output()
            if self.ready_line in text:
                log.info("worker %s ready (container %s)", self.identity, self._container.id[:12])
                return self
            if not self.alive:
                code = self.exit_code()  # once the engine has recorded the exit, it has all of the output too
                text = self.output()
                self._remove()
                raise WorkerStartError(f"worker {self.identity} exited with {code}: {text[-2000:]}")
            time.sleep(0.1)
        text = self.output()
        self.stop()
        raise WorkerStartError(
            f"worker {self.identity} did not log {self.ready_line!r} within {self.start_timeout_s} s: {text[-2000:]}"
        )

    def output(self) -> str:
        """The current container's logs (stdout and stderr); after ``stop``, the logs it had when removed."""
        if self._container is None:
            return self._final_output
        from docker.errors import NotFound

        try:
            return self._container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
        except NotFound:
            return self._final_output

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-step; nothing of it runs any more. The container is kept."""
        from docker.errors import APIError

        if not self.alive:
            return
        try:
            self._container.kill(signal="SIGKILL")
        except APIError as e:
            # Old engines refuse to signal a frozen container; thaw it and kill at once.
            if self.status != "paused":
                raise
            log.warning("worker %s: engine refused to kill a paused container (%s); unpausing to kill", self.identity, e)
            self._container.unpause()
            self._container.kill(signal="SIGKILL")
        deadline = time.monotonic() + 10.0
        while self.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stopped = []  # SIGKILL ends stopped processes too
        log.info("worker %s killed (container %s: %s)", self.identity, self.container_id[:12], self.status)

    def terminate(self) -> None:
        """SIGTERM, as ``docker stop`` sends first: a graceful stop (the reference worker drains); returns at once,
        the container exits when its process does. A no-op unless it is running."""
        if self.status == "running":
            self._container.kill(signal="SIGTERM")
            log.info("worker %s signalled SIGTERM", self.identity)

    def pause(self) -> None:
        """Freeze every process of the container; a no-op unless it is running. Where the engine runs on this
        host and this process may signal the container's processes (root), SIGSTOP to each of them from here, as
        a process worker is frozen, at once; otherwise the engine's cgroup freezer (``docker pause``), which
        takes an API round trip or two (tens of milliseconds) and can miss a short tool call."""
        if self._stopped:
            return
        pids = self._host_processes()
        if pids:
            stopped = []
            for pid in pids:  # the container's init first: it cannot start a process it has not started yet
                try:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
            self._stopped = stopped
            self._wait_stopped(stopped)
            log.info("worker %s paused (SIGSTOP to %d process(es))", self.identity, len(stopped))
        elif self.status == "running":
            self._container.pause()
            log.info("worker %s paused", self.identity)

    def resume(self) -> None:
        """Thaw a paused container; a no-op if it is not paused."""
        if self._stopped:
            for pid in self._stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self._stopped = []
            log.info("worker %s resumed (SIGCONT)", self.identity)
        elif self.status == "paused":
            self._container.unpause()
            log.info("worker %s resumed", self.identity)

    @staticmethod
    def _wait_stopped(pids: list[int], timeout_s: float = 0.5) -> None:
        """Until the kernel shows each process stopped (a signal is delivered asynchronously: microseconds, more
        on a loaded machine), so that what the caller reads next is read of a frozen worker."""
        import psutil

        deadline = time.monotonic() + timeout_s
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    if psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                        break
                except psutil.Error:
                    break
                time.sleep(0.0005)

    @property
    def frozen(self) -> bool:
        """Paused by ``pause``: SIGSTOPped from here, or frozen by the engine."""
        return bool(self._stopped) or self.status == "paused"

    def _host_processes(self) -> list[int]:
        """The container's processes as this host sees them (its init first), when the engine is local and this
        process may signal them; [] otherwise (a remote or rootless engine: the engine freezes them instead)."""
        import psutil

        try:
            pid = self._local_pid()
            if pid is None:
                return []
            init = psutil.Process(pid)
            if init.status() == psutil.STATUS_ZOMBIE:
                return []
            return [init.pid, *(c.pid for c in init.children(recursive=True))]
        except (psutil.Error, OSError, ValueError) as e:
            log.info("worker %s: cannot signal its processes from here (%s); using the engine's freezer",
                     self.identity, e)
            return []

    def disconnect_network(self) -> None:
        """Partition: take the container off ``network`` (its only network), so it reaches nothing."""
        if self.network is None:
            raise ValueError(f"worker {self.identity} has no network to partition; pass network=<a user-created network>")
        if self._container is None or self._partitioned:
            return
        self._client().networks.get(self.network).disconnect(self._container, force=True)
        self._partitioned = True
        log.info("worker %s disconnected from network %s", self.identity, self.network)

    def connect_network(self) -> None:
        """Heal a partition made by ``disconnect_network``; a no-op if the worker is not partitioned."""
        if self.network is None:
            raise ValueError(f"worker {self.identity} has no network to heal; pass network=<a user-created network>")
        if self._container is None or not self._partitioned:
            return
        self._client().networks.get(self.network).connect(self._container)
        self._partitioned = False
        log.info("worker %s reconnected to network %s", self.identity, self.network)

    def stop(self) -> None:
        """Graceful: SIGTERM, up to 15 s for the worker to shut down (then SIGKILL), then remove. Idempotent."""
        if self._container is None:
            return
        from docker.errors import NotFound

        self.resume()  # a frozen container cannot handle SIGTERM
        if self.alive:
            try:
                self._container.stop(timeout=int(STOP_GRACE_S))
            except NotFound:
                pass
        self._remove()

    def _remove(self) -> None:
        """Force-remove the current container, keeping its logs for ``output``."""
        if self._container is None:
            return
        from docker.errors import NotFound

        self._final_output = self.output()
        self._save_log()
        try:
            self._container.remove(force=True)
            log.info("worker %s: container %s removed", self.identity, self._container.id[:12])
        except NotFound:
            pass
        self._container = None
        self._partitioned = False
        self._stopped = []

    def _save_log(self) -> None:
        """Keep the container's output beside the run's other logs: it is the evidence of what that worker did."""
        if self.log_dir is None or not self._final_output:
            return
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / f"{self.identity}.log").write_text(self._final_output)
        except OSError as e:
            log.warning("worker %s: could not write its log to %s (%s)", self.identity, self.log_dir, e)

    def forget_container(self) -> None:
        """Drop the handle on a container someone else removed (``ContainerPool.cleanup``)."""
        self._container = None
        self._partitioned = False

    def __enter__(self) -> DockerWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ContainerPool:
    """Creates DockerWorkers; one place to check the engine and to clean up everything labelled as ours.

    ``cleanup`` force-removes only containers that workers of this pool
    started (tracked by id) and that carry our label; containers of other
    runs, or of other pools in the same run, are left alone.
    """

    def __init__(self, client: Any = None) -> None:
        self._client = client
        self._owns_client = client is None
        self._workers: list[DockerWorker] = []

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect()
        return self._client

    def worker(self, **kwargs: Any) -> DockerWorker:
        """A DockerWorker (not started) using this backend's engine; kwargs are DockerWorker's fields."""
        w = DockerWorker(client=self.client, **kwargs)
        self._workers.append(w)
        return w

    def tracked_container_ids(self) -> list[str]:
        return [cid for w in self._workers for cid in w.container_ids]

    def cleanup(self) -> int:
        """Force-remove every container our workers started that still exists; returns how many were removed."""
        ids = self.tracked_container_ids()
        if not ids:
            return 0
        from docker.errors import DockerException, NotFound

        removed = 0
        for w in self._workers:  # the current containers first, through their workers: their logs are kept
            if w.container_id is None:
                continue
            try:
                w._remove()
                removed += 1
            except DockerException as e:
                log.warning("worker %s: could not remove its container (%s); removing by id", w.identity, e)

        for cid in ids:
            try:
                container = self.client.containers.get(cid)
            except NotFound:
                continue
            if LABEL not in (container.labels or {}):
                log.warning("container %s lost our label %r; leaving it alone", cid[:12], LABEL)
                continue
            try:
                container.remove(force=True)
            except NotFound:
                continue
            removed += 1
            log.info("cleanup: removed container %s", cid[:12])
        for w in self._workers:
            w.forget_container()
        return removed

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> ContainerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.cleanup()
        finally:
            self.close()


@dataclass
class ContainerWorker:
    """A ``DockerWorker`` with the surface the cluster's supervisor and nemeses use on a ``WorkerProcess``.

    Containers run on the host network so they reach the fault proxies on 127.0.0.1; the image must contain
    this project (``testbed.images.worker_image``) or the target's own worker. The chaos backend bind-mounts
    the run's state dir into each container at the same path, so what the tools write and the effect ledger
    outlive a killed container and the checkers read them as they do a process worker's.
    """

    worker: DockerWorker
    faults: AgentFaults = NO_FAULTS  # handed to the container through its environment (harness.faults)
    warm_line: str | None = None  # after the ready line, wait for this too (the model client is loaded)

    @property
    def identity_prefix(self) -> str:
        return self.worker.identity_prefix

    @property
    def identity(self) -> str:
        return self.worker.identity

    @property
    def polling_identity(self) -> str:
        """The identity the server sees: a container's worker is given ``{identity}`` (and $DAH_WORKER_IDENTITY)."""
        return self.worker.identity

    @property
    def alive(self) -> bool:
        return self.worker.alive

    @property
    def returncode(self) -> int | None:
        if self.worker.alive or self.worker._container is None:
            return None
        return self.worker.exit_code()

    def start(self, *, faults: AgentFaults | None = None) -> ContainerWorker:
        if faults is not None:
            self.faults = faults
        for name in (ENV_CRASH_AT, ENV_BUGS, ENV_MUTATIONS):
            self.worker.environment.pop(name, None)
        self.worker.environment.update(self.faults.environment())
        self.worker.start()
        if self.warm_line and self.worker.generation == 1 and not self.wait_for(self.warm_line, 90.0):
            raise WorkerStartError(f"worker {self.identity} did not print {self.warm_line!r} within 90 s: "
                                   f"{self.output()[-2000:]}")
        return self

    def wait_for(self, text: str, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.worker.output():
                return True
            if not self.worker.alive:  # gone: its last words, once the engine has recorded the exit
                self.worker.exit_code()
                return text in self.worker.output()
            time.sleep(0.1)
        return False

    def output(self) -> str:
        return self.worker.output()

    def kill(self) -> None:
        self.worker.kill()

    def terminate(self) -> None:
        self.worker.terminate()

    def pause(self) -> None:
        self.worker.pause()

    def resume(self) -> None:
        self.worker.resume()

    def stop(self) -> None:
        self.worker.stop()


def remove_owned(owner: str) -> None:
    """Force-remove the containers labelled as started by ``owner`` (a dead harness's), on the engine that answers."""
    host = docker_host()
    if host.startswith("unix://") and not os.path.exists(host[len("unix://"):]):
        return  # no engine here: nothing of ours can run on it (and no connection attempt to wait out)
    try:
        client = connect(timeout_s=10.0)
    except Exception:  # noqa: BLE001 - no engine: nothing of ours runs on it
        return
    try:
        for container in client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner}"}):
            try:
                container.remove(force=True)
            except Exception as exc:  # noqa: BLE001 - the next one still goes
                log.warning("could not remove container %s: %s", container.short_id, exc)
    finally:
        client.close()


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "reap":
        raise SystemExit("usage: python -m testbed.containers reap OWNER (started by the harness itself)")
    sys.stdin.buffer.read()  # until the harness's end closes: it exited, however
    remove_owned(sys.argv[2])
    remove_owned_dirs(sys.argv[2])

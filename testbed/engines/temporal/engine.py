"""The reference agent on Temporal: the embedded server (with a database file, so it can be killed and
restarted), the scripted model, fault proxies on the worker->Temporal and worker->model links, and worker
processes (or Docker containers) under a supervisor.

    Temporal server (db file) <-- proxy "temporal" <-- worker-1..N --> proxy "model" --> scripted model
                                                           |
                                                           +--> effects service (testbed.effects_service)

Workers reach Temporal and the model only through the proxies, so network faults land on exactly the links
that matter; the driver talks to Temporal directly. The effects service (what the agent's tools call: ``{effects_url}``,
``$DAH_EFFECTS_URL``) is reached directly and logs to ``<run dir>/effects_service.jsonl``; for a target whose
effects are ``service``, the scenario's ``after_effect`` crash point is the service's crash-after-effect fault
(it applies the effect, then the harness kills the calling worker before the response returns) instead of the
worker's own ``DAH_CRASH_AT``.

In this process (``dah run``, ``dah demo``: ``in_process``): the server and one worker here (``session.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.event_history import RunRecord, fetch_run, fetch_tree, save_histories
from harness.faults import AgentFaults
from harness.operations import OperationLog
from harness.recording import ENV_LEDGER
from harness.rundir import EFFECTS_SERVICE, RunDir
from testbed.engines import SessionSpec
from testbed.engines.base import Engine, Scenario, Session
from testbed.engines.workload import TIMEOUTS, chaos_agent_config
from testbed.engines.temporal.cluster import TemporalCluster
from testbed.engines.temporal.connection import TemporalConnection
from testbed.engines.temporal.driver import Driver
from testbed.engines.temporal.in_flight import TemporalInFlight
from testbed.effects_service import ENV_EFFECTS_URL
from testbed.faults.effects import EffectFault
from testbed.model_server import LatencyModel
from testbed.stack import Endpoints, Stack, StackSpec
from testbed.worker_process import WorkerProcess

#: the dynamic config that makes the server suggest continue-as-new past this many history events
SUGGEST_CONTINUE_AS_NEW = "limit.historyCount.suggestContinueAsNew"


@dataclass
class ReferenceOnTemporal(Engine):
    name: str = "temporal"
    workers: str = "process"  # or "docker": every worker in a container of ``image`` (host network)
    image: str | None = None
    _pollers: Any = field(default=None, init=False, repr=False)  # the readiness check, when there is no ready line
    _server_address: str = field(default="", init=False, repr=False)
    environments = True
    walkthroughs = True
    workflow_tools = True

    def own_cluster_because(self) -> str | None:
        """Only the reference agent's worker processes on the embedded server take the task queue each run is given
        there; None: this engine's runs can share a warm server."""
        if not self.target.is_reference:
            return "not the reference agent on Temporal"
        if self.external:
            return "an external cluster"
        return "workers in containers" if self.workers != "process" else None

    def record(self) -> dict[str, Any]:
        return {**super().record(), "workers": self.workers, "image": self.image}

    def in_process(self, spec: SessionSpec) -> contextlib.AbstractAsyncContextManager[Session]:
        from testbed.engines.temporal.session import in_process

        return in_process(self.connection, spec)

    def reproduce(self) -> dict[str, Any]:
        docker = {"--placement": "docker", "--image": self.image} if self.workers == "docker" else {}
        return {**super().reproduce(), **docker}

    def stack_spec(self, scenario: Scenario, run: RunDir, seed: int, oplog: OperationLog, ui: bool) -> StackSpec:
        # an external cluster: no server here, the workers' link to it goes through the proxy; the embedded server
        # is killed at the end, not stopped: the run saves its histories before the stack ends
        cluster = TemporalCluster(self.connection if self.external else TemporalConnection(),
                                  db=run.state / "temporal.db", ui=ui, quiet=True, kill_at_exit=True)
        spec = StackSpec(state_dir=run.state, logs_dir=run.logs, engine=cluster,
                         model_latency=LatencyModel.parse(scenario.cluster.model_latency),
                         seed=seed, proxies=True, worker_processes=scenario.cluster.workers, oplog=oplog,
                         task_queue=self.task_queue(scenario))
        if self.target.address:  # its workers hard-code where Temporal is: the fault proxy goes there
            spec.server_proxy_port = int(self.target.address.rpartition(":")[2])
        if self.target.continue_as_new_suggested and scenario.max_history_events and not self.external:
            # the agent continues as new when Temporal suggests it: the server suggests it past the scenario's
            # threshold (by default only past 4096 events, which no run reaches)
            cluster.dynamic_config[SUGGEST_CONTINUE_AS_NEW] = str(scenario.max_history_events)
        spec.effects_log = run.path / EFFECTS_SERVICE
        task_queue, faults = spec.task_queue, scenario.cluster.faults
        if self.effects_seen_by_service and "after_effect" in faults.crash_at:
            # Once per run, as a worker's own crash point fires once per ledger: the restarted worker finishes.
            spec.effects_faults = [EffectFault("crash_after_effect", count=1)]
            faults = AgentFaults(faults.crash_at - {"after_effect"}, faults.bugs, faults.mutations)
        self._pollers = None
        if self.target.ready_line is None:  # ready once the server lists the worker polling
            from testbed.worker_process import TaskQueuePollers

            pollers = TaskQueuePollers(lambda: cluster.connection.connect(self._server_address or None),
                                       cluster.namespace, task_queue)
            spec.cleanup.append(pollers.close)
            self._pollers = pollers
        if self.workers == "docker":
            from testbed.containers import ContainerPool

            pool = ContainerPool()
            spec.cleanup.append(pool.close)
            spec.cleanup.append(pool.cleanup)
            spec.make_worker = lambda name, at: self._container(pool, name, at, spec.task_queue, faults, run, scenario)
        else:  # the spec's queue when the worker starts: a cluster shared by runs gives each run a queue of its own
            spec.make_worker = lambda name, at: self._process(name, at, spec.task_queue, faults, run, scenario)
        return spec

    @property
    def effects_seen_by_service(self) -> bool:
        """The target's tools call the effects service (``effects = "service"``): its faults come from there."""
        return getattr(self.target, "effects", None) == "service"

    def worker_values(self, at: Endpoints, task_queue: str, state_dir: str, scenario: Scenario) -> dict[str, str]:
        values = {"address": at.address, "namespace": at.namespace, "task_queue": task_queue,
                  "model_url": at.model_url, "state_dir": state_dir, "effects_url": at.effects_url,
                  "sticky_timeout": f"{TIMEOUTS[scenario.timeouts].sticky_timeout_s:g}",
                  "heartbeat_throttle": f"{TIMEOUTS[scenario.timeouts].heartbeat_throttle_s:g}"}
        if self.target.ledger:
            values["ledger"] = str(Path(state_dir) / self.target.ledger)
        return values

    def worker_command(self, scenario: Scenario) -> tuple[str, ...]:
        """The target's worker template; the reference's registers a replacement workflow if the scenario asks."""
        if self.target.is_reference and scenario.cluster.workflow:
            return (*self.target.worker, "--workflow", scenario.cluster.workflow)
        return self.target.worker

    def worker_env(self, values: dict[str, str], at: Endpoints | None = None) -> dict[str, str]:
        env = {**(at.env if at else {}), **self.target.env}  # the connection (TLS, API key), then the target's
        if "ledger" in values:
            env[ENV_LEDGER] = values["ledger"]  # where harness.recording.EffectLedger.from_environment() writes
        if values.get("effects_url"):
            env[ENV_EFFECTS_URL] = values["effects_url"]
        return env

    def _process(self, name: str, at: Endpoints, task_queue: str, faults: Any, run: RunDir,
                 scenario: Scenario) -> WorkerProcess:
        values = {"python": self.target.interpreter, **self.worker_values(at, task_queue, str(run.state), scenario)}
        self._server_address = at.server  # what the readiness check asks (the server itself, not the proxy)
        return WorkerProcess(self.worker_command(scenario), values, identity_prefix=name,
                             ready_line=self.target.ready_line,
                             ready_check=self._pollers.polling if self._pollers is not None else None,
                             warm_line=self.target.warm_line, faults=faults,
                             cwd=self.target.cwd, env=self.worker_env(values, at), log_dir=run.logs,
                             start_timeout_s=self.target.ready_timeout_s)

    def _container(self, pool: Any, name: str, at: Endpoints, task_queue: str, faults: Any, run: RunDir,
                   scenario: Scenario) -> Any:
        """A worker in a container on the host network, with the run's state dir bind-mounted at the same path:
        what its tools write and its effect ledger outlive the container, as a process worker's do."""
        from testbed.containers import ContainerWorker
        from testbed.worker_process import fill

        if not self.image:
            raise RuntimeError("the docker workers need an image with the worker installed (--image NAME)")
        if self.target.ready_line is None:
            raise RuntimeError("docker workers are ready when they print a line: give the target a ready_line")
        state = str(run.state.resolve())
        values = {"python": "python", **self.worker_values(at, task_queue, state, scenario)}
        command = fill(self.worker_command(scenario), {k: v for k, v in values.items() if k != "identity"})
        worker = pool.worker(image=self.image, command=command, task_queue=task_queue, network="host",
                             identity_prefix=name, ready_line=self.target.ready_line,
                             start_timeout_s=self.target.ready_timeout_s, environment=self.worker_env(values, at),
                             volumes={state: state}, log_dir=run.logs)
        return ContainerWorker(worker, faults, warm_line=self.target.warm_line)

    def make_driver(self, stack: Stack, oplog: OperationLog, scenario: Scenario, seed: int) -> Any:
        timeouts = TIMEOUTS[scenario.timeouts]
        driver = Driver(client=stack.client, history=oplog, task_queue=stack.spec.task_queue,
                        workload=scenario.workload, seed=seed, config=chaos_agent_config(scenario.timeouts),
                        workflow_task_timeout_s=timeouts.workflow_task_timeout_s)
        driver.config.local_tools = list(scenario.local_tools)
        driver.config.local_model = scenario.local_model
        if scenario.planning_max_attempts:
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        if scenario.max_history_events:
            driver.config.max_history_events = scenario.max_history_events  # continue-as-new past this many events
        return driver

    async def latest_runs(self, stack: Stack, driver: Any) -> list[RunRecord] | None:
        """Each conversation's latest run as the server holds it now (None: a target whose histories do not apply)."""
        if stack.client is None or "temporal_history" in self.not_applicable:
            return None

        async def one(wid: str) -> RunRecord | None:
            try:
                return await fetch_run(stack.client, wid)
            except Exception:  # never started (or gone): nothing pending
                return None

        runs = await asyncio.gather(*(one(wid) for wid in driver.workflow_ids))
        return [r for r in runs if r is not None]

    async def run_tree(self, stack: Stack, run_id: str) -> dict[str, list[RunRecord]] | None:
        """Run ``run_id`` and the children it started as the server's event histories hold them (which worker ran
        each workflow task and activity: ``harness.event_history.fetch_tree``); None: this engine keeps none."""
        if stack.client is None or "temporal_history" in self.not_applicable:
            return None
        return await fetch_tree(stack.client, run_id)

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        """Every conversation's event histories (what temporal_history and replay read)."""
        if stack.client is not None:
            await save_histories(stack.client, driver.workflow_ids, run.event_histories)

    def aiming(self, stack: Stack, driver: Any) -> dict[str, Any]:
        """What aimed kills read: the effect ledger (workers share the run's state dir with this process; a
        container has it bind-mounted) and the conversations' continue-as-new threshold: the scenario's, where this
        harness configures the agent (the reference's driver config), else the target file's
        ``continue_as_new_events`` (a target's agent continues as new by its own rule), or the threshold the server
        was told to suggest it at (``continue_as_new_suggested``); 0: unknown, and a kill aimed before a
        continue-as-new is recorded as not injected."""
        config = getattr(driver, "config", None)
        cluster = getattr(getattr(stack, "spec", None), "engine", None)
        suggested = int(getattr(cluster, "dynamic_config", {}).get(SUGGEST_CONTINUE_AS_NEW, 0))
        return {"observer": TemporalInFlight(),
                "ledger": stack.spec.state_dir / self.target.ledger if self.target.ledger else None,
                "continue_as_new_events": getattr(config, "max_history_events", 0)
                or self.target.continue_as_new_events or suggested}

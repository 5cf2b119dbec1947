"""The chaos scenarios against the checkpoint backend: the same load, faults and checkers, no Temporal.

    python -m chaos run kill_mid_turn --durability checkpoint
    python -m chaos run model_outage --durability checkpoint

The cluster is the scripted model server and N checkpoint worker processes
(``dah checkpoint worker``) sharing one SQLite file; the client is
the same seeded workload (arithmetic and non-idempotent appends), each
message a one-shot run submitted to the checkpoint queue, the messages of a
conversation sharing its workspace. The faults are the same nemeses: a
SIGKILL of the worker holding a run whose model call is in flight (its runs
are resumed by another worker once its lease expires), and the model API
refusing requests.

The checkers are the same: ``lost`` (every acknowledged message answered
exactly once and correctly; every conversation's append file exact),
``effects`` (the effect ledger: no effect applied twice), ``injection_evidence``
(the kill left an unfinished execution in the ledger; the outage refused
requests) and ``stats``. ``temporal_history`` and ``replay`` read Temporal
event histories, which this backend does not have: they are reported as
``not_applicable`` with the reason, which is neither a pass nor counted in
the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.checkpoint.agent_task import TASK, manifest_for
from agent.checkpoint.service import CheckpointQueue
from agent.checkpoint.stores import SqliteStore
from harness.faults import FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from testbed.processes import python_module_command, spawn, stop
from testbed.scripted_routes import respond
from harness.verdict import NOT_APPLICABLE, CheckResult
from chaos.client import Conversation, Driver
from chaos.cluster import ClusterSpec
from harness.operations import FAIL, INFO, OK, History

#: scenarios that have a checkpoint twin (the others fault Temporal itself or its links)
from chaos.cli import CHECKPOINT_SCENARIOS  # noqa: E402  (one list, kept where the CLI can read it cheaply)
CHECKERS = ["lost", "effects", "injection_evidence", "stats"]
LEASE_MS = 2000
ROOT = Path(__file__).resolve().parent.parent


def not_applicable() -> list[CheckResult]:
    why = ("reads Temporal event histories; the checkpoint backend has none (its runs are checked by lost, effects "
           "and injection_evidence)")
    return [CheckResult("temporal_history", NOT_APPLICABLE, f"not applicable: {why}"),
            CheckResult("replay", NOT_APPLICABLE, f"not applicable: {why}")]


@dataclass
class CheckpointWorkerProcess:
    name: str
    db: Path
    state_dir: Path
    model_url: str
    log_dir: Path
    generation: int = 0
    proc: subprocess.Popen | None = None

    @property
    def identity(self) -> str:
        return f"{self.name}-{self.generation}"

    def start(self, ready: str = "READY") -> None:
        """Start a new generation; return once its log shows ``ready`` (``WARM``: its model client is loaded)."""
        self.generation += 1
        log = self.log_dir / f"{self.identity}.log"
        with open(log, "wb") as out:
            self.proc = spawn(python_module_command(
                "testbed", "checkpoint", "worker", "--db", str(self.db), "--state-dir", str(self.state_dir),
                "--identity", self.identity, "--lease-ms", str(LEASE_MS), "--model-base-url", self.model_url),
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 60
        while ready not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"checkpoint worker {self.identity} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace_s=5)


class CheckpointCluster:
    """The scripted model server and checkpoint workers on one SQLite file (no Temporal, no proxies)."""

    def __init__(self, run_dir: Path, spec: ClusterSpec, history: History) -> None:
        self.run_dir = run_dir
        self.spec = spec
        self.history = history
        self.model = ScriptedModelServer(respond, latency=LatencyModel.parse(spec.model_latency), seed=spec.seed)
        self.workers: list[CheckpointWorkerProcess] = []

    @property
    def db(self) -> Path:
        return self.run_dir / "state" / "checkpoint.sqlite3"

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "state" / "sandbox" / "ledger.sqlite3"

    def start(self) -> CheckpointCluster:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.db.parent.mkdir(parents=True, exist_ok=True)
        asyncio.run(SqliteStore(self.db).close())  # tables exist before workers and client open the file
        self.model.start()
        self.workers = [CheckpointWorkerProcess(f"w{i}", self.db, self.run_dir / "state", self.model.url,
                                             self.run_dir / "logs") for i in range(1, self.spec.workers + 1)]
        # Side by side, and the load starts once every model client is loaded (as for the Temporal workers).
        with ThreadPoolExecutor(len(self.workers)) as pool:
            list(pool.map(lambda w: w.start(ready="WARM"), self.workers))
        return self

    def set_model_faults(self, rules: list[FaultRule]) -> None:
        self.model.set_faults(rules)

    def heal(self) -> None:
        self.model.set_faults([])
        for w in self.workers:
            if w.proc is None or w.proc.poll() is not None:
                w.start()

    def stop(self) -> None:
        for w in self.workers:
            w.kill()
        self.model.stop()


def _busy_workers(cluster: CheckpointCluster, activity: str | None) -> dict[str, list[dict[str, Any]]]:
    """Worker identity -> its unfinished executions in the ledger (model calls or tools in flight)."""
    if not cluster.ledger_path.exists():
        return {}
    db = sqlite3.connect(f"file:{cluster.ledger_path}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT worker, workflow_id, tool, attempt FROM executions WHERE finished_at IS NULL"
                          ).fetchall()
    finally:
        db.close()
    out: dict[str, list[dict[str, Any]]] = {}
    for worker, run_id, tool, attempt in rows:
        if activity is None or tool == activity:
            out.setdefault(worker, []).append({"run_id": run_id, "activity": tool, "attempt": attempt})
    return out


async def kill_worker(ctx: Any, when: str = "busy", activity: str | None = "model", down_s: float = 1.0,
                      wait_s: float = 10.0) -> dict[str, Any]:
    """SIGKILL the checkpoint worker with a model call (or any work) in flight; restart it after ``down_s``."""
    cluster: CheckpointCluster = ctx.cluster
    wanted = "plan_next_action" if activity == "model" else activity
    op = ctx.history.invoke("nemesis", "kill_worker", {"when": when, "activity": activity, "down_s": down_s})
    deadline = time.monotonic() + wait_s
    victim, evidence = None, []
    while time.monotonic() < deadline:
        busy = await asyncio.to_thread(_busy_workers, cluster, wanted)
        candidates = [w for w in cluster.workers if w.identity in busy]
        if candidates:
            victim = ctx.rng.choice(candidates)
            evidence = busy[victim.identity]
            break
        await asyncio.sleep(0.02)
    if victim is None:
        victim = ctx.rng.choice(cluster.workers)
    identity = victim.identity
    await asyncio.to_thread(victim.kill)
    value = {"identity": identity, "evidence": evidence}
    ctx.history.complete(op, OK, value)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(victim.start)
    ctx.history.event("supervisor", "restart_worker", {"worker": victim.name, "identity": victim.identity,
                                                       "reason": "nemesis kill"})
    return value


@dataclass
class CheckpointDriver(Driver):
    """The chaos client on the checkpoint backend: the same seeded messages, each a one-shot run submitted to the
    checkpoint queue (``client`` and ``task_queue`` are unused)."""

    db: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.config.tools = [t for t in self.config.tools if t not in ("spawn", "wait", "run_ptc")]
        self._runs: dict[str, list[str]] = {c.workflow_id: [] for c in self.conversations}
        assert self.db is not None, "CheckpointDriver needs db (the checkpoint backend's SQLite file)"
        self.queue = CheckpointQueue(self.db)

    async def _drive(self, i: int, conv: Conversation) -> None:
        process = f"client-{i}"
        rng = random.Random(f"{self.seed}-{i}")
        conv.started = True
        async for n, msg in self._messages(conv, rng):
            run_id = f"{conv.workflow_id}-msg-{n}"
            self._runs[conv.workflow_id].append(run_id)
            op = self.history.invoke(process, "send_message", {"conversation": conv.workflow_id, "n": n,
                                                               "text": msg.text, "expect": msg.expect,
                                                               "match": msg.match, "run_id": run_id})
            try:
                self.queue.submit(run_id, TASK, manifest_for(self.config, msg.text, workspace=conv.workflow_id))
                result = await self.queue.wait(run_id, timeout_s=self.workload.op_timeout_s)
                self.history.complete(op, OK, {"reply": result["reply"], "turn": n + 1})
            except RuntimeError as exc:  # the run failed (a step gave up)
                self.history.complete(op, FAIL, error=str(exc))
            except Exception as exc:  # timed out: processed or not, nobody knows yet
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    async def finish(self, timeout_s: float = 60.0) -> None:
        """Wait for every submitted run, then read each conversation back from the queue (the final read)."""
        for i, conv in enumerate(self.conversations):
            op = self.history.invoke(f"client-{i}", "read_conversation", {"conversation": conv.workflow_id})
            deadline = time.monotonic() + timeout_s
            outcomes = {}
            while time.monotonic() < deadline:
                outcomes = {r: self.queue.outcome(r) for r in self._runs[conv.workflow_id]}
                if all(o is not None and o[0] != "queued" for o in outcomes.values()):
                    break
                await asyncio.sleep(0.05)
            messages: list[dict[str, Any]] = []
            done = True
            for run_id in self._runs[conv.workflow_id]:
                outcome = outcomes.get(run_id)
                if outcome is None or outcome[0] == "queued":
                    done = False
                elif outcome[0] == "done":
                    messages.extend(outcome[1]["messages"])
            conv.final_history = messages
            conv.final_status = "COMPLETED" if done else "RUNNING"
            self.history.complete(op, OK, {"messages": len(messages), "status": conv.final_status})
        self.queue.close()

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "backend": "checkpoint", "runs": self._runs}


@dataclass
class _Ctx:
    cluster: CheckpointCluster
    history: History
    workflow_ids: list[str]
    rng: random.Random
    client: Any = None
    model_activity: str = "plan_next_action"
    driver_stop: Any = None


async def run_checkpoint(scenario: Any, *, seed: int, out_root: Path, progress: Any = lambda s: None) -> Any:
    """One chaos scenario on the checkpoint backend; the same run-directory format and checkers."""
    from datetime import datetime, timezone

    from chaos.checker import run_checkers
    from harness.verdict import compose
    from chaos.generator import schedule
    from chaos.nemesis import NEMESES
    from chaos.runner import RunResult, drive_load, link_latest, machine_info
    from harness.verdict import summarise

    if scenario.name not in CHECKPOINT_SCENARIOS:
        raise ValueError(f"scenario {scenario.name!r} has no checkpoint twin; checkpoint scenarios: "
                         f"{', '.join(CHECKPOINT_SCENARIOS)}")
    started = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    name = f"{scenario.name}@checkpoint"
    run_dir = (out_root / name / stamp).resolve()
    run_dir.mkdir(parents=True)
    history = History(run_dir / "history.jsonl")
    events = schedule(scenario.events, scenario.random_events, scenario.fault_s, seed)
    spec = type(scenario.cluster)(**{**asdict(scenario.cluster), "seed": seed})
    journal: dict[str, Any] = {
        "scenario": {**asdict(scenario), "name": name, "cluster": asdict(spec)}, "backend": "checkpoint", "seed": seed,
        "reproduce": f"python -m chaos run {scenario.name} --durability checkpoint --seed {seed}",
        "schedule": [e.as_dict() for e in events], "machine": await asyncio.to_thread(machine_info),
        "target": {"name": "reference agent on the checkpoint backend", "checkers": CHECKERS,
                   "ledger": "sandbox/ledger.sqlite3", "workspace": "sandbox/{workflow_id}",
                   "model_activity": "plan_next_action"},
        "lease_ms": LEASE_MS, "phases": {},
    }
    (run_dir / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
    phases: dict[str, float] = {}

    def phase(p: str) -> None:
        phases[p] = round(history.now(), 3)
        history.event("nemesis" if p == "heal" else "generator", f"phase:{p}")
        progress(f"{name}: {p} (t={history.now():.1f}s)")

    phase("setup")
    cluster = CheckpointCluster(run_dir, spec, history)
    nemeses = {**NEMESES, "kill_worker": kill_worker}
    try:
        await asyncio.to_thread(cluster.start)
        driver = CheckpointDriver(client=None, history=history, task_queue="", workload=scenario.workload, seed=seed,
                               db=cluster.db)
        if scenario.planning_max_attempts:
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        ctx = _Ctx(cluster, history, driver.workflow_ids, random.Random(seed), driver_stop=driver.stop)
        await drive_load(scenario, events, ctx, cluster, driver, phase, progress, history, nemeses=nemeses)
        (run_dir / "conversations.json").write_text(json.dumps(driver.to_json(), indent=2, default=str))
        journal["model_server"] = cluster.model.stats()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(cluster.stop)
    phase("stopped")
    history.close()
    progress(f"{name}: checking")
    journal["phases"] = phases
    checks = [*await asyncio.to_thread(run_checkers, run_dir, CHECKERS), *not_applicable()]
    journal["checks"] = [c.as_dict() for c in checks]
    journal["verdict"] = compose(checks)
    journal["wall_s"] = round(time.monotonic() - started, 1)
    journal["summary"] = summarise(name, history.ops(), checks)
    (run_dir / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
    link_latest(run_dir)
    return RunResult(name, run_dir, journal["verdict"], checks, seed, journal["wall_s"], journal["summary"],
                     journal["reproduce"])

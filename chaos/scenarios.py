"""Named chaos scenarios: which cluster, which load, which faults.

The reference's three (worker SIGKILL mid-turn; model API unavailable then
recovering; logic bug then hot-fix), a graceful stop (SIGTERM: the worker drains), network partitions worker<->server
(blackhole, reset) and worker<->model, a crash right after a side effect,
a kill while conversations wait for their next message, a worker pause
longer than the heartbeat timeout, a Temporal server restart, model hangs
and garbage, and a randomized mixed run. ``SUITE`` is what ``make chaos``
runs in CI: every scenario but those the reference agent cannot have (``NOT_IN_SUITE``: an outage of the
external effects service, which only a target whose tools call it meets; run it by name with ``--target``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from testbed.engines.driver import Workload
from chaos.generator import NemesisEvent
from harness.faults import AgentFaults


@dataclass(frozen=True)
class ClusterSpec:
    """What a scenario needs of the cluster under test (the engine builds it; testbed.stack starts it)."""

    workers: int = 2
    model_latency: str = "fixed:100"
    bugs: tuple[str, ...] = ()  # tools with a logic bug in the first worker build (the hot-fix scenario)
    crash_at: tuple[str, ...] = ()  # worker self-SIGKILL points (harness.faults.CRASH_POINTS)
    mutations: tuple[str, ...] = ()  # deliberately broken builds, to check the checkers (harness.faults.MUTATIONS)
    workflow: str | None = None  # the reference agent's workers register this workflow class instead of its own

    @property
    def faults(self) -> AgentFaults:
        """What the workers carry (harness.faults): they reach any agent that records through harness.recording."""
        return AgentFaults(frozenset(self.crash_at), frozenset(self.bugs), frozenset(self.mutations))


@dataclass(frozen=True)
class ChaosScenario:
    name: str
    description: str
    events: tuple[NemesisEvent, ...] = ()
    random_events: int = 0
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    workload: Workload = field(default_factory=Workload)
    planning_max_attempts: int = 0  # 0: retry model calls forever (a lower value is a broken agent)
    max_history_events: int = 0  # the conversations continue-as-new past this many history events (0: as configured)
    warmup_s: float = 1.0
    fault_s: float = 8.0
    settle_s: float = 60.0
    final_s: float = 90.0  # the final phase (end every conversation, read it back) must end within this
    recovery_within_s: float = 45.0  # after the heal, each pending workflow task completes within this (liveness)
    timeouts: str = "fast"  # testbed.engines.driver.TIMEOUTS: how fast the agent notices a dead worker ("defaults": untuned)
    local_tools: tuple[str, ...] = ()  # tools the agent runs as local activities (AgentConfig.local_tools)
    local_model: bool = False  # the agent's model calls run as local activities (AgentConfig.local_model)


E = NemesisEvent

SCENARIOS: dict[str, ChaosScenario] = {
    s.name: s
    for s in [
        ChaosScenario(
            "kill_mid_turn", "SIGKILL the worker running a model call, twice; restart after a delay; each kill "
                             "spares the last worker up.",
            # ``spare``: a replacement slow to poll under load must not leave no worker at all at the second kill
            # (that measures a restart, which server_restart and a kill beside a pause test).
            (E(0.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 1.0, "spare": True}),
             E(4.0, "kill_worker", {"when": "busy", "activity": "model", "down_s": 1.0, "spare": True})),
            # The kill is aimed (frozen, then confirmed mid-call on the frozen worker), so the window need not be
            # wide: 150 ms still lands every kill mid-call, and the turn after it (at least two calls) costs less.
            cluster=ClusterSpec(model_latency="fixed:150"),
        ),
        ChaosScenario(
            "crash_after_effect", "Workers SIGKILL themselves right after a side effect, before the activity completes.",
            cluster=ClusterSpec(crash_at=("after_effect",)),
            workload=Workload(append_ratio=0.7), fault_s=4.0,
        ),
        ChaosScenario(
            "kill_idle", "SIGKILL a worker while its conversations wait for their next message.",
            (E(0.5, "kill_worker", {"when": "idle", "down_s": 1.0}),),
            workload=Workload(think_s=2.0, messages=4), fault_s=4.0,
        ),
        ChaosScenario(
            "model_outage", "The model API answers 503, then 429, then recovers.",
            (E(0.5, "model_outage", {"status": 503, "duration_s": 3.0}),
             E(5.0, "model_outage", {"status": 429, "duration_s": 2.0})),
        ),
        ChaosScenario(
            "model_garbage", "The model API hangs, then sends malformed JSON.",
            (E(0.5, "model_outage", {"mode": "hang", "duration_s": 3.0}),
             E(5.0, "model_outage", {"mode": "malformed_json", "duration_s": 2.0})),
        ),
        ChaosScenario(
            "hotfix", "A worker build with a calculator bug; runs are stuck retrying until a fixed build is deployed.",
            (E(0.0, "deploy_fix", {"activity": "calculator", "min_attempt": 3}),),
            cluster=ClusterSpec(bugs=("calculator",)), workload=Workload(append_ratio=0.2), fault_s=2.0,
        ),
        ChaosScenario(
            "partition_temporal_blackhole", "The workers' link to Temporal is partitioned for 6 s (nothing gets through; "
                                            "held bytes arrive after the heal, as TCP retransmits them).",
            (E(0.5, "partition", {"link": "temporal", "mode": "blackhole", "duration_s": 6.0}),),
        ),
        ChaosScenario(
            "partition_temporal_reset", "The workers' link to Temporal resets every connection for 6 s.",
            (E(0.5, "partition", {"link": "temporal", "mode": "reset", "duration_s": 6.0}),),
        ),
        ChaosScenario(
            "partition_model", "The workers' link to the model is partitioned for 5 s.",
            (E(0.5, "partition", {"link": "model", "mode": "blackhole", "duration_s": 5.0}),),
        ),
        ChaosScenario(
            "pause_worker", "SIGSTOP a busy worker for 6 s (longer than the heartbeat timeout), then SIGCONT.",
            (E(0.5, "pause_worker", {"pause_s": 6.0}),),
        ),
        ChaosScenario(
            "drain_worker", "SIGTERM a worker mid model call, twice (a deploy's graceful stop): it finishes what it "
                            "runs and exits; nothing is lost and nothing re-executed.",
            (E(0.5, "drain_worker", {"activity": "model", "down_s": 1.0}),
             E(4.0, "drain_worker", {"activity": "model", "down_s": 1.0})),
            cluster=ClusterSpec(model_latency="fixed:500"), fault_s=8.0,
        ),
        ChaosScenario(
            "server_restart", "SIGKILL the Temporal server and restart it from its database file.",
            (E(1.0, "restart_server", {"down_s": 2.0}),),
        ),
        ChaosScenario(
            "tool_faults", "Retryable tool errors (2 failed attempts each) and invalid tool calls the model repairs, "
                           "while the workers' link to Temporal is slow (300 ms ± 100 ms, 50 kB/s).",
            (E(0.5, "degrade_link", {"link": "temporal", "latency_ms": 300.0, "jitter_ms": 100.0, "rate_kbps": 50.0,
                                     "duration_s": 5.0}),),
            workload=Workload(flaky_ratio=0.35, repair_ratio=0.35, append_ratio=0.3), fault_s=6.0,
        ),
        ChaosScenario(
            "kill_mid_tool", "SIGKILL a worker frozen mid tool call (any tool, then an append), as its ledger shows; "
                             "each kill spares the last worker up.",
            # Tool calls are short, so an aim may wait: two aims that overlap must not take both workers at once
            # (``spare``), which would measure a restart, not a tool's recovery.
            (E(0.5, "kill_worker", {"when": "busy", "activity": "tool", "down_s": 1.0, "spare": True}),
             E(3.0, "kill_worker", {"when": "busy", "activity": "append_file", "down_s": 1.0, "spare": True})),
            workload=Workload(append_ratio=0.7), fault_s=5.0,
        ),
        ChaosScenario(
            "kill_local_tool", "The calculator runs as a local activity (inside the workflow task); SIGKILL a worker "
                               "frozen mid calculator, then one mid model call.",
            (E(0.5, "kill_worker", {"when": "busy", "activity": "calculator", "down_s": 1.0}),
             E(3.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 1.0})),
            workload=Workload(append_ratio=0.3), local_tools=("calculator",), fault_s=6.0,
        ),
        ChaosScenario(
            "kill_local_model", "Model calls and the calculator run as local activities (the whole turn in one workflow "
                                "task); SIGKILL a worker mid model call, twice, then SIGSTOP one mid model call.",
            (E(0.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 1.0}),
             E(3.0, "kill_worker", {"when": "busy", "activity": "model", "down_s": 1.0}),
             E(5.5, "pause_worker", {"pause_s": 4.0})),
            cluster=ClusterSpec(model_latency="fixed:500"), workload=Workload(append_ratio=0.3),
            local_tools=("calculator",), local_model=True, fault_s=10.0,
        ),
        ChaosScenario(
            "kill_workflow_task", "SIGKILL a worker holding a workflow task (frozen as a message's task reaches it); "
                                  "each kill spares the last worker up.",
            (E(0.5, "kill_worker", {"at": "workflow_task", "down_s": 1.0, "spare": True}),
             E(3.5, "kill_worker", {"at": "workflow_task", "down_s": 1.0, "spare": True})),
            fault_s=6.0,
        ),
        ChaosScenario(
            "kill_continue_as_new", "Conversations continue-as-new every two turns or so; SIGKILL the worker holding "
                                    "one whose turn ends by continuing as new, then one that just did.",
            (E(0.5, "kill_worker", {"at": "continue_as_new", "phase": "before", "down_s": 1.0}),
             E(3.5, "kill_worker", {"at": "continue_as_new", "phase": "after", "down_s": 1.0})),
            workload=Workload(messages=6), max_history_events=30, fault_s=7.0,
        ),
        ChaosScenario(
            "effects_outage", "The external effects service answers 503 to every note, twice, then recovers "
                              "(targets whose tools call it: effects = \"service\").",
            (E(0.5, "effects_outage", {"status": 503, "duration_s": 4.0}),
             E(7.0, "effects_outage", {"status": 503, "duration_s": 3.0})),
            workload=Workload(append_ratio=0.7), fault_s=11.0,
        ),
        ChaosScenario(
            "mixed", "A seeded random mix of three faults from every nemesis.",
            random_events=3, fault_s=10.0,
        ),
    ]
}

#: scenarios the reference agent cannot meet (its effects are its ledger's, not the effects service's)
NOT_IN_SUITE = ("effects_outage",)
SUITE = [name for name in SCENARIOS if name not in NOT_IN_SUITE]


def _build(cls: type, data: dict[str, Any]) -> Any:
    """A dataclass from its ``asdict`` form (lists back to tuples where the field is a tuple)."""
    kwargs = {}
    for f in fields(cls):
        if f.name in data:
            value = data[f.name]
            kwargs[f.name] = tuple(value) if isinstance(value, list) and str(f.type).startswith("tuple") else value
    return cls(**kwargs)


def scenario_from_dict(data: dict[str, Any]) -> ChaosScenario:
    """A scenario as ``run.json`` recorded it (``asdict``), back: ``python -m chaos rerun`` runs it again. A planted
    workflow an older run names by its old module path is named by its path now (``current_workflow``)."""
    from testbed.faults.planted import current_workflow

    events = tuple(NemesisEvent(e["at_s"], e["op"], dict(e.get("args") or {})) for e in data.get("events") or ())
    cluster = dict(data.get("cluster") or {})
    if "workflow" in cluster:
        cluster["workflow"] = current_workflow(cluster["workflow"])
    return _build(ChaosScenario, {**data, "events": events, "cluster": _build(ClusterSpec, cluster),
                                  "workload": _build(Workload, data.get("workload") or {})})

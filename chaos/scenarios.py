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

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from testbed.engines.workload import Workload
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
    # the longest the late wait (chaos.checker.late) waits for work still pending after the settle, whatever the
    # agent's own timeouts would allow
    late_cap_s: float = 120.0
    timeouts: str = "fast"  # testbed.engines.workload.TIMEOUTS: how fast the agent notices a dead worker ("defaults": untuned)
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


#: a scenario's name: it names a folder under --out and fills a target's {task_queue}, so a name from a run
#: directory is letters, digits, '_' and '-' only, beginning with a letter or digit (no path, no shell text)
SCENARIO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
#: any other string a saved scenario may carry (an event's argument, a latency model, a tool, a workflow class)
SCENARIO_TEXT = re.compile(r"[A-Za-z0-9_.:,=+-]{0,200}")
#: the most a saved scenario may ask for: a rerun must not start a thousand workers because run data says so
SCENARIO_BOUNDS = {"workers": 16, "conversations": 1000, "messages": 10_000}
_NUMBER_BOUND = 1e6


def scenario_from_dict(data: dict[str, Any]) -> ChaosScenario:
    """A scenario as ``run.json`` recorded it (``asdict``), back: ``python -m chaos rerun`` runs it again. A planted
    workflow an older run names by its old module path is named by its path now (``current_workflow``).

    Run data is checked before use (ValueError naming the field): the name by ``SCENARIO_NAME``, every other
    string by ``SCENARIO_TEXT``, each event's fault one of ``testbed.faults.nemesis.NEMESES``, the timeouts profile
    one of ``testbed.engines.workload.TIMEOUTS``, every number finite and within ``SCENARIO_BOUNDS``, every field
    of the type its default has."""
    from testbed.engines.workload import TIMEOUTS
    from testbed.faults.nemesis import NEMESES
    from testbed.faults.planted import current_workflow

    _expect(data, dict, "scenario")
    name = data.get("name")
    if not isinstance(name, str) or not SCENARIO_NAME.fullmatch(name):
        raise ValueError(f"scenario.name {str(name)[:80]!r} is not a scenario name (letters, digits, '_' and '-', "
                         "at most 100, beginning with a letter or digit)")
    events = []
    for i, e in enumerate(_expect(data.get("events") or [], list, "scenario.events")):
        _expect(e, dict, f"scenario.events[{i}]")
        if e.get("op") not in NEMESES:
            raise ValueError(f"scenario.events[{i}].op {str(e.get('op'))[:80]!r} is not a fault: one of "
                             f"{', '.join(NEMESES)}")
        args = _expect(e.get("args") or {}, dict, f"scenario.events[{i}].args")
        for key, value in args.items():
            _checked_value(value, f"scenario.events[{i}].args.{str(key)[:40]}", key=key)
        events.append(NemesisEvent(_number(e.get("at_s"), f"scenario.events[{i}].at_s"), e["op"], dict(args)))
    cluster = dict(_expect(data.get("cluster") or {}, dict, "scenario.cluster"))
    if "workflow" in cluster and cluster["workflow"] is not None:
        cluster["workflow"] = current_workflow(cluster["workflow"])
    if data.get("timeouts", "fast") not in TIMEOUTS:
        raise ValueError(f"scenario.timeouts {str(data.get('timeouts'))[:80]!r} is not a timeouts profile: one of "
                         f"{', '.join(TIMEOUTS)}")
    rest = {k: v for k, v in data.items() if k not in ("name", "events", "cluster", "workload")}
    return _build(ChaosScenario, {**_checked(ChaosScenario, rest, "scenario"), "name": name, "events": tuple(events),
                                  "cluster": _build(ClusterSpec, _checked(ClusterSpec, cluster, "scenario.cluster")),
                                  "workload": _build(Workload, _checked(Workload, _expect(
                                      data.get("workload") or {}, dict, "scenario.workload"), "scenario.workload"))})


def _expect(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, (list, tuple) if kind is list else kind):
        raise ValueError(f"{where}: expected {'an object' if kind is dict else 'a list'}, got {type(value).__name__}")
    return value


def _number(value: Any, where: str, bound: float = _NUMBER_BOUND) -> float:
    low = 0 if bound < _NUMBER_BOUND else -bound  # a count (workers, conversations, messages) is never negative
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= bound:
        raise ValueError(f"{where}: expected a number from {low:g} to {bound:g}, got {str(value)[:40]!r}")
    return value


def _checked_value(value: Any, where: str, key: Any = "") -> Any:
    """A scalar of run data: a bounded number, true/false, null, or a string of ``SCENARIO_TEXT``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return _number(value, where, SCENARIO_BOUNDS.get(str(key), _NUMBER_BOUND))
    if isinstance(value, str) and SCENARIO_TEXT.fullmatch(value):
        return value
    raise ValueError(f"{where}: {str(value)[:80]!r} is not a value a scenario holds (a number, true/false, or "
                     "letters, digits and _.:,=+- only)")


def _checked(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data``'s fields of ``cls``, each of the type its default has (a tuple field: a list of checked values);
    unknown fields are left out."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value, at = data[f.name], f"{where}.{f.name}"
        default = f.default if f.default is not MISSING else None
        if isinstance(default, tuple) or str(f.type).startswith("tuple"):
            out[f.name] = [_checked_value(v, f"{at}[{i}]") for i, v in enumerate(_expect(value, list, at))]
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{at}: expected true or false, got {str(value)[:40]!r}")
            out[f.name] = value
        elif isinstance(default, (int, float)):
            number = _number(value, at, SCENARIO_BOUNDS.get(f.name, _NUMBER_BOUND))
            if isinstance(default, int) and not isinstance(number, int):
                raise ValueError(f"{at}: expected an integer, got {number!r}")
            out[f.name] = number
        elif f.name == "description":  # shown only, escaped where it is shown
            if not isinstance(value, str) or len(value) > 2000:
                raise ValueError(f"{at}: expected a string of at most 2000 characters")
            out[f.name] = value
        else:
            out[f.name] = _checked_value(value, at)
    return out

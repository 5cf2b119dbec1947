"""The planted-bug catalogue: for each property a checker claims, a deliberately broken agent that must not pass.

``python -m chaos planted`` runs every entry (a scenario plus a planted bug: a mutation of
``harness.faults.MUTATIONS``, a broken workflow of ``testbed.faults.planted``, or a broken setting), on the reference
agent and on the example third-party agent (``examples/third_party_agent``, through its target file), and
prints one row per bug: the bug, the scenario, the verdict, the checker(s) that caught it, and their evidence.
An entry is caught when the run is not ``pass`` and one of the checkers it names says ``fail`` (or ``unknown``
where the entry says nothing can observe the bug, and why). It exits 1 if any bug was not caught: a checker that
lets a planted bug through is broken.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from testbed.engines.workload import Workload
from chaos.generator import NemesisEvent
from chaos.scenarios import SCENARIOS, ChaosScenario, ClusterSpec
from harness.printable import table as format_table
from harness.verdict import FAIL, PASS, UNKNOWN
from testbed.faults.planted import workflow_spec
from harness.commands import progress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TARGET = ROOT / "examples" / "third_party_agent" / "chaos-target.toml"
#: the same agent driven with tasks (judged by the model's record): where its context bugs are planted
TASKS_TARGET = EXAMPLE_TARGET.with_name("chaos-target-tasks.toml")


@dataclass(frozen=True)
class PlantedBug:
    name: str
    what: str
    scenario: ChaosScenario
    caught_by: tuple[str, ...]  # checkers of which one must say ``fail`` (or ``unknown``, if ``unknown_ok``)
    agent: str = "reference"  # or "third_party" (its own driver), "third_party_tasks" (driven with tasks)
    unknown_ok: str = ""  # why ``unknown`` is the most that can be said (empty: it must be ``fail``)
    seed: int = 3


def _mutant(base: str, name: str, *, mutations: tuple[str, ...] = (), workflow: str | None = None,
            **changes) -> ChaosScenario:
    s = SCENARIOS[base]
    cluster = replace(s.cluster, mutations=mutations or s.cluster.mutations, workflow=workflow or s.cluster.workflow)
    return replace(s, name=f"planted_{name}", cluster=cluster, **changes)


_NO_FAULTS = dict(events=(), random_events=0, fault_s=1.0)
_APPENDS = Workload(conversations=2, messages=3, append_ratio=1.0)
_TASKS = Workload(conversations=3, messages=4, append_ratio=0.0)

CATALOGUE: list[PlantedBug] = [
    PlantedBug("unkeyed_effects", "a tool applies its effect on every attempt, ignoring its idempotency key",
               _mutant("crash_after_effect", "unkeyed_effects", mutations=("unkeyed_effects",), workload=_APPENDS,
                       fault_s=2.0), ("effects",)),
    PlantedBug("attempt_keyed_effects", "effects keyed by attempt: a retry after a crash is a new effect",
               _mutant("crash_after_effect", "attempt_keyed_effects", mutations=("attempt_keyed_effects",),
                       workload=_APPENDS, fault_s=2.0), ("lost",)),
    PlantedBug("swallow_tool_errors", "a failing tool's error swallowed into a made-up answer",
               _mutant("tool_faults", "swallow_tool_errors", mutations=("swallow_tool_errors",),
                       workload=Workload(conversations=2, messages=3, flaky_ratio=0.7, append_ratio=0.0)),
               ("lost",)),
    PlantedBug("slow_tool_without_heartbeat", "a tool that works past its heartbeat timeout without heartbeating",
               _mutant("kill_idle", "slow_tool_without_heartbeat", mutations=("slow_tool_without_heartbeat",),
                       workload=Workload(conversations=1, messages=2, append_ratio=1.0, until_heal=False),
                       settle_s=15.0, final_s=20.0, **_NO_FAULTS), ("lost",)),
    PlantedBug("wall_clock_workflow", "workflow code reads the wall clock (sandbox off): replays differently",
               replace(SCENARIOS["kill_idle"], name="planted_wall_clock_workflow",
                       cluster=ClusterSpec(workers=1, workflow=workflow_spec("WallClockAgentWorkflow")),
                       workload=Workload(conversations=1, messages=2, append_ratio=0.0, until_heal=False),
                       **_NO_FAULTS), ("replay",)),
    PlantedBug("hash_seed_workflow", "workflow code branches on hash() (the sandbox allows it): each process "
                                     "decides differently", _mutant("kill_mid_turn", "hash_seed_workflow",
                                                                     workflow=workflow_spec("HashSeedAgentWorkflow")),
               ("replay", "workflow_tasks")),
    PlantedBug("stuck_workflow_task", "workflow code raises on the third turn: its workflow task fails forever",
               _mutant("kill_idle", "stuck_workflow_task", workflow=workflow_spec("CrashOnThirdTurnAgentWorkflow"),
                       workload=Workload(conversations=1, messages=4, append_ratio=0.0, until_heal=False, think_s=0.1),
                       settle_s=7.0, final_s=15.0, recovery_within_s=4.0, **_NO_FAULTS),
               ("lost", "workflow_tasks")),
    PlantedBug("forgets_at_continue_as_new", "the state carried into continue-as-new loses the last turn; killed "
                                             "at continue-as-new",
               _mutant("kill_continue_as_new", "forgets_at_continue_as_new",
                       workflow=workflow_spec("ForgetfulAgentWorkflow")), ("lost",)),
    PlantedBug("gives_up_on_the_model", "model calls limited to one attempt: an outage fails the turn",
               replace(SCENARIOS["model_outage"], name="planted_gives_up_on_the_model", planning_max_attempts=1,
                       workload=Workload(conversations=2, messages=4, append_ratio=0.0)), ("lost",)),
    PlantedBug("cancel_on_sigterm", "a worker that cancels its in-flight work on SIGTERM instead of draining it",
               _mutant("drain_worker", "cancel_on_sigterm", mutations=("cancel_on_sigterm",)), ("drain",)),
    PlantedBug("fault_on_idle_workers", "the harness's own bug: the only fault lands after all work is done",
               ChaosScenario("planted_fault_on_idle_workers", "the only fault lands after the load is done",
                             (NemesisEvent(6.0, "kill_worker", {"when": "busy", "activity": None, "down_s": 0.5,
                                                                "wait_s": 1.0}),),
                             workload=Workload(conversations=1, messages=1, append_ratio=0.0, until_heal=False),
                             warmup_s=0.5, fault_s=7.0),
               ("injection_evidence",), unknown_ok="a fault that hit nothing proves nothing either way"),
    PlantedBug("third_party_unkeyed_effects", "the example agent's notes applied ignoring their keys",
               _mutant("crash_after_effect", "tp_unkeyed_effects", mutations=("unkeyed_effects",),
                       workload=_APPENDS, fault_s=2.0), ("effects", "lost"), agent="third_party"),
    PlantedBug("third_party_attempt_keyed_effects", "the example agent's notes keyed by attempt",
               _mutant("crash_after_effect", "tp_attempt_keyed_effects", mutations=("attempt_keyed_effects",),
                       workload=_APPENDS, fault_s=2.0), ("lost",), agent="third_party"),
    PlantedBug("context_repeats_user_message", "a retried model call sends the user's message again",
               _mutant("kill_mid_turn", "context_repeats_user_message", mutations=("context_repeats_user_message",),
                       workload=_TASKS), ("context",), agent="third_party_tasks"),
    PlantedBug("context_drops_tool_result", "a restarted worker leaves the turn's last tool result out",
               _mutant("kill_mid_turn", "context_drops_tool_result", mutations=("context_drops_tool_result",),
                       workload=_TASKS), ("context",), agent="third_party_tasks"),
    PlantedBug("stale_reply_after_crash", "a retried model call answers with the conversation's previous answer",
               _mutant("kill_mid_turn", "stale_reply_after_crash", mutations=("stale_reply_after_crash",),
                       workload=_TASKS), ("replies",), agent="third_party_tasks"),
]


def caught(bug: PlantedBug, verdict: str, checks: dict[str, str]) -> bool:
    """Whether the run caught the bug: not ``pass``, and a named checker said ``fail`` (``unknown`` if allowed)."""
    wanted = {FAIL, UNKNOWN} if bug.unknown_ok else {FAIL}
    return verdict != PASS and any(checks.get(c) in wanted for c in bug.caught_by)


async def run_catalogue(bugs: list[PlantedBug], out: Path, target: Path) -> list[dict]:
    from chaos.runner import run_captured
    from testbed.engines import make_engine
    from testbed.engines.byo.target import load_target

    rows = []
    say = progress()
    for i, bug in enumerate(bugs, 1):
        own = {"third_party": target, "third_party_tasks": TASKS_TARGET}.get(bug.agent)
        engine = make_engine(target=load_target(own), target_file=own) if own else make_engine()
        say(f"{i}/{len(bugs)} {bug.name} on {bug.agent}: {bug.scenario.name} (seed {bug.seed})")
        result = await run_captured(bug.scenario.name, bug.scenario, engine, seed=bug.seed, out_root=out)
        checks = {c.name: c.verdict for c in result.checks}
        hit = [c for c in result.checks if c.name in bug.caught_by and c.verdict != PASS]
        row = {"bug": bug.name, "agent": bug.agent, "scenario": bug.scenario.name, "verdict": result.verdict,
               "caught": caught(bug, result.verdict, checks),
               "checker": ", ".join(f"{c.name}={c.verdict}" for c in hit) or "-",
               "evidence": hit[0].summary[:160] if hit else (next((c.summary for c in result.checks
                                                                   if c.verdict != PASS), "")[:160]),
               "run_dir": str(result.run_dir)}
        rows.append(row)
        say(f"  -> {row['verdict']} ({'caught' if row['caught'] else 'NOT CAUGHT'}) by {row['checker']}: "
            f"{row['evidence']}")
    return rows


def table(rows: list[dict]) -> str:
    """The catalogue's results as a Markdown table (``harness.printable.table``), to paste into a report."""
    return format_table([(c, 0) for c in ("bug", "agent", "scenario", "verdict", "checker", "evidence")],
                        ([f"{r['bug']}{'' if r['caught'] else ' (NOT CAUGHT)'}", r["agent"], r["scenario"],
                          r["verdict"], r["checker"], r["evidence"]] for r in rows), markdown=True)

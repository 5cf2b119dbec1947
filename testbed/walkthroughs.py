"""The walkthroughs: scripted conversations with their expected outcomes (``dah walkthroughs`` lists them, ``dah run
--walkthrough NAME`` runs one; the chaos scenarios are ``chaos.scenarios.SCENARIOS``, a different thing).

Each walkthrough names a scripted model route (``testbed.scripted_routes``), the
prompts to send, and what must come out: the reply, the files left in the
run's workspace, and the shape of the Temporal event history (which activities ran,
with how many attempts and what outcome). The tests run every walkthrough on the
real dev server and assert all of it; ``demo`` runs them with ``/scenario``
and prints the same checks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.contracts import DEFAULT_TOOLS, AgentConfig
from agent.messaging import send_message
from agent.workflow import AgentWorkflow
from harness.event_history import RunRecord, activity_shape, fetch_tree
from testbed.engines.temporal.cluster import run_prompt, start_conversation

if TYPE_CHECKING:
    from testbed.stack import Stack

FAULT_TOOLS = [*DEFAULT_TOOLS, "flaky_service", "broken_service"]
ORCH_TOOLS = [*DEFAULT_TOOLS, "spawn", "wait", "run_ptc"]
ORCH_FAULT_TOOLS = [*ORCH_TOOLS, "flaky_service", "broken_service", "slow_task"]
PLAN = "plan_next_action"

Shape = tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class Walkthrough:
    name: str
    description: str
    prompts: tuple[str, ...]
    expect_reply: str  # a substring of the last reply
    # (activity type, attempts, outcome) in scheduling order; None: not checked
    expect_activities: tuple[tuple[str, int, str], ...] | None
    expect_files: dict[str, str] = field(default_factory=dict)  # exactly the workspace's files
    tools: tuple[str, ...] = tuple(DEFAULT_TOOLS)
    conversation: bool = False  # send the prompts as Updates to one conversation workflow
    max_history_events: int = 0
    expect_min_runs: int = 1  # continue-as-new: at least this many runs in the chain
    # Subagents, in the order they were started (depth first): (id below the root's, e.g. "generic-1" or
    # "planner-1/generic-1", how the child workflow ended, its activity shape or None). None: not checked.
    expect_children: tuple[tuple[str, str, Shape | None], ...] | None = ()
    max_depth: int = 2
    max_children: int = 8
    tool_heartbeat_s: float | None = None  # shorter heartbeats: a cancellation reaches the activity sooner

    @property
    def model(self) -> str:
        return f"scripted:{self.name}"

    def config(self) -> AgentConfig:
        cfg = AgentConfig(model=self.model, tools=list(self.tools), max_history_events=self.max_history_events,
                          max_depth=self.max_depth, max_children=self.max_children)
        # Short backoff so walkthroughs take seconds; the defaults stay close to the reference.
        cfg.tool.initial_interval_s = 0.5
        cfg.planning.initial_interval_s = 0.5
        if self.tool_heartbeat_s is not None:
            cfg.tool.heartbeat_s = self.tool_heartbeat_s
        return cfg


def _ok(activity: str, attempts: int = 1, outcome: str = "completed") -> tuple[str, int, str]:
    return (activity, attempts, outcome)


WALKTHROUGHS: dict[str, Walkthrough] = {
    s.name: s
    for s in [
        Walkthrough(
            "direct", "Direct tool use: one calculator call between two model calls.",
            ("What is 25 * 4?",), "= 100",
            (_ok(PLAN), _ok("calculator"), _ok(PLAN)),
        ),
        Walkthrough(
            "multi_step", "Multi-step tool use: write, read back, then write and list in parallel.",
            ("Draft a plan in notes/plan.txt and mark it done.",), "notes/done.txt",
            (_ok(PLAN), _ok("write_file"), _ok(PLAN), _ok("read_file"), _ok(PLAN), _ok("write_file"),
             _ok("list_files"), _ok(PLAN)),
            expect_files={"notes/plan.txt": "step one: gather data", "notes/done.txt": "done"},
        ),
        Walkthrough(
            "validation_repair", "A validation error ('25 x 4') goes back to the model, which repairs the call.",
            ("What is 25 times 4?",), "25 * 4 = 100",
            (_ok(PLAN), _ok("calculator"), _ok(PLAN), _ok("calculator"), _ok(PLAN)),
        ),
        Walkthrough(
            "malformed", "The model emits unparseable tool arguments; the loop asks it to repair them.",
            ("What is 25 * 4?",), "25 * 4 = 100",
            (_ok(PLAN), _ok(PLAN), _ok("calculator"), _ok(PLAN)),
        ),
        Walkthrough(
            "retry", "A retryable tool failure: Temporal retries the activity (3 attempts) and the turn completes.",
            ("Check the flaky service.",), "attempt 3",
            (_ok(PLAN), _ok("flaky_service", attempts=3), _ok(PLAN)),
            tools=tuple(FAULT_TOOLS),
        ),
        Walkthrough(
            "terminal", "A known terminal failure: not retried, reported to the model, which explains it.",
            ("Refund order 42.",), "account is closed",
            (_ok(PLAN), _ok("broken_service", outcome="failed"), _ok(PLAN)),
            tools=tuple(FAULT_TOOLS),
        ),
        Walkthrough(
            "path_escape", "Paths outside the workspace ('../../etc/passwd', '/etc/passwd') are refused.",
            ("Overwrite the password file.",), "refused",
            (_ok(PLAN), _ok("write_file"), _ok(PLAN), _ok("read_file"), _ok(PLAN), _ok("write_file"), _ok(PLAN)),
            expect_files={"safe.txt": "stayed inside"},
        ),
        Walkthrough(
            "parallel", "Three tool calls in one model step run as concurrent activities.",
            ("Compute 6*7, 100/8 and the weather in Lisbon.",), "6 * 7 = 42",
            (_ok(PLAN), _ok("calculator"), _ok("weather"), _ok("calculator"), _ok(PLAN)),
        ),
        Walkthrough(
            "conversation", "A long conversation continues-as-new and still remembers its first message.",
            ("What is 2 + 3?", "write hello to greeting.txt", "weather in Oslo", "What is 7 * 6?",
             "list files", "What did I say first? recall"),
            "Your first message was: 'What is 2 + 3?'",
            None,
            expect_files={"greeting.txt": "hello"},
            conversation=True,
            max_history_events=40,
            expect_min_runs=2,
        ),
        # -- subagents (child workflows) and programmatic tool calling (workflow-native) -----------
        Walkthrough(
            "ptc", "One run_ptc program gathers two file writes and a subagent: the writes are the same "
            "write_file activities as direct calls, the spawn the same child workflow; run_ptc itself is no activity.",
            ("Write two notes and ask a helper for 6 * 7, in one program.",), "'subagent': '6 * 7 = 42'",
            (_ok(PLAN), _ok("write_file"), _ok("write_file"), _ok(PLAN)),
            expect_files={"notes/a.txt": "alpha", "notes/b.txt": "beta"},
            tools=tuple(ORCH_TOOLS),
            expect_children=(("generic-1", "completed", (_ok(PLAN), _ok("calculator"), _ok(PLAN))),),
        ),
        Walkthrough(
            "spawn", "spawn starts a child agent workflow (profile 'researcher') and returns its answer; "
            "spawn itself is no activity.",
            ("Ask a researcher about the weather in Lisbon.",), "My researcher reports: Lisbon:",
            (_ok(PLAN), _ok(PLAN)),
            tools=tuple(ORCH_TOOLS),
            expect_children=(("researcher-1", "completed", (_ok(PLAN), _ok("weather"), _ok(PLAN))),),
        ),
        Walkthrough(
            "spawn_failure", "A child workflow that fails comes back to the parent model as a spawn failure; "
            "the parent completes.",
            ("Have a helper do the impossible.",), "The subagent could not do it: ERROR (execution_error): subagent",
            (_ok(PLAN), _ok(PLAN)),
            tools=tuple(ORCH_TOOLS),
            expect_children=(("generic-1", "failed", (_ok(PLAN, outcome="failed"),)),),
        ),
        Walkthrough(
            "spawn_detached", "spawn(wait=false) returns handles at once; the parent works meanwhile, then "
            "wait(handle) collects each answer.",
            ("Start two helpers, keep working, then collect their answers.",),
            "Both helpers answered: 6 * 7 = 42 / wrote 5 bytes to notes/c.txt",
            (_ok(PLAN), _ok(PLAN), _ok("write_file"), _ok(PLAN), _ok(PLAN)),
            expect_files={"notes/c.txt": "gamma", "notes/parent.txt": "started two helpers"},
            tools=tuple(ORCH_TOOLS),
            expect_children=(("generic-1", "completed", (_ok(PLAN), _ok("calculator"), _ok(PLAN))),
                             ("generic-2", "completed", (_ok(PLAN), _ok("write_file"), _ok(PLAN)))),
        ),
        Walkthrough(
            "spawn_across_runs", "A detached subagent started in one turn is collected by its handle in a later "
            "turn, after the conversation continued-as-new (its answer is carried to the new run).",
            ("Start a helper on 6 * 7 and carry on.", "Now collect the helper's answer."),
            "The helper answered: 6 * 7 = 42",
            None,
            tools=tuple(ORCH_TOOLS), conversation=True, max_history_events=10, expect_min_runs=2,
            expect_children=(("generic-1", "completed", (_ok(PLAN), _ok("calculator"), _ok(PLAN))),),
        ),
        Walkthrough(
            "spawn_limits", "The per-run child budget (2) refuses a third spawn, and the depth limit (1) refuses "
            "a subagent's own spawn; both refusals are model-visible.",
            ("Fan out three helpers.",), "this run has used its budget of 2 subagents",
            (_ok(PLAN), _ok(PLAN)),
            tools=tuple(ORCH_TOOLS), max_depth=1, max_children=2,
            expect_children=(("planner-1", "completed", (_ok(PLAN), _ok(PLAN))),
                             ("generic-2", "completed", (_ok(PLAN), _ok("calculator"), _ok(PLAN)))),
        ),
        Walkthrough(
            "ptc_retry", "A retryable failure of a PTC-inner call is retried by Temporal's policy (3 attempts) "
            "like a direct call; the program never sees it.",
            ("Check the inventory through a program.",), "answered 'inventory' on attempt 3",
            (_ok(PLAN), _ok("flaky_service", attempts=3), _ok(PLAN)),
            tools=tuple(ORCH_FAULT_TOOLS),
        ),
        Walkthrough(
            "ptc_validation", "A validation error inside a program is model-visible with its line, not retried "
            "by Temporal; the model repairs the program.",
            ("Add up two calculations in a program.",), "After repairing the program the total is 102",
            (_ok(PLAN), _ok("calculator"), _ok("calculator"), _ok(PLAN), _ok("calculator"), _ok("calculator"),
             _ok(PLAN)),
            tools=tuple(ORCH_TOOLS),
        ),
        Walkthrough(
            "ptc_parallel_fail", "In a PTC gather, the first failure cancels the in-flight sibling activity "
            "(canceled in the history) and the error reaches the model.",
            ("Run the long job and the refund together.",), "account is closed",
            (_ok(PLAN), _ok("slow_task", outcome="canceled"), _ok("broken_service", outcome="failed"), _ok(PLAN)),
            tools=tuple(ORCH_FAULT_TOOLS), tool_heartbeat_s=2.0,
        ),
        Walkthrough(
            "ptc_hostile", "Hostile programs (import, a __class__ walk, an endless loop, huge allocations, open()) "
            "are refused by the interpreter's rules and limits; no activity runs.",
            ("Try to break out of the sandbox.",), "Refused: ERROR (validation_error): run_ptc: line 1: imports",
            (_ok(PLAN),) * 7,
            tools=tuple(ORCH_TOOLS),
        ),
    ]
}


# -- running one on a stack, and checking every expectation it declares ------------------------------------


@dataclass
class WalkthroughOutcome:
    scenario: Walkthrough
    workflow_id: str
    replies: list[str]
    runs: list[RunRecord]
    files: dict[str, str]
    problems: list[str]
    #: every subagent's chain, keyed by its id below the root's (e.g. "generic-1"), in start order
    children: dict[str, list[RunRecord]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems


def workspace_files(workspace: Path) -> dict[str, str]:
    if not workspace.exists():
        return {}
    return {
        str(p.relative_to(workspace)): p.read_text(errors="replace")
        for p in sorted(workspace.rglob("*")) if p.is_file() and not p.name.startswith(".")
    }


async def run_walkthrough(stack: Stack, scenario: Walkthrough, workflow_id: str | None = None) -> WalkthroughOutcome:
    """Run a scenario on the stack and check every expectation it declares."""
    workflow_id = workflow_id or f"scenario-{scenario.name}-{uuid.uuid4().hex[:8]}"
    replies: list[str] = []
    if scenario.conversation:
        started = await start_conversation(stack, scenario.config(), workflow_id)
        # A handle without a run id: Updates and the result follow continue-as-new to the latest run.
        chat = stack.client.get_workflow_handle_for(AgentWorkflow.run, workflow_id)
        for n, prompt in enumerate(scenario.prompts):
            # Re-sent under the same update id until answered (a walkthrough may fault the link or the server).
            delivered = await send_message(chat, prompt, f"{workflow_id}-msg-{n}", deadline_s=300.0)
            replies.append(delivered.reply.text)
        await chat.signal(AgentWorkflow.end_chat)
        await chat.result()
        first_run_id = started.result_run_id
    else:
        result, handle = await run_prompt(stack, scenario.config(), scenario.prompts[0], workflow_id)
        replies.append(result.reply or "")
        first_run_id = handle.result_run_id
    assert first_run_id is not None
    tree = await fetch_tree(stack.client, workflow_id, first_run_id)
    runs = tree.pop(workflow_id)
    children = {wid[len(workflow_id) + 1:]: chain for wid, chain in tree.items()}
    files = workspace_files(stack.workspace(workflow_id))
    ledger: dict[str, int] = {}
    for wid in [workflow_id, *tree]:  # subagents work in the root's workspace; their effects count too
        for key, value in stack.ledger.summary(wid).as_dict().items():
            ledger[key] = ledger.get(key, 0) + value
    problems = check_walkthrough(scenario, replies, runs, files, ledger, children)
    return WalkthroughOutcome(scenario, workflow_id, replies, runs, files, problems, children)


def check_walkthrough(scenario: Walkthrough, replies: list[str], runs: list[RunRecord], files: dict[str, str],
                   ledger: dict[str, int], children: dict[str, list[RunRecord]] | None = None) -> list[str]:
    problems: list[str] = []
    if scenario.expect_children is not None:
        children = children or {}
        got = [(cid, chain[-1].status) for cid, chain in children.items()]
        want = [(cid, status) for cid, status, _ in scenario.expect_children]
        if sorted(got) != sorted(want):
            problems.append(f"subagents {got} != expected {want}")
        for cid, _, shape in scenario.expect_children:
            if shape is not None and cid in children and tuple(activity_shape(children[cid])) != shape:
                problems.append(f"subagent {cid} history shape {activity_shape(children[cid])} != expected "
                                f"{list(shape)}")
    if scenario.expect_reply not in (replies[-1] if replies else ""):
        problems.append(f"reply {replies[-1:]!r} does not contain {scenario.expect_reply!r}")
    shape = activity_shape(runs)
    if scenario.expect_activities is not None and tuple(shape) != scenario.expect_activities:
        problems.append(f"history shape {shape} != expected {list(scenario.expect_activities)}")
    if files != scenario.expect_files:
        problems.append(f"workspace files {files} != expected {scenario.expect_files}")
    if len(runs) < scenario.expect_min_runs:
        problems.append(f"{len(runs)} run(s) in the chain; expected at least {scenario.expect_min_runs}")
    if runs and runs[-1].status != "completed":
        problems.append(f"last run ended {runs[-1].status}")
    if ledger["duplicated_effects"] or ledger["pending_effects"]:
        problems.append(f"effect ledger: {ledger}")
    return problems

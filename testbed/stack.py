"""A whole local agent stack in one ``async with``: Temporal (embedded unless
an address is given), the scripted model server, and an in-process worker.

Used by ``demo``, ``run`` and the tests. Everything it starts is stopped on
exit, exception or Ctrl-C, in reverse order (worker, model server, server).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from testbed.connection import TemporalConnection, temporal_target
from agent.contracts import AgentConfig, AgentInput, AgentReply, AgentResult, ChatMessage
from testbed.temporal_server import EmbeddedTemporal
from harness.event_history import RunRecord, activity_shape, fetch_tree
from harness.recording import EffectLedger
from harness.faults import FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from testbed.walkthroughs import Scenario
from testbed.scripted_routes import respond
from agent.tools import workspace_for
from agent.worker import WorkerSettings, build_worker
from agent.workflow import AgentWorkflow

log = logging.getLogger(__name__)


@dataclass
class AgentStack:
    client: Client
    settings: WorkerSettings
    ledger: EffectLedger
    server: EmbeddedTemporal | None
    model_server: ScriptedModelServer | None

    @property
    def task_queue(self) -> str:
        return self.settings.task_queue

    def workflow_url(self, workflow_id: str) -> str | None:
        if self.server is None or not self.server.ui_url:
            return None
        return f"{self.server.ui_url}/namespaces/{self.client.namespace}/workflows/{workflow_id}"

    def workspace(self, workflow_id: str) -> Path:
        return workspace_for(self.settings.sandbox_root, workflow_id)

    async def start_prompt(self, config: AgentConfig, prompt: str, workflow_id: str | None = None
                           ) -> WorkflowHandle[Any, AgentResult]:
        return await self.client.start_workflow(
            AgentWorkflow.run, AgentInput(config=config, prompt=prompt),
            id=workflow_id or f"agent-{uuid.uuid4().hex[:12]}", task_queue=self.task_queue,
        )

    async def run_prompt(self, config: AgentConfig, prompt: str, workflow_id: str | None = None
                         ) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
        handle = await self.start_prompt(config, prompt, workflow_id)
        return await handle.result(), handle

    async def start_conversation(self, config: AgentConfig, workflow_id: str | None = None
                                 ) -> WorkflowHandle[Any, AgentResult]:
        return await self.client.start_workflow(
            AgentWorkflow.run, AgentInput(config=config),
            id=workflow_id or f"chat-{uuid.uuid4().hex[:12]}", task_queue=self.task_queue,
        )


@contextlib.asynccontextmanager
async def agent_stack(
    conn: TemporalConnection | None = None,
    *,
    state_dir: Path = Path(".dah"),
    task_queue: str = "durable-agent",
    ui: bool = False,
    worker: bool = True,
    latency: LatencyModel | None = None,
    faults: list[FaultRule] | None = None,
    seed: int = 0,
) -> AsyncIterator[AgentStack]:
    conn = conn or TemporalConnection()
    settings = WorkerSettings(task_queue=task_queue, sandbox_root=state_dir / "sandbox")
    async with contextlib.AsyncExitStack() as stack:
        client, server = await stack.enter_async_context(temporal_target(conn, ui=ui))
        ledger = stack.enter_context(EffectLedger(settings.resolved_ledger_path))
        model_server = None
        if worker:  # without a worker here, the model is the remote worker's business
            model_server = stack.enter_context(ScriptedModelServer(respond, latency=latency, faults=faults, seed=seed))
            settings.model_base_url = model_server.url
            await stack.enter_async_context(build_worker(client, settings, ledger))
        yield AgentStack(client, settings, ledger, server, model_server)


@dataclass
class ScenarioOutcome:
    scenario: Scenario
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


async def run_scenario(stack: AgentStack, scenario: Scenario, workflow_id: str | None = None) -> ScenarioOutcome:
    """Run a scenario on the stack and check every expectation it declares."""
    workflow_id = workflow_id or f"scenario-{scenario.name}-{uuid.uuid4().hex[:8]}"
    replies: list[str] = []
    if scenario.conversation:
        started = await stack.start_conversation(scenario.config(), workflow_id)
        # A handle without a run id: Updates and the result follow continue-as-new to the latest run.
        chat = stack.client.get_workflow_handle_for(AgentWorkflow.run, workflow_id)
        for prompt in scenario.prompts:
            reply: AgentReply = await chat.execute_update(AgentWorkflow.send_message, ChatMessage(prompt))
            replies.append(reply.text)
        await chat.signal(AgentWorkflow.end_chat)
        await chat.result()
        first_run_id = started.result_run_id
    else:
        result, handle = await stack.run_prompt(scenario.config(), scenario.prompts[0], workflow_id)
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
    problems = check_scenario(scenario, replies, runs, files, ledger, children)
    return ScenarioOutcome(scenario, workflow_id, replies, runs, files, problems, children)


def check_scenario(scenario: Scenario, replies: list[str], runs: list[RunRecord], files: dict[str, str],
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

"""The replay checker builds its replayer the way the target's workers build theirs.

A third-party agent written here (in tmp_path, never imported by the harness) runs on a framework's Temporal
plugin: a ``SimplePlugin`` whose data converter encodes every payload with a payload codec and whose workflow
runner is unsandboxed (its workflow reads a setting with ``os.getenv``, which the default sandbox forbids). Its
real histories, from a real Temporal dev server, replay only when the replayer gets the same: without the
target's declarations the replay checker would fail a correct agent (the false alarm this guards against);
with them it passes; a declaration naming something that does not exist is unknown, never fail.
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from chaos.checker.replay import check
from chaos.checker.run_data import RunData
from chaos.replay_target import replay_target
from testbed.engines.byo.target import load_target
from harness.event_history import save_histories
from harness.rundir import EVENT_HISTORIES, RUN_JSON, SCHEMA, RunDir, write_json
from harness.verdict import FAIL, PASS, UNKNOWN
from testbed.stack import Stack

MODULE = "byo_replay_agent"
AGENT = '''
"""A third party's agent on a framework that registers a Temporal plugin."""
import dataclasses
import os
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.plugin import SimplePlugin
from temporalio.worker import UnsandboxedWorkflowRunner

ENCODING = b"binary/x-byo-reversed"


class ReversingCodec(PayloadCodec):
    """Every payload stored reversed: only this codec can read the histories."""

    async def encode(self, payloads):
        return [Payload(metadata={"encoding": ENCODING}, data=p.SerializeToString()[::-1]) for p in payloads]

    async def decode(self, payloads):
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                raise ValueError(f"not a {ENCODING!r} payload: {dict(p.metadata)}")
            q = Payload()
            q.ParseFromString(p.data[::-1])
            out.append(q)
        return out


converter = dataclasses.replace(DataConverter.default, payload_codec=ReversingCodec())


def make_plugin():
    return SimplePlugin("byo.framework", data_converter=converter, workflow_runner=UnsandboxedWorkflowRunner())


@activity.defn
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn
class Greeter:
    @workflow.run
    async def run(self, name: str) -> str:
        greeting = os.getenv("BYO_GREETING", "hello")  # the framework's setting: the default sandbox forbids os.*
        return await workflow.execute_activity(shout, f"{greeting} {name}",
                                               start_to_close_timeout=timedelta(seconds=10))
'''
TARGET = f'''
name = "byo-replay"
worker = ["{{python}}", "-m", "{MODULE}", "--address", "{{address}}", "--task-queue", "{{task_queue}}"]
driver = "{MODULE}:make_driver"
workflow = "{MODULE}:Greeter"
'''


class Agent:
    def __init__(self, root: Path) -> None:
        self.root = root

    def check(self, declarations: str = "") -> tuple[str, str, dict]:
        """The replay checker on a run directory whose run.json records the target file with ``declarations``."""
        run_dir = self.root / f"run-{uuid.uuid4().hex[:6]}"
        run_dir.mkdir()
        shutil.copytree(self.root / "histories", run_dir / EVENT_HISTORIES)  # a symlink there would be refused
        (self.root / "chaos-target.toml").write_text(TARGET + textwrap.dedent(declarations))
        target = load_target(self.root / "chaos-target.toml")
        RunDir(run_dir).begin("chaos", "replay", target=target.as_dict())  # as the harness writes it: signed
        # run.json, written by this user's harness, names the target file, which this user owns and no one else
        # can write: replay uses it.
        result = check(RunData(run_dir, replay_target(run_dir, target.as_dict())))
        return result.verdict, result.summary, result.details


@pytest.fixture(scope="module")
async def agent(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Agent]:
    """The agent's module, and the event histories of two of its workflows run by its own worker."""
    root = tmp_path_factory.mktemp("byo-replay")
    (root / f"{MODULE}.py").write_text(AGENT)
    sys.path.insert(0, str(root))
    try:
        mod = importlib.import_module(MODULE)
        assert stack.server is not None
        # As the framework runs it: the plugin on the client gives the client and its workers the codec and the
        # unsandboxed runner.
        client = await Client.connect(stack.server.address, namespace=stack.spec.engine.namespace,
                                      plugins=[mod.make_plugin()])
        queue, ids = f"byo-replay-{uuid.uuid4().hex[:8]}", [f"byo-replay-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        async with Worker(client, task_queue=queue, workflows=[mod.Greeter], activities=[mod.shout]):
            answers = await asyncio.gather(*(
                client.execute_workflow(mod.Greeter.run, f"user {n}", id=wid, task_queue=queue,
                                        execution_timeout=timedelta(seconds=20))
                for n, wid in enumerate(ids)))
        assert answers == ["HELLO USER 0", "HELLO USER 1"]
        assert await save_histories(client, ids, root / "histories") == []
        raw = next((root / "histories" / ids[0]).glob("*.json")).read_text()
        assert "binary/x-byo-reversed" in raw or "YmluYXJ5L3gtYnlvLXJldmVyc2Vk" in raw  # encoded, as stored
        yield Agent(root)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(MODULE, None)


async def test_without_its_declarations_a_correct_agent_fails_replay(agent: Agent) -> None:
    verdict, summary, details = await asyncio.to_thread(agent.check)
    assert verdict == FAIL, summary  # the false alarm the declarations exist for: this test can fail
    assert details["replayed"] == 2 and len(details["failures"]) == 2
    assert "no plugins; data converter (not declared)" in summary
    assert "workflow runner (not declared): SandboxedWorkflowRunner" in summary
    assert details["uses"]["workflow_runner"]["type"] == "SandboxedWorkflowRunner"


@pytest.mark.parametrize("declarations, missing", [
    ('workflow_runner = "temporalio.worker:UnsandboxedWorkflowRunner"\n', "codec"),
    (f'data_converter = "{MODULE}:converter"\n', "runner"),
], ids=["runner-only", "converter-only"])
async def test_half_the_declarations_still_fail(agent: Agent, declarations: str, missing: str) -> None:
    verdict, summary, details = await asyncio.to_thread(agent.check, declarations)
    assert verdict == FAIL, summary
    error = details["failures"][0]["error"]
    if missing == "runner":  # decoded now, but the default sandbox refuses os.getenv
        assert "RestrictedWorkflowAccessError" in error or "restricted" in error.lower(), error
    assert details["uses"]["workflow_runner"]["type"] == (
        "SandboxedWorkflowRunner" if missing == "runner" else "UnsandboxedWorkflowRunner")


async def test_with_its_converter_and_runner_declared_it_passes(agent: Agent) -> None:
    verdict, summary, details = await asyncio.to_thread(agent.check, f'''
        data_converter = "{MODULE}:converter"
        workflow_runner = "temporalio.worker:UnsandboxedWorkflowRunner"
    ''')
    assert verdict == PASS, summary
    assert details["replayed"] == 2 and details["failures"] == []
    assert details["data_converter"] == f"{MODULE}:converter"
    uses = details["uses"]
    assert uses["data_converter"]["payload_codec"] == "ReversingCodec"
    assert uses["workflow_runner"] == {"spec": "temporalio.worker:UnsandboxedWorkflowRunner",
                                       "type": "UnsandboxedWorkflowRunner"}
    assert f"data converter {MODULE}:converter: " in summary and "codec ReversingCodec" in summary
    assert "workflow runner temporalio.worker:UnsandboxedWorkflowRunner: UnsandboxedWorkflowRunner" in summary
    # Strict replay compared each activity's input through the codec (the history holds it reversed).
    assert (details["strict"]["compared"], details["strict"]["equal"]) == (2, 2), details["strict"]


async def test_with_its_plugin_declared_it_passes(agent: Agent) -> None:
    verdict, summary, details = await asyncio.to_thread(agent.check, f'replay_plugins = ["{MODULE}:make_plugin"]\n')
    assert verdict == PASS, summary
    assert details["uses"]["plugins"] == [{"spec": f"{MODULE}:make_plugin", "name": "byo.framework"}]
    assert details["uses"]["data_converter"]["payload_codec"] == "ReversingCodec"  # what the plugin configured
    assert details["uses"]["workflow_runner"]["type"] == "UnsandboxedWorkflowRunner"
    assert "(plugins byo.framework; data converter (not declared): " in summary  # set by the plugin:
    assert "+ codec ReversingCodec; workflow runner (not declared): UnsandboxedWorkflowRunner)" in summary
    assert (details["strict"]["compared"], details["strict"]["mismatch_count"]) == (2, 0), details["strict"]


@pytest.mark.parametrize("declarations, named", [
    (f'data_converter = "{MODULE}:no_such_converter"\n', f"{MODULE}:no_such_converter"),
    ('replay_plugins = ["no_such_framework.temporal:plugin"]\n', "no_such_framework.temporal:plugin"),
    (f'workflow_runner = "{MODULE}:shout"\n', f"{MODULE}:shout"),  # a callable that returns no runner
], ids=["missing-converter", "missing-plugin-module", "not-a-runner"])
async def test_a_declared_object_that_does_not_load_is_unknown(agent: Agent, declarations: str, named: str) -> None:
    verdict, summary, details = await asyncio.to_thread(agent.check, declarations)
    assert verdict == UNKNOWN, summary
    assert named in summary and "error" in details


@pytest.mark.parametrize("text, field", [
    ('replay_plugins = "x:y"\n', "'replay_plugins' must be a list of MODULE:NAME"),
    ('replay_plugins = ["no_colon"]\n', "'replay_plugins[0]' must be MODULE:NAME"),
    ('data_converter = "no_colon"\n', "'data_converter' must be MODULE:NAME"),
    ('workflow_runner = 3\n', "'workflow_runner' must be MODULE:NAME (an instance, or a zero-argument callable "
                               "returning one), got 3"),
    ('replay_plugin = ["x:y"]\n', "replay_plugin"),  # a typo is an unknown field
], ids=["plugins-not-a-list", "plugin-not-module-name", "converter-not-module-name", "runner-not-a-string",
        "typo"])
def test_bad_replay_declarations_are_refused_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "target.toml"
    path.write_text(TARGET + text)
    with pytest.raises(ValueError) as exc:
        load_target(path)
    assert field in str(exc.value) and str(path) in str(exc.value)


def test_declarations_are_recorded_only_when_made(tmp_path: Path) -> None:
    path = tmp_path / "target.toml"
    path.write_text(TARGET)
    assert "replay_plugins" not in load_target(path).as_dict()  # run.json as before for targets without them
    path.write_text(TARGET + 'replay_plugins = ["a:b", "c:d"]\nworkflow_runner = "e:f"\n')
    t = load_target(path).as_dict()
    assert t["replay_plugins"] == ["a:b", "c:d"] and t["workflow_runner"] == "e:f" and "data_converter" not in t


SANDBOXED = '''
import os
from temporalio import workflow


@workflow.defn
class Greeter:
    @workflow.run
    async def run(self) -> str:
        return os.getenv("BYO_GREETING", "hello")  # fine on the agent's unsandboxed workers; the sandbox refuses it
'''


def _one_task_history(out: Path) -> None:
    """A saved history of one run of ``Greeter``: started, one workflow task completed, the workflow completed."""
    from google.protobuf.timestamp_pb2 import Timestamp
    from temporalio.api.enums.v1 import EventType
    from temporalio.api.history.v1 import HistoryEvent
    from temporalio.client import WorkflowHistory

    ts = Timestamp(seconds=1_795_000_000)
    events = [
        HistoryEvent(event_id=1, event_time=ts, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                     workflow_execution_started_event_attributes={
                         "workflow_type": {"name": "Greeter"}, "task_queue": {"name": "q"},
                         "original_execution_run_id": "r-1", "first_execution_run_id": "r-1"}),
        HistoryEvent(event_id=2, event_time=ts, event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                     workflow_task_scheduled_event_attributes={"task_queue": {"name": "q"}}),
        HistoryEvent(event_id=3, event_time=ts, event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
                     workflow_task_started_event_attributes={"scheduled_event_id": 2}),
        HistoryEvent(event_id=4, event_time=ts, event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
                     workflow_task_completed_event_attributes={"scheduled_event_id": 2, "started_event_id": 3}),
        HistoryEvent(event_id=5, event_time=ts, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
                     workflow_execution_completed_event_attributes={"workflow_task_completed_event_id": 4}),
    ]
    (out / "c-0").mkdir(parents=True)
    (out / "c-0" / "01-r-1.json").write_text(WorkflowHistory("c-0", events).to_json())


def test_a_replay_refused_by_the_sandbox_names_the_declarations_that_build_the_replayer(tmp_path: Path) -> None:
    from chaos.checker.run_data import ReplayTarget

    (tmp_path / "sandboxed_agent.py").write_text(SANDBOXED)
    run_dir = tmp_path / "run"
    _one_task_history(run_dir / EVENT_HISTORIES)
    write_json(run_dir / RUN_JSON, {"schema": SCHEMA, "kind": "chaos", "name": "replay", "target": {}})
    bare = ReplayTarget("sandboxed_agent:Greeter", "test", cwd=str(tmp_path), env={"PYTHONPATH": str(tmp_path)})
    result = check(RunData(run_dir, bare))
    assert result.verdict == FAIL, result.summary
    assert "Cannot access os.getenv" in result.summary
    assert "replay_plugins" in result.summary and "workflow_runner" in result.summary, result.summary
    assert "declared now: neither" in result.summary
    # What the hint says to declare is what makes it pass.
    declared = ReplayTarget("sandboxed_agent:Greeter", "test", cwd=str(tmp_path), env={"PYTHONPATH": str(tmp_path)},
                            workflow_runner="temporalio.worker:UnsandboxedWorkflowRunner")
    result = check(RunData(run_dir, declared))
    assert result.verdict == PASS, result.summary
    assert "replay_plugins" not in result.summary

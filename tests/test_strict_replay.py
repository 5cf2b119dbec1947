"""Strict replay: workflow code that computes an activity's argument non-deterministically fails ``replay``.

Temporal's replayer compares the sequence of commands with the history, not their inputs: a workflow that puts an
unseeded ``random.Random()`` nonce into an activity argument (the default sandbox allows instantiating ``Random``)
replays "cleanly" and, on a real worker after a crash, re-runs that activity with other arguments than the ones
recorded. Here such a workflow runs on a real Temporal dev server and its real history is replayed: strict replay
fails it, naming the activity, the event and both values, in the sandbox and unsandboxed; the same workflow with a
deterministic argument (``workflow.random()``, seeded by the history) passes, with a dataclass argument, a child
workflow and a local activity. Hand-made histories pin the comparison itself (JSON by value, a codec, calls that
cannot be paired).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.worker import Worker

from chaos.checker.replay import check
from chaos.checker.run_data import ReplayTarget, RunData
from harness.event_history import decode_payload, load_saved, save_histories
from harness.rundir import EVENT_HISTORIES, RUN_JSON, SCHEMA, write_json
from harness.strict_replay import ACTIVITY, CHILD_WORKFLOW, ScheduledCall, compare, describe, payloads_equal
from harness.verdict import FAIL, PASS, UNKNOWN
from testbed.stack import Stack

MODULE = "strict_replay_agent"
AGENT = '''
"""Two workflows that differ only in where an activity argument's random number comes from."""
import random
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.plugin import SimplePlugin


@dataclass
class Note:
    text: str
    weight: float
    tags: dict


@activity.defn
async def echo(note: Note) -> str:
    return note.text


@activity.defn
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn
class Child:
    @workflow.run
    async def run(self, text: str) -> str:
        return text


@workflow.defn
class NonceWorkflow:
    """The bug: an unseeded Random, a new nonce on every replay."""

    @workflow.run
    async def run(self, name: str) -> str:
        nonce = random.Random().random()
        return await workflow.execute_activity(echo, Note(f"{name} nonce {nonce}", nonce, {"b": 1, "a": [name]}),
                                               start_to_close_timeout=timedelta(seconds=10))


@workflow.defn
class SteadyWorkflow:
    """The fix: workflow.random() is seeded by the history, so the replay computes the same argument."""

    @workflow.run
    async def run(self, name: str) -> str:
        nonce = workflow.random().random()
        text = await workflow.execute_activity(echo, Note(f"{name} nonce {nonce}", nonce, {"b": 1, "a": [name]}),
                                               start_to_close_timeout=timedelta(seconds=10))
        loud = await workflow.execute_local_activity(shout, text, start_to_close_timeout=timedelta(seconds=10))
        return await workflow.execute_child_workflow(Child.run, loud, id=f"{workflow.info().workflow_id}-child")


class InterceptorDropper(SimplePlugin):
    """A plugin whose configure_replayer replaces the interceptor list."""

    def configure_replayer(self, config):
        return {**super().configure_replayer(config), "interceptors": []}


def make_dropper():
    return InterceptorDropper("dropper")
'''
UNSANDBOXED = "temporalio.worker:UnsandboxedWorkflowRunner"


class Agent:
    """The agent's module and the saved histories of one run of each workflow."""

    def __init__(self, root: Path, ids: dict[str, str]) -> None:
        self.root, self.ids = root, ids

    def check(self, workflow: str, runner: str | None = None, strict: bool = True, plugins: tuple[str, ...] = (),
              ignore: tuple[str, ...] = ()):
        run_dir = self.root / f"run-{uuid.uuid4().hex[:6]}"
        (run_dir / EVENT_HISTORIES).mkdir(parents=True)
        wid = self.ids[workflow]
        shutil.copytree(self.root / "histories" / wid, run_dir / EVENT_HISTORIES / wid)
        write_json(run_dir / RUN_JSON, {"schema": SCHEMA, "kind": "chaos", "name": "strict-replay"})
        target = ReplayTarget(workflow=f"{MODULE}:{workflow}", source="this test's agent", cwd=str(self.root),
                              env={"PYTHONPATH": str(self.root)}, workflow_runner=runner, strict_replay=strict,
                              replay_plugins=plugins, strict_replay_ignore=ignore)
        return check(RunData(run_dir, target)), run_dir

    def recorded_note(self, workflow: str) -> tuple[int, dict]:
        """The echo activity's scheduled event id and the argument the history recorded for it."""
        (_, history), = load_saved(self.root / "histories")[self.ids[workflow]]
        (event,) = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                    and e.activity_task_scheduled_event_attributes.activity_type.name == "echo"]
        return event.event_id, decode_payload(event.activity_task_scheduled_event_attributes.input.payloads[0])


@pytest.fixture(scope="module")
async def agent(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Agent]:
    root = tmp_path_factory.mktemp("strict-replay")
    (root / f"{MODULE}.py").write_text(AGENT)
    sys.path.insert(0, str(root))
    try:
        mod = importlib.import_module(MODULE)
        assert stack.server is not None
        client = await Client.connect(stack.server.address, namespace=stack.spec.engine.namespace)
        queue = f"strict-replay-{uuid.uuid4().hex[:8]}"
        ids = {name: f"strict-replay-{name}-{uuid.uuid4().hex[:8]}" for name in ("NonceWorkflow", "SteadyWorkflow")}
        # The default sandboxed runner, as a worker runs it: Random() is allowed there.
        async with Worker(client, task_queue=queue, workflows=[mod.NonceWorkflow, mod.SteadyWorkflow, mod.Child],
                          activities=[mod.echo, mod.shout]):
            nonce = await client.execute_workflow(mod.NonceWorkflow.run, "ada", id=ids["NonceWorkflow"],
                                                  task_queue=queue, execution_timeout=timedelta(seconds=20))
            steady = await client.execute_workflow(mod.SteadyWorkflow.run, "bo", id=ids["SteadyWorkflow"],
                                                   task_queue=queue, execution_timeout=timedelta(seconds=20))
        assert nonce.startswith("ada nonce 0.") and steady.startswith("BO NONCE 0."), (nonce, steady)
        assert await save_histories(client, list(ids.values()), root / "histories") == []
        yield Agent(root, ids)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(MODULE, None)


@pytest.mark.parametrize("runner", [None, UNSANDBOXED], ids=["sandbox", "unsandboxed"])
async def test_a_random_nonce_in_an_activity_argument_fails_strict_replay(agent: Agent, runner: str | None) -> None:
    result, _ = await asyncio.to_thread(agent.check, "NonceWorkflow", runner)
    print(result.summary)
    assert result.verdict == FAIL, result.summary
    event_id, recorded = agent.recorded_note("NonceWorkflow")
    strict = result.details["strict"]
    assert strict["mismatch_count"] == 1 and result.details["failures"] == []  # Temporal's own check passed
    (m,) = strict["mismatches"]
    assert (m["kind"], m["name"], m["event_id"], m["field"], m["argument"]) == ("activity", "echo", event_id,
                                                                                 "input", 0)
    assert f"activity 'echo' (event {event_id} of {agent.ids['NonceWorkflow']})" in result.summary
    # Both values, around their first difference: the history's is the nonce the run recorded.
    history_nonce = recorded["text"].removeprefix("ada nonce ")
    assert history_nonce[:8] in m["history"] and m["replayed"] != m["history"], m
    assert "nonce 0." in m["replayed"] and f"vs history {m['history']}" in result.summary


async def test_paths_the_target_declares_are_left_out_and_said(agent: Agent) -> None:
    result, _ = await asyncio.to_thread(agent.check, "NonceWorkflow", None, True, (), ("$.text",))
    assert result.verdict == FAIL and "input argument 0 at $.weight differs" in result.summary, result.summary
    result, _ = await asyncio.to_thread(agent.check, "NonceWorkflow", None, True, (), ("$.text", "$.weight"))
    print(result.summary)
    assert result.verdict == PASS and "left out as declared: $.text, $.weight" in result.summary, result.summary
    assert result.details["strict"]["equal"] == 1


async def test_without_strict_replay_the_same_history_passes(agent: Agent) -> None:
    """The gap this closes: Temporal's replayer alone calls the non-deterministic workflow clean."""
    result, _ = await asyncio.to_thread(agent.check, "NonceWorkflow", None, False)
    print(result.summary)
    assert result.verdict == PASS, result.summary
    assert "inputs not compared (strict_replay = false)" in result.summary
    assert result.details["strict"] == {"off": True} and result.details["strict_replay"] is False


@pytest.mark.parametrize("runner", [None, UNSANDBOXED], ids=["sandbox", "unsandboxed"])
async def test_a_deterministic_argument_passes_strict_replay(agent: Agent, runner: str | None) -> None:
    result, _ = await asyncio.to_thread(agent.check, "SteadyWorkflow", runner)
    print(result.summary)
    assert result.verdict == PASS, result.summary
    strict = result.details["strict"]
    # The activity (a dataclass argument) and the child workflow compared; the local activity only counted.
    assert (strict["compared"], strict["equal"], strict["mismatch_count"], strict["unknown_count"]) == (2, 2, 0, 0)
    assert strict["local_activities_not_compared"] == 1
    assert "2 scheduled input(s) equal to the history's; 1 local activity's input not compared" in result.summary


async def test_a_plugin_that_drops_the_recorder_makes_replay_unknown(agent: Agent) -> None:
    result, _ = await asyncio.to_thread(agent.check, "SteadyWorkflow", None, True, (f"{MODULE}:make_dropper",))
    print(result.summary)
    assert result.verdict == UNKNOWN, result.summary
    assert "inputs were not compared: a plugin's configure_replayer dropped the strict-replay interceptor" in \
        result.summary


# The comparison itself, on hand-made histories.

def json_payload(value: object, text: str | None = None) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=(text or json.dumps(value)).encode())


def scheduled(event_id: int, activity_id: str, name: str, *payloads: Payload) -> HistoryEvent:
    ev = HistoryEvent(event_id=event_id, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    a = ev.activity_task_scheduled_event_attributes
    a.activity_id, a.activity_type.name = activity_id, name
    a.input.payloads.extend(payloads)
    return ev


def call(key: str | None, name: str, *payloads: Payload, kind: str = ACTIVITY) -> ScheduledCall:
    return ScheduledCall(kind, name, key, [p.SerializeToString() for p in payloads])


def test_json_payloads_compare_by_value_and_others_by_bytes() -> None:
    assert payloads_equal(json_payload(None, '{"a": 1, "b": [1.0, NaN]}'), json_payload(None, '{"b":[1,NaN],"a":1}'))
    assert not payloads_equal(json_payload({"a": 1}), json_payload({"a": 2}))
    assert not payloads_equal(json_payload(True), json_payload(1))
    binary = Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00\x01")
    assert payloads_equal(binary, Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00\x01"))
    assert not payloads_equal(binary, Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00\x02"))
    assert not payloads_equal(binary, Payload(metadata={"encoding": b"binary/null"}, data=b"\x00\x01"))


async def test_compare_names_the_event_and_both_values_bounded_and_printable() -> None:
    long = "x" * 1000
    events = [scheduled(5, "1", "plan", json_payload({"prompt": long + "a\x1b[2J" + long})),
              scheduled(9, "2", "save", json_payload("same"))]
    found = await compare("wf", "run", events, [call("1", "plan", json_payload({"prompt": long + "b\x1b[2J" + long})),
                                                call("2", "save", json_payload("same")),
                                                call("3", "next", json_payload("past the end"))],
                          DataConverter.default)
    assert (found.compared, found.equal, found.mismatch_count, found.after_history) == (2, 1, 1, 1)
    (m,) = found.mismatches
    assert (m["event_id"], m["name"], m["argument"]) == (5, "plan", 0)
    # A window around the first difference, at most 160 characters and an ellipsis each side; escaped.
    assert len(m["replayed"]) <= 162 and m["replayed"].startswith("…x") and m["replayed"].endswith("x…")
    assert "xb\\u001b[2J" in m["replayed"] and "xa\\u001b[2J" in m["history"]
    assert "\x1b" not in m["replayed"] + m["history"]


async def test_a_type_change_or_an_unpaired_event_is_never_a_pass() -> None:
    events = [scheduled(5, "1", "plan", json_payload(1)), scheduled(7, "2", "save", json_payload(2))]
    found = await compare("wf", "run", events, [call("1", "plan_v2", json_payload(1))], DataConverter.default)
    assert found.mismatch_count == 1 and found.mismatches[0]["field"] == "type"
    assert found.unknown_count == 1 and found.unknown[0]["event_id"] == 7  # replay made no call for it
    assert "no replayed call" in found.unknown[0]["reason"]


class Tagging(PayloadCodec):
    """Prefixes a random tag, as encryption with a random nonce differs on every call; decode strips it."""

    async def encode(self, payloads):
        return [Payload(metadata={"encoding": b"binary/tagged"}, data=uuid.uuid4().bytes + p.SerializeToString())
                for p in payloads]

    async def decode(self, payloads):
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != b"binary/tagged":
                raise ValueError("not tagged")
            q = Payload()
            q.ParseFromString(p.data[16:])
            out.append(q)
        return out


async def test_a_codec_whose_output_differs_each_time_is_compared_by_what_it_encoded() -> None:
    codec = Tagging()
    converter = DataConverter(payload_codec=codec)
    (same,), (other,) = await codec.encode([json_payload("v1")]), await codec.encode([json_payload("v2")])
    events = [scheduled(5, "1", "a", same), scheduled(6, "2", "b", other), scheduled(7, "3", "c", json_payload(3))]
    found = await compare("wf", "run", events, [call("1", "a", json_payload("v1")), call("2", "b", json_payload("v1")),
                                                call("3", "c", json_payload(3))], converter)
    assert (found.compared, found.equal, found.mismatch_count) == (2, 1, 1) and found.mismatches[0]["event_id"] == 6
    assert found.unknown_count == 1 and "could not decode" in found.unknown[0]["reason"]  # event 7: not tagged


async def test_children_pair_by_workflow_id_and_calls_without_an_id_in_order() -> None:
    child = HistoryEvent(event_id=8, event_type=EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
    a = child.start_child_workflow_execution_initiated_event_attributes
    a.workflow_id, a.workflow_type.name = "wf-child", "Child"
    a.input.payloads.append(json_payload({"n": 1}))
    events = [scheduled(5, "x", "a", json_payload(1)), scheduled(6, "y", "a", json_payload(2)), child]
    found = await compare("wf", "run", events, [call(None, "a", json_payload(1)), call(None, "a", json_payload(2)),
                                                call("wf-child", "Child", json_payload({"n": 2}), kind=CHILD_WORKFLOW)],
                          DataConverter.default)
    assert (found.compared, found.mismatch_count, found.unknown_count) == (3, 1, 0)
    assert found.mismatches[0]["kind"] == "child workflow" and found.mismatches[0]["event_id"] == 8



async def test_declared_paths_are_left_out_and_a_difference_is_named_by_its_path() -> None:
    """A framework's per-replay values (Pydantic AI's message timestamps, run and conversation ids: measured on
    pydantic-ai-slim 2.68) are declared and left out; anything else still differs, named by its JSON path."""
    def request(stamp: str, prompt: str) -> Payload:
        return json_payload({"messages": [{"timestamp": stamp, "parts": [{"content": prompt, "timestamp": stamp}]}]})

    events = [scheduled(5, "1", "model_request", request("2026-01-01T00:00:00Z", "What is 6 * 7?"))]
    ignore = ["$.messages[*].timestamp", "$.messages[*].parts[*].timestamp"]
    same = [call("1", "model_request", request("2026-11-26T08:00:00Z", "What is 6 * 7?"))]
    assert (await compare("wf", "run", events, same, DataConverter.default)).mismatch_count == 1
    assert (await compare("wf", "run", events, same, DataConverter.default, ignore)).equal == 1
    other = [call("1", "model_request", request("2026-11-26T08:00:00Z", "What is 6 * 8?"))]
    found = await compare("wf", "run", events, other, DataConverter.default, ignore)
    (m,) = found.mismatches
    assert m["path"] == "$.messages[*].parts[*].content" and "6 * 8" in m["replayed"] and "6 * 7" in m["history"]
    assert "input argument 0 at $.messages[*].parts[*].content differs" in describe(m)

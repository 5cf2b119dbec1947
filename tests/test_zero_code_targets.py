"""Zero-code targets: an agent on Temporal checked from a target file alone, with no Python of the harness's.

Three tiny chat agents, written here as a third party would (``temporalio`` and ``urllib`` only, the model called
over plain HTTP in an activity), one per shape the ``[chat]`` table declares: messages as Updates (the final
conversation read from the event history, the reply at a path in the update's result), as Signals with message
ids (the conversation read from a Query; its worker hard-codes its server address and task queue), and one
workflow per message. No ready line: each worker is ready when the
server lists it polling. Each passes ``kill_mid_turn`` (shortened) on the real dev server.

Also: target-file mistakes and a driver written for another driver API version fail at load, in one line.
"""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.engines.byo.engine import OwnAgentOnTemporal
from testbed.engines.workload import Workload
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from testbed.engines.byo.target import FIELDS, check_driver, load_target

AGENTS = '''
"""Three chat agents: UpdateChat (Updates), SignalChat (Signals + a Query), Answer (one workflow per message)."""
import asyncio, json, os, sys, urllib.request
from datetime import timedelta
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def _complete(messages):
    body = json.dumps({"model": "auto", "messages": messages, "tools": [CALCULATOR]}).encode()
    req = urllib.request.Request(os.environ["MODEL_URL"] + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3) as resp:
        return json.loads(resp.read())["choices"][0]["message"]


def _answer(question):
    messages = [{"role": "user", "content": question}]
    for _ in range(4):
        msg = _complete(messages)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return msg["content"]
        for call in msg["tool_calls"]:
            try:
                a, b = json.loads(call["function"]["arguments"])["expression"].split("*")
                result = str(int(a) * int(b))
            except (ValueError, KeyError) as exc:  # an expression it cannot compute: the model is told
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise RuntimeError("no answer")


@activity.defn
async def call_llm(question: str) -> str:
    return await asyncio.to_thread(_answer, question)


def _llm(question):
    return workflow.execute_activity(call_llm, question, start_to_close_timeout=timedelta(seconds=4),
                                     retry_policy=RetryPolicy(initial_interval=timedelta(seconds=0.2)))


@workflow.defn
class UpdateChat:
    def __init__(self) -> None:
        self.done, self.turn = False, asyncio.Lock()

    @workflow.run
    async def run(self, params: dict) -> str:
        await workflow.wait_condition(lambda: self.done and workflow.all_handlers_finished())
        return "bye"

    @workflow.update
    async def send(self, text: str) -> dict:
        async with self.turn:
            return {"answer": {"text": await _llm(text)}}

    @workflow.signal
    def end(self) -> None:
        self.done = True


@workflow.defn
class SignalChat:
    def __init__(self) -> None:
        self.inbox, self.seen, self.messages, self.done = [], set(), [], False

    @workflow.run
    async def run(self) -> None:
        while True:
            await workflow.wait_condition(lambda: self.inbox or self.done)
            if not self.inbox:
                return
            text = self.inbox.pop(0)
            self.messages.append({"role": "user", "content": text})
            self.messages.append({"role": "assistant", "content": await _llm(text)})

    @workflow.signal
    def ask(self, message: dict) -> None:
        if message["id"] not in self.seen:  # a re-sent message is dropped
            self.seen.add(message["id"])
            self.inbox.append(message["text"])

    @workflow.signal
    def end(self) -> None:
        self.done = True

    @workflow.query
    def history(self) -> dict:
        return {"messages": self.messages}


@workflow.defn
class Answer:
    @workflow.run
    async def run(self, request: dict) -> dict:
        return {"reply": await _llm(request["question"])}


async def main(address, task_queue, model_url, identity=None):
    os.environ["MODEL_URL"] = model_url
    who = {"identity": identity} if identity else {}
    client = await Client.connect(address, **who)
    async with Worker(client, task_queue=task_queue, workflows=[UpdateChat, SignalChat, Answer],
                      activities=[call_llm], sticky_queue_schedule_to_start_timeout=timedelta(seconds=1), **who):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
'''

CHECKERS = ('["lost", "replies", "context", "temporal_history", "workflow_tasks", "effects", "replay", '
            '"injection_evidence", "stats"]')
#: these agents have no external effects, and say so: effects is not_applicable (declared), and the verdict can pass
COMMON = (f'model_activity = "call_llm"\ncheckers = {CHECKERS}\n'
          'effects = "none"\neffects_reason = "a calculator: nothing outside the conversation changes"\n')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def targets(root: Path) -> dict[str, str]:
    """The three target files: no driver, no ready line, no harness code."""
    port = free_port()
    python = json.dumps(sys.executable)
    return {
        "update": f'''name = "update-chat"
python = {python}
worker = ["{{python}}", "agents.py", "{{address}}", "{{task_queue}}", "{{model_url}}", "{{identity}}"]
workflow = "agents:UpdateChat"
{COMMON}
[chat]
style = "update"
workflow = "UpdateChat"
start_input = {{}}
update = "send"
reply_path = "answer.text"
end = "end"
''',
        # Its worker hard-codes where Temporal is and its task queue: the fault proxy is put at that address.
        "signal": f'''name = "signal-chat"
python = {python}
worker = ["{{python}}", "agents.py", "127.0.0.1:{port}", "signal-chat-queue", "{{model_url}}", "{{identity}}"]
address = "127.0.0.1:{port}"
task_queue = "signal-chat-queue"
workflow = "agents:SignalChat"
{COMMON}
[chat]
style = "signal"
workflow = "SignalChat"
signal = "ask"
message_arg = {{ id = "{{message_id}}", text = "{{text}}" }}
query = "history"
conversation_path = "messages"
end = "end"
''',
        # Its worker takes no {identity}: the SDK's default, <pid>@<hostname>, is what the server lists and what
        # the harness must find (readiness, aimed kills, the kill's record that injection_evidence matches).
        "per_message": f'''name = "answer-per-message"
python = {python}
worker = ["{{python}}", "agents.py", "{{address}}", "{{task_queue}}", "{{model_url}}"]
workflow = "agents:Answer"
{COMMON}
[chat]
style = "workflow_per_message"
workflow = "Answer"
start_input = {{ question = "{{text}}" }}
reply_path = "reply"
''',
    }


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    d = tmp_path / "agent"
    d.mkdir()
    (d / "agents.py").write_text(textwrap.dedent(AGENTS))
    for name, text in targets(d).items():
        (d / f"{name}.toml").write_text(text)
    return d


def test_chat_tables_load(agent_dir: Path) -> None:
    t = load_target(agent_dir / "signal.toml")
    assert t.ready_line is None and t.address and t.task_queue == "signal-chat-queue"
    assert t.chat["style"] == "signal" and t.chat["message_arg"] == {"id": "{message_id}", "text": "{text}"}
    assert t.driver == "harness.chat_driver:make_driver"
    assert "one scenario at a time" in t.as_dict()["one_at_a_time"]


@pytest.mark.parametrize("edit, says", [
    (lambda s: s.replace('update = "send"\n', ""), "[chat] style 'update' needs update"),
    (lambda s: s.replace('style = "update"', 'style = "updates"'), "'style' must be one of update, signal"),
    (lambda s: s + 'colour = "blue"\n', "unknown field 'colour'"),
    (lambda s: s.replace("[chat]", 'driver = "x:make"\n[chat]'), "not both"),
    (lambda s: s.replace('update = "send"', 'update = "send"\nmessage_arg = "{message_id}"'),
     "message_arg must hold {text}"),
    (lambda s: s.replace('"{address}", ', ""), "'worker' must use {address} and {task_queue}"),
    (lambda s: s.replace("[chat]", 'address = "10.0.0.1:7233"\n[chat]'), "'address' must be 127.0.0.1:PORT"),
], ids=["update-without-update", "bad-style", "unknown-chat-field", "driver-and-chat", "no-text",
        "no-address", "remote-address"])
def test_target_file_mistakes_are_one_line(agent_dir: Path, edit: object, says: str) -> None:
    path = agent_dir / "update.toml"
    path.write_text(edit(path.read_text()))  # type: ignore[operator]
    with pytest.raises(ValueError) as exc:
        load_target(path)
    message = str(exc.value)
    assert says in message and str(path) in message and "\n" not in message, message


DRIVERS = {
    "old_version": "DRIVER_API = 1\ndef make_driver(*, client, history, task_queue, workload, seed):\n    pass\n",
    "old_signature": "def make_driver(client, history, task_queue, workload):\n    pass\n",
}


@pytest.mark.parametrize("module, says", [
    ("old_version", "it declares DRIVER_API = 1, this harness speaks version 3 (since version 2 the workload is a "
                    "dataclass"),
    ("old_signature", "it lacks seed"),
])
def test_a_driver_for_another_api_version_fails_at_load_in_one_line(agent_dir: Path, module: str, says: str) -> None:
    (agent_dir / f"{module}.py").write_text(DRIVERS[module])
    path = agent_dir / "own.toml"
    path.write_text((agent_dir / "update.toml").read_text().split("[chat]")[0] + f'driver = "{module}:make_driver"\n')
    target = load_target(path)
    with pytest.raises(ValueError) as exc:
        check_driver(target)
    assert says in str(exc.value) and "\n" not in str(exc.value), exc.value


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", ["update", "signal", "per_message"])
async def test_a_zero_code_target_passes_kill_mid_turn(agent_dir: Path, tmp_path: Path, shape: str) -> None:
    path = agent_dir / f"{shape}.toml"
    target = load_target(path)
    scenario = replace(SCENARIOS["kill_mid_turn"], workload=Workload(conversations=2, messages=3, append_ratio=0.0),
                       fault_s=5.0)
    result = await run(scenario, OwnAgentOnTemporal(target, target_file=path), seed=1, out_root=tmp_path / "runs")
    by = {c.name: c for c in result.checks}
    report = json.dumps([c.as_dict() for c in result.checks], indent=1, default=str)[:4000]
    print(f"{shape}: {result.verdict}; " + "; ".join(f"{c.name} {c.verdict}" for c in result.checks))
    assert result.verdict == "pass", f"run dir {result.run_dir}:\n{report}"
    assert by["effects"].verdict == "not_applicable" and by["effects"].summary.startswith("declared: ")
    # Every message is a task (the agents declare no effect convention): the model's record judges the replies.
    assert by["replies"].details["acknowledged"] >= 4 and by["replies"].verdict == "pass", by["replies"].details
    assert by["context"].verdict == "pass" and by["context"].details["requests_checked"] >= 8, by["context"].details
    landed = by["injection_evidence"].details["faults"]
    assert any(f["f"] == "kill_worker" and f["landed"] for f in landed), landed
    assert by["injection_evidence"].verdict == "pass", by["injection_evidence"].as_dict()
    if shape == "per_message":  # the SDK's default identity: each kill names the process as the server saw it
        ops = [json.loads(line) for line in (result.run_dir / "operations.jsonl").read_text().splitlines()]
        kills = [o["value"] for o in ops if o["f"] == "kill_worker" and o["type"] == "ok"]
        assert kills and all(k["identity"].endswith(f"@{socket.gethostname()}") for k in kills), kills
        assert any(k["evidence"] for k in kills), kills  # an aimed kill found its moment (not a fallback kill)
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["target"]["chat"]["style"] == target.chat["style"]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_third_party_example_needs_no_driver(tmp_path: Path) -> None:
    """examples/third_party_agent driven by its zero-code target file: the harness's [chat] driver over its Signals
    and Query, its appends read back through its workspace, its effects through its ledger."""
    path = Path(__file__).resolve().parent.parent / "examples" / "third_party_agent" / "chaos-target-zero-code.toml"
    target = load_target(path)
    scenario = replace(SCENARIOS["kill_mid_turn"], workload=Workload(conversations=2, messages=3, append_ratio=0.5),
                       fault_s=5.0)
    result = await run(scenario, OwnAgentOnTemporal(target, target_file=path), seed=1, out_root=tmp_path)
    by = {c.name: c for c in result.checks}
    print("calc-agent (zero code): " + "; ".join(f"{c.name} {c.verdict}" for c in result.checks))
    report = json.dumps([c.as_dict() for c in result.checks], indent=1, default=str)[:4000]
    assert result.verdict == "pass", f"run dir {result.run_dir}:\n{report}"
    assert by["lost"].details["acknowledged"] >= 4 and by["effects"].details["logical_effects_applied"] >= 1
    statements = json.loads((result.run_dir / "conversations.json").read_text())["statements"]
    assert "not re-sent" in statements[0]  # its signals carry no message id: said in the run


def test_a_conversation_of_lines_is_read_with_no_convention_of_the_agents() -> None:
    """A Query returning lines ("User: ...", "Triage Agent: ...") is read by what the driver sent: a line holding
    a sent text is that user message, any other line (a handoff note, a tool's output, a reply) the agent's."""
    from harness.chat_driver import as_messages, reply_after

    first, second = "Please take care of request req-a1b2c3-0-0.", "Please take care of request req-a1b2c3-0-1."
    lines = [f"User: {first}", "Triage Agent: Handed off to tool transfer_to_seat_booking_agent",
             "Handed off from Triage Agent to Seat Booking Agent", "Seat Booking Agent: Calling a tool",
             "Seat Booking Agent: Request req-a1b2c3-0-0 is done.", f"User: {second}",
             "Seat Booking Agent: Request req-a1b2c3-0-1 is done."]
    messages = as_messages(lines, None, {first, second})
    assert [m["role"] for m in messages] == ["user"] + ["assistant"] * 4 + ["user", "assistant"]
    assert [m["content"] for m in messages] == lines
    assert reply_after(messages, first, 1, token="req-a1b2c3-0-0") == "Seat Booking Agent: Request req-a1b2c3-0-0 is done."
    assert reply_after(messages, second, 1, token="req-a1b2c3-0-1") == "Seat Booking Agent: Request req-a1b2c3-0-1 is done."
    # no prefix is taken for a role: with nothing sent, every line is the agent's, and other items are dropped
    assert {m["role"] for m in as_messages(lines + [7, None], None)} == {"assistant"}
    assert as_messages([{"role": "user", "content": first}, {"x": 1}], None, {first}) == [
        {"role": "user", "content": first}]

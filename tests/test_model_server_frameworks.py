"""The scripted model as agent frameworks call it: the real ``openai`` client (the one the OpenAI Agents SDK
drives) against the real server over HTTP, on the Responses API and chat completions, whole and streamed, with
faults. What frameworks send by default must work without configuring them away from it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from testbed.faults.model import FaultRule
from testbed.model_server import ScriptedModelServer
from testbed.scripted_routes import respond

NOTE_TOKEN = "note-3-041527;"
NOTE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
               "additionalProperties": False}
RESPONSES_NOTE_TOOL = {"type": "function", "name": "save_note", "description": "Save a note.",
                       "parameters": NOTE_SCHEMA, "strict": True}
CHAT_NOTE_TOOL = {"type": "function", "function": {"name": "save_note", "description": "Save a note.",
                                                   "parameters": NOTE_SCHEMA}}


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(respond) as s:
        yield s


def client(server: ScriptedModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="any-string", max_retries=0, timeout=10)


def collect_response_stream(stream: Any) -> tuple[list[str], Any]:
    """Event types in order, and the final Response of ``response.completed``."""
    types, final = [], None
    for event in stream:
        types.append(event.type)
        if event.type == "response.completed":
            final = event.response
    return types, final


# --------------------------------------------------------------------------- Responses API


def test_responses_tool_round_trip_whole(server: ScriptedModelServer) -> None:
    api = client(server)
    user = {"role": "user", "content": [{"type": "input_text", "text": f"save the note '{NOTE_TOKEN}'"}]}
    first = api.responses.create(model="gpt-4.1-mini", input=[user], tools=[RESPONSES_NOTE_TOOL],
                                 instructions="You save notes.")
    print("first output:", [item.model_dump() for item in first.output])
    assert first.status == "completed" and first.id.startswith("resp_")
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "save_note" and json.loads(call.arguments) == {"text": NOTE_TOKEN}
    assert first.usage.input_tokens > 0 and first.usage.total_tokens > first.usage.input_tokens
    # the Agents SDK sends the model's items back as they came, then the tool's output
    second = api.responses.create(
        model="gpt-4.1-mini", tools=[RESPONSES_NOTE_TOOL], instructions="You save notes.",
        input=[user, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"note_id": "n-1", "text": NOTE_TOKEN, "replayed": False})}])
    print("second output_text:", second.output_text)
    assert second.output_text == f"saved note {NOTE_TOKEN}"
    assert [item.type for item in second.output] == ["message"]


def test_responses_tool_round_trip_streamed(server: ScriptedModelServer) -> None:
    api = client(server)
    user = {"role": "user", "content": f"save the note '{NOTE_TOKEN}'"}
    types, first = collect_response_stream(api.responses.create(
        model="anything-at-all", input=[user], tools=[RESPONSES_NOTE_TOOL], stream=True))
    print("first stream:", types)
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"text": NOTE_TOKEN}
    # a failed tool: the model says so, with the reason
    types, second = collect_response_stream(api.responses.create(
        model="anything-at-all", tools=[RESPONSES_NOTE_TOOL], stream=True,
        input=[user, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "An error occurred while running the tool: 503 Service Unavailable"}]))
    print("second stream:", types)
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * (len(types) - 8),
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert second.output_text == (f"could not save note {NOTE_TOKEN}: An error occurred while running the tool: "
                                  "503 Service Unavailable")


def test_responses_stream_sequence_numbers_and_item_reference(server: ScriptedModelServer) -> None:
    """Raw SSE: ``event:`` names match the data's type, sequence numbers count up from 0; an ``item_reference``
    to an earlier answer (the AI SDK's default with ``store: true``) stands for that answer."""
    body = {"model": "gpt-4o", "input": "What is 6 * 7?", "stream": True, "tools": [RESPONSES_NOTE_TOOL]}
    text = httpx.post(f"{server.url}/responses", json=body, timeout=10).text
    frames = [f for f in text.split("\n\n") if f.strip()]
    events = []
    for frame in frames:
        name_line, data_line = frame.split("\n")
        event = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {event['type']}"
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "6 * 7 = 42"
    reference = {"type": "item_reference", "id": final["output"][0]["id"]}
    again = httpx.post(f"{server.url}/responses", timeout=10, json={
        "model": "gpt-4o", "input": [{"role": "user", "content": "What is 6 * 7?"}, reference,
                                     {"role": "user", "content": "what did I say first?"}]}).json()
    print("after a reference:", again["output"][0]["content"][0]["text"])
    assert again["output"][0]["content"][0]["text"] == "Your first message was: 'What is 6 * 7?'"
    bad = httpx.post(f"{server.url}/responses", timeout=10,
                     json={"model": "gpt-4o", "input": [{"type": "item_reference", "id": "msg_forged"}]})
    assert bad.status_code == 400 and "item_reference" in bad.json()["error"]["message"]


# --------------------------------------------------------------------------- chat completions


def test_chat_stream_tool_call_deltas_reassemble(server: ScriptedModelServer) -> None:
    api = client(server)
    stream = api.chat.completions.create(
        model="some-framework-default", stream=True, stream_options={"include_usage": True},
        tools=[CHAT_NOTE_TOOL],
        messages=[{"role": "user", "content": [{"type": "text", "text": f"save the note '{NOTE_TOKEN}'"}]}])
    calls: dict[int, dict[str, str]] = {}
    finish, usage = None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""
    print("reassembled:", calls, finish, usage)
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "save_note" and json.loads(calls[0]["arguments"]) == {"text": NOTE_TOKEN}
    assert usage is not None and usage.total_tokens > 0
    # the whole (non-streamed) answer after the tool result, content given as parts
    done = api.chat.completions.create(model="some-framework-default", tools=[CHAT_NOTE_TOOL], messages=[
        {"role": "user", "content": [{"type": "text", "text": f"save the note '{NOTE_TOKEN}'"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0]["id"], "type": "function",
             "function": {"name": "save_note", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": [{"type": "text", "text": '{"note_id": "n-1"}'}]},
    ])
    assert done.choices[0].message.content == f"saved note {NOTE_TOKEN}"


def test_chat_stream_text_and_unknown_model_name(server: ScriptedModelServer) -> None:
    api = client(server)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in api.chat.completions.create(
        model="gpt-5-nano", stream=True, messages=[{"role": "user", "content": "What is 123 * 45?"}])
        if chunk.choices)
    print("streamed text:", text)
    assert text == "123 * 45 = 5535"
    assert server.stats()["by_scenario"] == {"gpt-5-nano": 1}


def test_arithmetic_keeps_the_calculator_when_one_is_declared(server: ScriptedModelServer) -> None:
    calculator = {"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}}}}
    answer = client(server).chat.completions.create(
        model="scripted", tools=[calculator, CHAT_NOTE_TOOL], messages=[{"role": "user", "content": "What is 25 * 4?"}])
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "25 * 4"}


def test_scenario_names_still_route(server: ScriptedModelServer) -> None:
    """``scripted:<scenario>`` reaches the server as ``openai/<scenario>`` or ``<scenario>``: its route answers."""
    for model in ("openai/shell", "shell"):
        answer = client(server).chat.completions.create(model=model, messages=[{"role": "user", "content": "go"}])
        assert answer.choices[0].message.tool_calls[0].function.name == "bash"


# --------------------------------------------------------------------------- faults on every path


@pytest.mark.parametrize("api_name", ["chat", "responses"])
def test_stream_cut_leaves_the_client_an_incomplete_stream(api_name: str) -> None:
    with ScriptedModelServer(respond, faults=[FaultRule.parse("stream_cut,first_n=1")]) as server:
        api = client(server)

        def stream() -> Any:
            if api_name == "chat":
                return api.chat.completions.create(model="gpt-4o", stream=True,
                                                   messages=[{"role": "user", "content": "What is 6 * 7?"}])
            return api.responses.create(model="gpt-4o", stream=True, input="What is 6 * 7?")

        seen: list[Any] = []
        with pytest.raises((httpx.RemoteProtocolError, openai.APIConnectionError)) as caught:
            for item in stream():
                seen.append(item)
        print(f"{api_name}: {len(seen)} event(s) before the cut: {caught.value!r}")
        assert seen, "the cut comes after some events"
        if api_name == "responses":
            assert "response.completed" not in [e.type for e in seen]
        else:
            assert all(c.choices[0].finish_reason is None for c in seen if c.choices)
        assert len(list(stream())) > len(seen)  # first_n=1: the next request gets the whole stream
        assert server.stats()["faults_applied"] == {"stream_cut": 1}


def test_stream_cut_on_a_whole_answer() -> None:
    with ScriptedModelServer(respond, faults=[FaultRule.parse("stream_cut,first_n=1")]) as server:
        with pytest.raises((httpx.RemoteProtocolError, openai.APIConnectionError)):
            client(server).responses.create(model="gpt-4o", input="What is 6 * 7?")


def test_status_fault_on_responses_whole_and_streamed() -> None:
    with ScriptedModelServer(respond, faults=[FaultRule.parse("status:503,first_n=2")]) as server:
        api = client(server)
        with pytest.raises(openai.InternalServerError) as whole:
            api.responses.create(model="gpt-4o", input="hi")
        with pytest.raises(openai.InternalServerError) as streamed:
            api.responses.create(model="gpt-4o", input="hi", stream=True)
        print("whole:", whole.value.status_code, "streamed:", streamed.value.status_code)
        assert whole.value.status_code == streamed.value.status_code == 503
        assert api.responses.create(model="gpt-4o", input="What is 2 + 3?").output_text == "2 + 3 = 5"


def test_malformed_faults_on_streams() -> None:
    rules = [FaultRule.parse("malformed_output,first_n=1"), FaultRule.parse("malformed_json,first_n=1")]
    with ScriptedModelServer(respond, faults=rules) as server:
        api = client(server)
        types, final = collect_response_stream(api.responses.create(
            model="gpt-4o", input="hi", tools=[RESPONSES_NOTE_TOOL], stream=True))
        [call] = final.output
        with pytest.raises(ValueError):
            json.loads(call.arguments)  # a tool call whose arguments are not JSON
        with pytest.raises(Exception) as garbage:
            list(api.chat.completions.create(model="gpt-4o", stream=True, messages=[{"role": "user", "content": "hi"}]))
        print("malformed stream:", repr(garbage.value)[:120])
        assert isinstance(garbage.value, (ValueError, openai.APIError))


@pytest.mark.parametrize(("result", "reply"), [
    ('{"note_id": "n-503", "text": "note-3-041527;", "replayed": false}', f"saved note {NOTE_TOKEN}"),
    ("saved", f"saved note {NOTE_TOKEN}"),
    ("503 Service Unavailable", f"could not save note {NOTE_TOKEN}: 503 Service Unavailable"),  # the AI SDK's
    ("An error occurred while running the tool. Please try again. Error: boom",  # the Agents SDK's
     f"could not save note {NOTE_TOKEN}: An error occurred while running the tool. Please try again. Error: boom"),
    ('{"error": "text must be a string"}', f'could not save note {NOTE_TOKEN}: {{"error": "text must be a string"}}'),
])
def test_note_reply_follows_the_tool_result(server: ScriptedModelServer, result: str, reply: str) -> None:
    user = {"role": "user", "content": f"save the note '{NOTE_TOKEN}'"}
    call = {"type": "function_call", "call_id": "call_7", "name": "save_note",
            "arguments": json.dumps({"text": NOTE_TOKEN})}
    answer = client(server).responses.create(model="gpt-4o", tools=[RESPONSES_NOTE_TOOL], input=[
        user, call, {"type": "function_call_output", "call_id": "call_7", "output": result}])
    assert answer.output_text == reply


def test_note_without_a_note_tool_says_so(server: ScriptedModelServer) -> None:
    answer = client(server).responses.create(model="gpt-4o", input=f"save the note '{NOTE_TOKEN}'", tools=[
        {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}])
    assert answer.output_text == f"could not save note {NOTE_TOKEN}: no declared tool saves notes (declared: lookup)"

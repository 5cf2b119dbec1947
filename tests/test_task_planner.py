"""The scripted model exercises an agent's own tools (issue 41, item 1): a task (a message carrying a token) is
planned over whatever tools the request declares, with arguments valid against each tool's JSON schema, and
ends in a final answer carrying the token; the model server records what it saw and said.

Over the real server with the OpenAI client: chat completions and the Responses API, whole and streamed."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel

from harness.model_record import final_text, make_token
from testbed.model_server import ScriptedModelServer
from testbed.scripted_routes import respond
from testbed.task_planner import draw, plan

TOKEN = make_token("abc123", 0, 1)


class Kind(str, Enum):
    adult, child, infant = "adult", "child", "infant"


class Traveller(BaseModel):
    name: str
    kind: Kind
    ages: list[int] = []


class DateRange(BaseModel):
    start: str
    nights: int


class TripRequest(BaseModel):
    travellers: list[Traveller]
    dates: DateRange
    note: str | None = None


class Answer(BaseModel):
    summary: str
    confidence: float


def tool(name: str, schema: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


class PlanTripArgs(BaseModel):
    request: TripRequest


TRIP = tool("plan_trip", PlanTripArgs.model_json_schema())  # as Pydantic AI declares a tool: $defs at the root
SEAT = tool("update_seat", {"type": "object", "properties": {"confirmation": {"type": "string"},
                                                              "seat": {"type": "string", "pattern": "^[0-9]{1,2}[A-F]$"}},
                            "required": ["confirmation", "seat"], "additionalProperties": False})
HANDOFFS = [tool("transfer_to_faq_agent", {"type": "object", "properties": {}, "additionalProperties": False}),
            tool("transfer_to_seat_agent", {"type": "object", "properties": {}, "additionalProperties": False})]


def turn(tools: list[dict], token: str = TOKEN, response_format: dict | None = None, limit: int = 8) -> list[dict]:
    """The model's messages of one turn, each tool call answered "ok" (the model goes on whatever the result)."""
    messages = [{"role": "system", "content": "an agent we did not write"},
                {"role": "user", "content": f"Please take care of request {token}."}]
    said = []
    for _ in range(limit):
        body = {"model": "gpt-4o", "messages": messages, "tools": tools}
        if response_format:
            body["response_format"] = response_format
        answer = respond(body)
        said.append(answer)
        messages.append(answer)
        if not answer.get("tool_calls") or answer["tool_calls"][0]["function"]["name"] == "final_result":
            return said
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in answer["tool_calls"]]
    raise AssertionError(f"no final answer in {limit} steps: {said}")


@pytest.mark.parametrize("n", range(12))
def test_every_call_is_valid_against_its_tools_schema_and_the_turn_ends_carrying_the_token(n: int) -> None:
    token = make_token("abc123", n % 3, n)
    said = turn([TRIP, SEAT], token)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (TRIP, SEAT)}
    for message in said[:-1]:
        for call in message["tool_calls"]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
    assert said[-1] == {"role": "assistant", "content": final_text(token)}
    assert len(said) - 1 <= 3  # at most three steps, then the answer


def test_a_turn_is_a_pure_function_of_the_conversation() -> None:
    assert turn([TRIP, SEAT]) == turn([TRIP, SEAT])  # a retried or replayed call sees the same model
    ids = [c["id"] for m in turn([TRIP, SEAT]) for c in m.get("tool_calls") or []]
    assert len(ids) == len(set(ids))
    plans = {json.dumps(turn([TRIP, SEAT], make_token("abc123", 0, n))) for n in range(8)}
    assert len(plans) > 1  # the plan is the token's: tasks differ


def test_parallel_calls_and_enums_and_arrays_appear_across_tokens() -> None:
    calls = [m["tool_calls"] for n in range(30) for m in turn([TRIP, SEAT], make_token("def456", 1, n))[:-1]]
    assert any(len(c) == 2 for c in calls), "no step made two calls at once"
    trips = [json.loads(c["function"]["arguments"]) for cs in calls for c in cs if c["function"]["name"] == "plan_trip"]
    kinds = {t["kind"] for trip in trips for t in trip["request"]["travellers"]}
    assert kinds and kinds <= {"adult", "child", "infant"}


def test_a_handoff_comes_first_once_then_the_new_agents_tools() -> None:
    handed = 0
    for n in range(20):
        token = make_token("abc123", 2, n)
        first = respond({"model": "x", "messages": [{"role": "user", "content": token}], "tools": HANDOFFS + [SEAT]})
        if first.get("tool_calls") and first["tool_calls"][0]["function"]["name"].startswith("transfer_to_"):
            handed += 1
            # The sub-agent sees the handoff in its history and its own tools (and one back to triage): no second
            messages = [{"role": "user", "content": token}, first,
                        {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "{'assistant': 'x'}"}]
            nxt = respond({"model": "x", "messages": messages, "tools": [HANDOFFS[0], SEAT]})
            assert not any(c["function"]["name"].startswith("transfer_to_") for c in nxt.get("tool_calls") or [])
    assert 8 <= handed <= 19  # most tokens hand off, not all


def test_structured_output_and_an_output_tool_carry_the_token() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "Answer", "schema": Answer.model_json_schema()}}
    final = turn([SEAT], response_format=fmt)[-1]
    obj = json.loads(final["content"])
    jsonschema.validate(obj, Answer.model_json_schema())
    assert obj["summary"] == final_text(TOKEN)
    output = tool("final_result", Answer.model_json_schema())
    final = turn([SEAT, output])[-1]
    call = final["tool_calls"][0]
    assert call["function"]["name"] == "final_result"
    assert json.loads(call["function"]["arguments"])["summary"] == final_text(TOKEN)


def test_messages_without_a_token_keep_the_scripted_conventions() -> None:
    calc = tool("calculator", {"type": "object", "properties": {"expression": {"type": "string"}}})
    answer = respond({"model": "x", "messages": [{"role": "user", "content": "What is 6 * 7?"}], "tools": [calc]})
    assert answer["tool_calls"][0]["function"]["name"] == "calculator"
    assert plan([{"role": "user", "content": "What is 6 * 7?"}], [calc]) is None


def test_draws_are_seeded_and_valid() -> None:
    schema = TRIP["function"]["parameters"]
    assert draw(schema, "s1") == draw(schema, "s1")
    for seed in range(20):
        jsonschema.validate(draw(schema, f"s{seed}"), schema)


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_task_over_the_real_server_with_the_openai_client(tmp_path: Path, api: str, stream: bool) -> None:
    """The OpenAI client, as frameworks use it: tools on both APIs, whole and streamed; the record has each
    request, the final one with the mark a reply must carry."""
    import openai

    record = tmp_path / "model_record.jsonl"
    with ScriptedModelServer(respond, record=record) as server:
        client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
        token = make_token("feed00", 0, 0)
        text = _chat_turn(client, token, stream) if api == "chat" else _responses_turn(client, token, stream)
    assert text == final_text(token)
    entries = [json.loads(line) for line in record.read_text().splitlines()]
    assert entries and all(e["token"] == token and e["api"] == api and e["stream"] == stream for e in entries)
    assert entries[-1]["final"] and entries[-1]["mark"] == final_text(token)
    assert [e["step"] for e in entries] == list(range(len(entries)))


def _chat_turn(client, token: str, stream: bool) -> str:
    messages: list = [{"role": "user", "content": f"Please take care of request {token}."}]
    for _ in range(6):
        if stream:
            calls: dict[int, dict] = {}
            content = ""
            for chunk in client.chat.completions.create(model="gpt-4o", messages=messages, tools=[TRIP, SEAT],
                                                        stream=True):
                delta = chunk.choices[0].delta if chunk.choices else None
                content += (delta.content or "") if delta else ""
                for tc in (delta.tool_calls or []) if delta else []:
                    c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    c["id"] = tc.id or c["id"]
                    c["name"] += (tc.function.name or "") if tc.function else ""
                    c["arguments"] += (tc.function.arguments or "") if tc.function else ""
            tool_calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"],
                                                                           "arguments": c["arguments"]}}
                          for _, c in sorted(calls.items())]
        else:
            msg = client.chat.completions.create(model="gpt-4o", messages=messages, tools=[TRIP, SEAT]).choices[0].message
            content, tool_calls = msg.content or "", [tc.model_dump() for tc in msg.tool_calls or []]
        if not tool_calls:
            return content
        messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in tool_calls]
    raise AssertionError("no final answer")


def _responses_turn(client, token: str, stream: bool) -> str:
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in (TRIP, SEAT)]
    items: list = [{"role": "user", "content": f"Please take care of request {token}."}]
    for _ in range(6):
        if stream:
            final = None
            for event in client.responses.create(model="gpt-4o", input=items, tools=tools, stream=True):
                if event.type == "response.completed":
                    final = event.response
            response = final
        else:
            response = client.responses.create(model="gpt-4o", input=items, tools=tools)
        calls = [o for o in response.output if o.type == "function_call"]
        if not calls:
            return response.output_text
        for c in calls:
            items.append({"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments})
            items.append({"type": "function_call_output", "call_id": c.call_id, "output": "ok"})
    raise AssertionError("no final answer")

"""A run's transcript: what the model was told (environment state included) and what it did.

The conversation comes from the workflow's ``get_history`` query; the
environment state the model saw before each of its answers comes from the
``plan_next_action`` results recorded in the Temporal history (the state is
shown to the model but never stored in the conversation).
"""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client


async def plan_states(client: Client, workflow_id: str, run_id: str | None = None) -> list[str | None]:
    """The environment state of each completed planning call, in order (None: no environment)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    scheduled: dict[int, str] = {}
    states: list[str | None] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if scheduled.get(attrs.scheduled_event_id) != "plan_next_action" or not attrs.result.payloads:
                continue
            out: dict[str, Any] = json.loads(attrs.result.payloads[0].data)
            states.append(out.get("env_state"))
    return states


def render(messages: list[dict[str, Any]], states: list[str | None]) -> str:
    lines: list[str] = []
    answers = 0
    for m in messages:
        role = m["role"]
        if role == "system":
            continue
        if role == "user":
            lines.append(f"USER: {m['content']}")
        elif role == "assistant":
            state = states[answers] if answers < len(states) else None
            answers += 1
            if state:
                lines.append("  ENVIRONMENT STATE (shown to the model):")
                lines.extend(f"  | {line}" for line in state.splitlines())
            for call in m.get("tool_calls") or []:
                lines.append(f"MODEL calls {call['function']['name']}({call['function']['arguments']})")
            if m.get("content"):
                lines.append(f"MODEL: {m['content']}")
        elif role == "tool":
            lines.append(f"TOOL {m.get('name', '')}: " + str(m["content"]).replace("\n", "\n    "))
    return "\n".join(lines)


async def transcript(client: Client, workflow_id: str) -> str:
    """The latest run's transcript (the conversation is carried across continue-as-new; states of this run)."""
    handle = client.get_workflow_handle(workflow_id)
    messages = await handle.query("get_history")
    return render(messages, await plan_states(client, workflow_id))

"""The notes agent: a Pydantic AI agent made durable on Temporal by its ``TemporalDurability`` capability.

Its model is what ``openai:<name>`` means (Pydantic AI's default OpenAI model class, the Responses API)
at the endpoint in ``OPENAI_BASE_URL`` (unset: OpenAI's). Every model request and every tool call runs as a
Temporal activity the capability generates. Its one tool, ``save_note``, saves a note with the notes
service under an idempotency key that is the same for every retry of one tool call, so a retried call
never saves a note twice.

``NOTES_AGENT_BUG`` plants a bug, to see a chaos test catch it (unset in normal use):
``no-idempotency-key`` sends the note without its key; ``swallow-tool-failure`` answers a failed save
as if it had succeeded.
"""

from __future__ import annotations

import os
from datetime import timedelta

import httpx
from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.models.openai import OpenAIResponsesModel
from temporalio import activity
from temporalio.workflow import ActivityConfig

agent = Agent(
    # What "openai:<name>" means, built here, where the worker imports this module: a name resolved in
    # workflow code imports Pydantic AI's OpenAI model module inside Temporal's sandbox, where it fails
    # (AttributeError: module 'openai.types.responses' has no attribute 'response_output_text').
    OpenAIResponsesModel(os.environ.get("CHAT_MODEL", "gpt-4.1-mini")),
    name="notes_agent",
    instructions="You are a helpful assistant. When asked to save a note, save it with the save_note tool.",
    capabilities=[TemporalDurability(
        # Every activity heartbeats in the background: a worker that dies mid call is noticed in 5 s, not 60.
        activity_config=ActivityConfig(start_to_close_timeout=timedelta(seconds=60),
                                       heartbeat_timeout=timedelta(seconds=5)),
    )],
)


@agent.tool_plain
async def save_note(text: str) -> str:
    """Save a note for the user.

    Args:
        text: the note, exactly as the user gave it.
    """
    bug = os.environ.get("NOTES_AGENT_BUG", "")
    info = activity.info()  # the tool runs inside the activity Pydantic AI schedules for it
    headers = {}
    if bug != "no-idempotency-key":
        # The same for every attempt of this tool call (and only for it): a retry is recognised as a repeat.
        headers["Idempotency-Key"] = f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.post(f"{os.environ['NOTES_URL'].rstrip('/')}/v1/notes", headers=headers,
                                         json={"text": text, "conversation": info.workflow_id})
        response.raise_for_status()
    except httpx.HTTPError as exc:
        if bug == "swallow-tool-failure":
            return "note saved"  # the planted bug: neither the model nor Temporal learns that the save failed
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code < 500:
            # Refused: asking again would not change that, so the model is told and tells the user.
            return f"ERROR: the notes service refused the note ({exc.response.status_code}): {exc.response.text[:200]}"
        raise  # unreachable or failing (5xx): the activity fails and Temporal retries it
    return f"saved note {response.json()['note_id']}"

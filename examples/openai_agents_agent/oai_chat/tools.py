"""The agent's one tool, ``save_note``: a Temporal activity that saves a note with the notes service.

The note goes out under an idempotency key that is the same for every retry of one tool call (and
only for it), so a retried call never saves a note twice. The service's base URL is ``NOTES_URL``.

``NOTES_AGENT_BUG`` plants a bug, to see a chaos test catch it (unset in normal use):
``no-idempotency-key`` sends the note without its key; ``swallow-tool-failure`` answers a failed save
as if it had succeeded.
"""

from __future__ import annotations

import os

import httpx
from temporalio import activity

BUGS = ("no-idempotency-key", "swallow-tool-failure")


@activity.defn
async def save_note(text: str) -> str:
    """Save a note for the user.

    Args:
        text: the note, exactly as the user gave it.
    """
    bug = os.environ.get("NOTES_AGENT_BUG", "")
    info = activity.info()
    headers = {}
    if bug != "no-idempotency-key":
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

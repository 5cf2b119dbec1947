"""The chat workflow: one conversation with an OpenAI Agents SDK agent, one user message per Update.

    start ChatWorkflow(ChatInput(turns_per_run=20))
    update send("save the note 'milk'")  -> "saved note milk"
    query  messages                       -> [{"role": "user", "content": ...}, {"role": "assistant", ...}]
    signal end                            -> the workflow completes, its result the conversation

``OpenAIAgentsPlugin`` runs each model call as an activity; ``save_note`` is an activity made a tool with
``activity_as_tool``. The workflow keeps the run's input items (so each reply sees the whole
conversation) and continues as new after ``turns_per_run`` turns (or ``max_history_events`` history
events), carrying them over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from agents import Agent, Runner
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.openai_agents.workflow import activity_as_tool

with workflow.unsafe.imports_passed_through():  # the tool's module imports httpx; only the activity uses it
    from oai_chat.tools import save_note


REPLIES_KEPT = 50  # replies carried into the next run: enough for any client still re-sending


@dataclass
class ChatInput:
    turns_per_run: int = 20  # continue as new after this many turns...
    max_history_events: int = 0  # ...or once the run's event history is this long (0: no limit)
    model: str = "gpt-4.1-mini"  # the model name at the worker's OpenAI-compatible endpoint
    items: list[Any] = field(default_factory=list)  # the agent's input items so far (Responses API items)
    transcript: list[dict[str, str]] = field(default_factory=list)  # what the Query shows: role, content
    replies: dict[str, str] = field(default_factory=dict)  # the latest replies by update id (see send)


@workflow.defn
class ChatWorkflow:
    @workflow.init
    def __init__(self, chat: ChatInput) -> None:
        self.items = list(chat.items)
        self.transcript = list(chat.transcript)
        self.replies = dict(chat.replies)
        self.turns = 0
        self.ended = False
        self.turn_lock = asyncio.Lock()  # one turn at a time: each sees the items the previous one left
        self.agent = Agent(
            name="Notes assistant",
            instructions="You are a helpful assistant. When asked to save a note, save it with the save_note tool.",
            model=chat.model,
            tools=[activity_as_tool(save_note, start_to_close_timeout=timedelta(seconds=15),
                                    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1)))],
        )

    @workflow.run
    async def run(self, chat: ChatInput) -> list[dict[str, str]]:
        await workflow.wait_condition(lambda: self.ended or self.turns >= chat.turns_per_run or (
            0 < chat.max_history_events <= workflow.info().get_current_history_length()))
        await workflow.wait_condition(workflow.all_handlers_finished)  # no accepted message is left unanswered
        if self.ended:
            return self.transcript
        workflow.continue_as_new(replace(chat, items=self.items, transcript=self.transcript,
                                         replies=dict(list(self.replies.items())[-REPLIES_KEPT:])))

    @workflow.update
    async def send(self, text: str) -> str:
        """Answer one user message; the reply is the update's result.

        Temporal deduplicates an update id within one run only: a client that re-sends a message whose
        reply was given in the workflow task that continued as new reaches the new run, which must answer
        it from ``replies`` rather than run the turn (and its tool calls) again.
        """
        update_id = workflow.current_update_info().id
        if update_id in self.replies:
            return self.replies[update_id]
        async with self.turn_lock:
            result = await Runner.run(self.agent, self.items + [{"role": "user", "content": text}])
            self.items = result.to_input_list()
            reply = str(result.final_output)
            self.transcript += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
            self.turns += 1
            self.replies[update_id] = reply
            return reply

    @send.validator
    def _accept_send(self, text: str) -> None:
        if self.ended:
            raise ValueError("this conversation has ended; start a new one")
        if not text.strip():
            raise ValueError("empty message; send some text")

    @workflow.signal
    def end(self) -> None:
        """End the conversation: the workflow completes once the messages already accepted are answered."""
        self.ended = True

    @workflow.query
    def messages(self) -> list[dict[str, str]]:
        return self.transcript

"""The chat workflow: one conversation with the notes agent, one user message per Update.

    start ChatWorkflow(ChatInput(turns_per_run=20))
    update send("save the note 'milk'")  -> "saved note milk"
    query  messages                       -> [{"role": "user", "content": ...}, {"role": "assistant", ...}]
    signal end                            -> the workflow completes, its result the conversation

The workflow keeps the agent's message history (so each reply sees the whole conversation) and continues
as new after ``turns_per_run`` turns (or ``max_history_events`` history events), carrying the history
over, so its event history stays bounded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from pydantic_ai.messages import ModelMessage
from temporalio import workflow

with workflow.unsafe.imports_passed_through():  # the agent is built once per worker, not in every run's sandbox
    from pai_chat.agent import agent


REPLIES_KEPT = 50  # replies carried into the next run: enough for any client still re-sending


@dataclass
class ChatInput:
    turns_per_run: int = 20  # continue as new after this many turns...
    max_history_events: int = 0  # ...or once the run's event history is this long (0: no limit)
    history: list[ModelMessage] = field(default_factory=list)  # the agent's messages so far
    transcript: list[dict[str, str]] = field(default_factory=list)  # what the Query shows: role, content
    replies: dict[str, str] = field(default_factory=dict)  # the latest replies by update id (see send)


@workflow.defn
class ChatWorkflow:
    __pydantic_ai_agents__ = [agent]  # PydanticAIPlugin registers the activities of the agents listed here

    @workflow.init
    def __init__(self, chat: ChatInput) -> None:
        self.history = list(chat.history)
        self.transcript = list(chat.transcript)
        self.replies = dict(chat.replies)
        self.turns = 0
        self.ended = False
        self.turn_lock = asyncio.Lock()  # one turn at a time: each sees the history the previous one left

    @workflow.run
    async def run(self, chat: ChatInput) -> list[dict[str, str]]:
        await workflow.wait_condition(lambda: self.ended or self.turns >= chat.turns_per_run or (
            0 < chat.max_history_events <= workflow.info().get_current_history_length()))
        await workflow.wait_condition(workflow.all_handlers_finished)  # no accepted message is left unanswered
        if self.ended:
            return self.transcript
        workflow.continue_as_new(replace(chat, history=self.history, transcript=self.transcript,
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
            result = await agent.run(text, message_history=self.history)
            self.history = result.all_messages()
            self.transcript += [{"role": "user", "content": text},
                                {"role": "assistant", "content": result.output}]
            self.turns += 1
            self.replies[update_id] = result.output
            return result.output

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

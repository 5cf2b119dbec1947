"""The travel chat workflow: one conversation with the travel agent, one user message per Update.

    start TravelChat(TravelChatInput())
    update chat("Plan 3 days in Lisbon for two adults from 2026-05-01")  -> the agent's reply
    query  history                                                       -> the agent's messages so far
    signal close                                                         -> the workflow completes

It keeps the agent's message history, so each reply sees the whole conversation, and continues as new
when Temporal suggests it (the history has grown long), carrying the messages over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow
from pydantic_ai.messages import ModelMessage
from temporalio import workflow

with workflow.unsafe.imports_passed_through():  # the agent is built once per worker, not in every run's sandbox
    from travel_chat.agent import agent


@dataclass
class TravelChatInput:
    messages: list[ModelMessage] = field(default_factory=list)  # carried over by continue-as-new
    # update id -> its reply, carried over too: Temporal de-duplicates an update id only within one run, so a
    # client re-sending a message whose first try was answered just before a continue-as-new reaches the new
    # run with it; without this the agent would answer it (and put it in its history) a second time.
    answered: dict[str, str] = field(default_factory=dict)


ANSWERED_KEPT = 200  # the most recent update ids carried over (a client re-sends only its latest messages)


@workflow.defn
class TravelChat(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [agent]  # PydanticAIPlugin registers this agent's activities with the worker

    @workflow.init
    def __init__(self, chat: TravelChatInput) -> None:
        self.messages = list(chat.messages)
        self.answered = dict(chat.answered)
        self.closed = False
        self.lock = asyncio.Lock()  # one message at a time: each sees the history the previous one left

    @workflow.run
    async def run(self, chat: TravelChatInput) -> None:
        await workflow.wait_condition(lambda: self.closed or workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self.closed:
            kept = dict(list(self.answered.items())[-ANSWERED_KEPT:])
            workflow.continue_as_new(TravelChatInput(messages=self.messages, answered=kept))

    @workflow.update
    async def chat(self, message: str) -> str:
        update_id = workflow.current_update_info().id
        async with self.lock:
            if update_id in self.answered:  # a re-send of a message already answered (in this run or before)
                return self.answered[update_id]
            result = await agent.run(message, message_history=self.messages)
            self.messages = result.all_messages()
            self.answered[update_id] = result.output
            return result.output

    @chat.validator
    def _validate_chat(self, message: str) -> None:
        if self.closed:
            raise ValueError("this conversation is closed")
        if not message.strip():
            raise ValueError("empty message")

    @workflow.signal
    def close(self) -> None:
        self.closed = True

    @workflow.query
    def history(self) -> list[ModelMessage]:
        return self.messages

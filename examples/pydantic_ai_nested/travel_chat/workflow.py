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


@workflow.defn
class TravelChat(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [agent]  # PydanticAIPlugin registers this agent's activities with the worker

    @workflow.init
    def __init__(self, chat: TravelChatInput) -> None:
        self.messages = list(chat.messages)
        self.closed = False
        self.lock = asyncio.Lock()  # one message at a time: each sees the history the previous one left

    @workflow.run
    async def run(self, chat: TravelChatInput) -> None:
        await workflow.wait_condition(lambda: self.closed or workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self.closed:
            workflow.continue_as_new(TravelChatInput(messages=self.messages))

    @workflow.update
    async def chat(self, message: str) -> str:
        async with self.lock:
            result = await agent.run(message, message_history=self.messages)
            self.messages = result.all_messages()
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

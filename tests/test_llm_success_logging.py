"""LiteLLM's success logging after a model call: skipped while nothing would read it (no callback, no cache), and
still delivered to a callback once one is registered. Real LiteLLM against the scripted model server."""

from __future__ import annotations

import asyncio
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agent import llm  # noqa: E402
from testbed.model_server import ScriptedModelServer  # noqa: E402
from testbed.scripted_routes import respond  # noqa: E402

MESSAGES = [{"role": "user", "content": "Reply with the number 7"}]


async def _call(url: str) -> str:
    message, _, _ = await llm.complete("scripted", MESSAGES, [], scripted_base_url=url, run_key="logging-test",
                                       timeout_s=10.0)
    return message["content"]


async def test_a_registered_success_callback_still_gets_every_model_call() -> None:
    await llm.wait_loaded()
    litellm = llm._litellm()
    from litellm.integrations.custom_logger import CustomLogger

    class Seen(CustomLogger):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[Any] = []

        async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any,
                                          end_time: Any) -> None:
            self.calls.append(response_obj)

    seen = Seen()
    with ScriptedModelServer(respond) as model:
        assert "7" in await _call(model.url)  # no callback: the call answers all the same
        litellm.callbacks.append(seen)
        try:
            assert "7" in await _call(model.url)
            for _ in range(100):  # LiteLLM logs in a task of its own, after the call has returned
                if seen.calls:
                    break
                await asyncio.sleep(0.02)
        finally:
            litellm.callbacks.remove(seen)
    assert len(seen.calls) == 1

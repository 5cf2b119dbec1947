"""Model calls through LiteLLM, with LiteLLM's own retries switched off.

Temporal's retry policy is the only retry layer: LiteLLM's ``num_retries``
and the OpenAI client's ``max_retries`` are both 0, so one activity attempt is
exactly one HTTP request. ``scripted`` models go to the project's
OpenAI-compatible scripted server; anything else is a LiteLLM model name for a
live provider, whose key comes from the environment (or a ``.env`` file the
CLI loads).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

# LiteLLM fetches a price map from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")

from agent.errors import ModelConfigurationError  # noqa: E402

SCRIPTED_PREFIX = "scripted"


class ModelUnavailableError(Exception):
    """A transient model failure (rate limit, 5xx, connection, timeout): retried by the caller's policy."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # the LiteLLM exception class, e.g. ServiceUnavailableError


@dataclass(frozen=True)
class ModelTarget:
    """Where one model name goes. Never holds a key: live keys stay in the environment."""

    litellm_model: str
    api_base: str | None
    scripted: bool


def is_scripted(model: str) -> bool:
    return model == SCRIPTED_PREFIX or model.startswith(SCRIPTED_PREFIX + ":")


def scripted_scenario(model: str) -> str:
    return model.split(":", 1)[1] if ":" in model else "auto"


def resolve_model(model: str, scripted_base_url: str | None) -> ModelTarget:
    if is_scripted(model):
        if not scripted_base_url:
            raise ModelConfigurationError(
                f"model {model!r} is scripted but this worker has no scripted model server; "
                "start the worker with --model-base-url URL or let it start its own"
            )
        return ModelTarget(f"openai/{scripted_scenario(model)}", scripted_base_url, True)
    if not model.strip():
        raise ModelConfigurationError("model name is empty; use 'scripted' or a LiteLLM name like openai/gpt-4o-mini")
    return ModelTarget(model, None, False)


_loaded = threading.Event()
_loader_lock = threading.Lock()
_loader: threading.Thread | None = None


def preload_in_background() -> None:
    """Start importing LiteLLM on a thread (idempotent): a worker polls at once, model calls wait for it."""
    global _loader
    with _loader_lock:
        if _loader is None:
            def load() -> None:
                try:
                    preload()
                finally:
                    _loaded.set()

            _loader = threading.Thread(target=load, name="litellm-import", daemon=True)
            _loader.start()


async def wait_loaded() -> None:
    preload_in_background()
    if not _loaded.is_set():
        await asyncio.to_thread(_loaded.wait)


def preload() -> None:
    """Import LiteLLM now (~5 s): inside an activity the import would block the worker's event loop."""
    _litellm()
    # What litellm imports lazily on the first call with tools (~2 s more).
    import litellm.llms.openai.openai  # noqa: F401
    import litellm.responses.mcp.chat_completions_handler  # noqa: F401
    import litellm.responses.mcp.litellm_proxy_mcp_handler  # noqa: F401
    import openai

    openai.AsyncOpenAI(api_key="preload", base_url="http://127.0.0.1:9/v1").chat.completions  # lazy resources


def _litellm():
    import litellm

    litellm.num_retries = 0
    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


async def complete(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    *,
    scripted_base_url: str | None,
    run_key: str,
    timeout_s: float,
) -> tuple[dict[str, Any], dict[str, int], float]:
    """One model call: ``(assistant message, usage, latency in ms)``.

    Raises ``ModelConfigurationError`` for failures no retry can fix (bad key,
    unknown model or scenario, malformed request); anything else propagates
    and is retried by the caller's policy.
    """
    await wait_loaded()  # never import inside the event loop: it would stall it for seconds
    litellm = _litellm()
    target = resolve_model(model, scripted_base_url)
    kwargs: dict[str, Any] = {
        "model": target.litellm_model,
        "messages": messages,
        "timeout": timeout_s,
        "num_retries": 0,
        "max_retries": 0,
    }
    if tools:
        kwargs["tools"] = tools
    if target.scripted:
        kwargs.update(api_base=target.api_base, api_key="scripted", extra_headers={"X-DAH-Run": run_key})
    started = time.perf_counter()
    try:
        response = await litellm.acompletion(**kwargs)
    except (
        litellm.AuthenticationError,
        litellm.NotFoundError,
        litellm.BadRequestError,
        litellm.PermissionDeniedError,
    ) as exc:
        raise ModelConfigurationError(f"model {model!r} refused the request: {type(exc).__name__}: {exc}") from None
    except (litellm.exceptions.APIError, litellm.exceptions.APIConnectionError, litellm.exceptions.Timeout,
            litellm.exceptions.RateLimitError, litellm.exceptions.ServiceUnavailableError,
            litellm.exceptions.InternalServerError) as exc:
        raise ModelUnavailableError(type(exc).__name__, str(exc)) from None
    latency_ms = (time.perf_counter() - started) * 1000.0
    message = response.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    usage_obj = getattr(response, "usage", None)
    usage = {
        k: int(getattr(usage_obj, k, 0) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    } if usage_obj else {}
    return out, usage, latency_ms

"""Model calls through LiteLLM, with LiteLLM's own retries switched off.

Temporal's retry policy is the only retry layer: LiteLLM's ``num_retries``
and the OpenAI client's ``max_retries`` are both 0, so one activity attempt is
exactly one HTTP request. ``scripted`` models go to the project's
OpenAI-compatible scripted server; anything else is a LiteLLM model name for a
live provider, whose key comes from the environment (or a ``.env`` file the
CLI loads).

A failed call is classified (``classify_failure``) into one cause: the
provider's API cannot be reached (DNS, refused, unreachable network, dropped
connection), did not answer in time, rejected the key, rate limits the key,
does not know the model or refused the request, or failed on its side. The
message is one line that names the model, the provider, the cause and what to
do, with no object reprs, addresses or secrets in it. What retrying cannot fix
raises ``ModelConfigurationError`` (not retried); the rest raises
``ModelUnavailableError`` (retried by the caller's policy).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import socket
import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import Any

# LiteLLM fetches a price map from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")

from agent.errors import ModelConfigurationError  # noqa: E402
from agent.strict import looks_secret  # noqa: E402

SCRIPTED_PREFIX = "scripted"


class ModelUnavailableError(Exception):
    """A transient model failure (rate limit, 5xx, connection, timeout): retried by the caller's policy."""

    def __init__(self, kind: str, message: str, cause: str = "error", error_type: str = "ModelCallFailed") -> None:
        super().__init__(message)
        self.kind = kind  # the LiteLLM exception class, e.g. ServiceUnavailableError
        self.cause = cause  # one of the causes of ``ModelFailure``, e.g. "unreachable"
        self.error_type = error_type  # the type of the ApplicationError the activity raises, e.g. ModelUnreachable


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
_load_error: str | None = None


def preload_in_background() -> None:
    """Start importing LiteLLM on a thread (idempotent): a worker polls at once, model calls wait for it."""
    global _loader
    with _loader_lock:
        if _loader is None:
            def load() -> None:
                global _load_error
                try:
                    preload()
                except Exception as e:  # the first model call imports what is left, on the event loop
                    _load_error = f"{type(e).__name__}: {e}"
                    print(f"the model client's preload failed ({_load_error}); the first model call will import "
                          "the rest on the worker's event loop, holding up its heartbeats", file=sys.stderr,
                          flush=True)
                finally:
                    _loaded.set()

            _loader = threading.Thread(target=load, name="litellm-import", daemon=True)
            _loader.start()


async def wait_loaded() -> None:
    preload_in_background()
    if not _loaded.is_set():
        await asyncio.to_thread(_loaded.wait)


def load_error() -> str | None:
    """Why the background preload failed (``Type: message``), or None: it succeeded or has not finished."""
    return _load_error


#: what LiteLLM imports lazily on a worker's first model call, beyond ``litellm`` itself: each is imported by
#: ``preload`` if this LiteLLM has it. Its proxy types (~170 pydantic models) alone cost 0.2-0.3 s of CPU there,
#: holding the GIL: a worker's first call took ~0.47 s where the next took ~0.17 s, and after a kill that first
#: call is often the retried one (issue 31).
LAZY_IMPORTS = (
    "litellm.llms.openai.openai",
    "litellm.responses.mcp.chat_completions_handler",
    "litellm.responses.mcp.litellm_proxy_mcp_handler",
    "litellm.proxy.openai_files_endpoints.common_utils",  # via update_messages_with_model_file_ids
    "litellm._service_logger",
    "litellm.integrations.prometheus_services",
    "litellm.llms.litellm_proxy.chat.transformation",
    "litellm.llms.openai.chat.gpt_audio_transformation",
    "litellm.llms.openai_like.dynamic_config",
    "litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic.transformation",
)


def preload() -> None:
    """Import LiteLLM now (~5 s): inside an activity the import would block the worker's event loop."""
    import importlib

    litellm = _litellm()
    for name in LAZY_IMPORTS:  # what litellm imports lazily on the first call with tools (~2 s more)
        try:
            importlib.import_module(name)
        except ImportError:  # another LiteLLM layout: the first call imports what it needs
            pass
    import openai

    openai.AsyncOpenAI(api_key="preload", base_url="http://127.0.0.1:9/v1").chat.completions  # lazy resources
    response_type = getattr(litellm, "ModelResponse", None)
    if response_type is not None:
        response_type()  # its pydantic models' schemas, built on first use


def _litellm():
    import litellm

    litellm.num_retries = 0
    litellm.suppress_debug_info = True
    litellm.telemetry = False
    _skip_success_logging_without_callbacks(litellm)
    return litellm


def _skip_success_logging_without_callbacks(litellm: Any) -> None:
    """After every call LiteLLM schedules its async success logging on the event loop, where it runs before the
    caller resumes: it walks and copies the whole conversation into a logging payload and looks up a cost, for
    its success callbacks and cache (~0.6 ms per model call at 2 messages, ~1.5 ms at 200, all of it between the
    model's answer and the activity's completion). With no callback registered and no cache nothing reads that
    payload: skip it then, and keep it whenever a callback (``litellm.callbacks``, ``success_callback``, or one
    given with the call) or ``litellm.cache`` is set."""
    try:
        from litellm.litellm_core_utils.litellm_logging import Logging
    except ImportError:  # another LiteLLM layout: leave its logging as it is
        return
    body = getattr(Logging, "_async_success_handler_body", None)
    if body is None or getattr(body, "dah_skips_without_callbacks", False):
        return

    async def success_logging(self: Any, *args: Any, **kwargs: Any) -> None:
        if (litellm.callbacks or litellm.success_callback or litellm._async_success_callback or litellm.cache
                or getattr(self, "dynamic_async_success_callbacks", None)):
            return await body(self, *args, **kwargs)
        return None

    success_logging.dah_skips_without_callbacks = True  # type: ignore[attr-defined]
    Logging._async_success_handler_body = success_logging


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
    except Exception as exc:
        failure = classify_failure(exc, model, target=target)
        if failure is None:
            raise  # not a provider's answer: a bug, retried like one
        raise failure.error() from None
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


# -- failures ---------------------------------------------------------------------------------------------------

#: the ApplicationError type of each retryable cause (what a history and the CLI see)
UNREACHABLE, TIMEOUT, RATE_LIMITED, SERVER_ERROR, CALL_FAILED = (
    "ModelUnreachable", "ModelTimeout", "ModelRateLimited", "ModelServerError", "ModelCallFailed")
#: every ApplicationError type a model call fails with: the retryable ones and the configuration error
MODEL_FAILURE_TYPES = frozenset({UNREACHABLE, TIMEOUT, RATE_LIMITED, SERVER_ERROR, CALL_FAILED,
                                 ModelConfigurationError.error_type})

#: how long a failure message may be, and the provider's own words in it
MESSAGE_LIMIT = 400
DETAIL_LIMIT = 180


@dataclass(frozen=True)
class ModelFailure:
    """One failed model call, classified: ``message`` is the one line a user reads."""

    #: unreachable, timeout, auth, permission, rate_limit, quota, unknown_model, bad_request, server_error,
    #: bad_response or error
    cause: str
    retryable: bool
    provider: str
    message: str
    kind: str  # the exception's class, e.g. InternalServerError
    error_type: str  # the ApplicationError type: one of MODEL_FAILURE_TYPES

    def error(self) -> Exception:
        if not self.retryable:
            exc = ModelConfigurationError(self.message)
            exc.cause = self.cause  # type: ignore[attr-defined]
            return exc
        return ModelUnavailableError(self.kind, self.message, self.cause, self.error_type)


_SECRET_PATTERNS = [
    # key=value and "key": "value" shapes (api_key=..., 'x-api-key': '...', Authorization: Bearer ...)
    re.compile(r"(?i)((?:api[_-]?key|x-api-key|authorization|access[_-]?token|secret|password)['\"]?\s*[:=]\s*"
               r"['\"]?)(?:bearer\s+)?[^\s'\",}]+"),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"),
    # provider key shapes, also when masked half-way by the provider (sk-abc***wxyz)
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_*\-]{3,}"),
    re.compile(r"\b(?:AIza|gsk_|xai-|hf_|ghp_|github_pat_|AKIA)[A-Za-z0-9_*\-]{6,}"),
    # anything else long and key-like: 32+ characters mixing letters and digits
    re.compile(r"\b(?=[A-Za-z0-9_\-]*\d)(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{32,}\b"),
]
_OBJECT_REPR = re.compile(r"\s*(?:ssl:)?<[^<>]*\bobject at 0x[0-9a-fA-F]+>")
_ADDRESS = re.compile(r"\s*\bat 0x[0-9a-fA-F]+|0x[0-9a-fA-F]*")
_LITELLM_NOISE = [
    re.compile(r"\blitellm\.\w+:\s*"),  # litellm.InternalServerError:
    re.compile(r"^(?:\w+Error|\w+Exception):\s+"),  # InternalServerError:
    re.compile(r"^\w+Exception\s+(?:\w+Error\s+)?-\s+"),  # OpenAIException - / AnthropicException BadGatewayError -
    re.compile(r"\s*Handle with `litellm\.\w+`\.?"),
    re.compile(r"\s*LiteLLM Retried: .*$"),
    re.compile(r"\s*Received Model Group=.*$"),
    re.compile(r"\s*For more information check: \S+"),
]


def redact(text: str) -> str:
    """``text`` without the values of secret-looking environment variables and anything shaped like a key."""
    for name, value in os.environ.items():
        if len(value) >= 8 and looks_secret(name) and value in text:
            text = text.replace(value, "[redacted]")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.re.groups else "") + "[redacted]", text)
    return text


def clean_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """One line for a person: no object reprs or memory addresses, no secrets, at most ``limit`` characters."""
    text = _OBJECT_REPR.sub("", text)
    text = _ADDRESS.sub("", text)
    text = redact(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _detail(text: str) -> str:
    """The provider's own words, without LiteLLM's wrapping: the error body's message if there is one."""
    text = str(text)
    body = re.search(r"""['"]message['"]\s*:\s*(['"])((?:\\.|(?!\1).)*)\1""", text)
    if body and body.group(2).strip():
        text = body.group(2)
    for _ in range(3):
        for pattern in _LITELLM_NOISE:
            text = pattern.sub("", text.strip())
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text.strip())
    return clean_message(text.rstrip(". "), DETAIL_LIMIT)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not seen for seen in out) and len(out) < 16:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _provider(exc: BaseException, model: str, target: ModelTarget | None) -> str:
    if target is not None and target.scripted:
        return "scripted model server"
    provider = getattr(exc, "llm_provider", None)
    if isinstance(provider, str) and provider.strip():
        return provider
    if "/" in model:
        return model.split("/", 1)[0]
    try:
        return _litellm().get_llm_provider(model=model)[1] or "model provider"
    except Exception:
        return "model provider"


def api_key_env_vars(model: str) -> list[str]:
    """The environment variables LiteLLM reads the key of ``model`` from, e.g. ``["OPENAI_API_KEY"]``.

    LiteLLM's ``validate_environment`` knows them but names only the missing ones; it is asked here against an
    empty environment (its own copy, so the process's environment is never touched)."""
    try:
        validate = _litellm().validate_environment
        fake_os = types.SimpleNamespace(environ={}, getenv=lambda name, default=None: default)
        empty = types.FunctionType(validate.__code__, {**validate.__globals__, "os": fake_os}, validate.__name__,
                                   validate.__defaults__, validate.__closure__)
        names = list(empty(model=model).get("missing_keys") or [])
    except Exception:
        names = []
    if not names and "/" in model:
        names = [f"{model.split('/', 1)[0].upper()}_API_KEY"]
    return names


def _key_vars(model: str, target: ModelTarget | None) -> str:
    if target is not None and target.scripted:
        return "the scripted server's key"
    names = api_key_env_vars(model)
    return " or ".join(names) if names else "the provider's API key variable"


def _endpoint(chain: list[BaseException]) -> str:
    """``host:port`` of the API a connection failure was for, when the failure says."""
    for c in chain:
        m = re.search(r"Cannot connect to host (\S+?:\d+)", str(c))
        if m:
            return m.group(1)
    for c in chain:
        if type(c).__module__.split(".")[0] in ("openai", "httpx") and not type(c).__module__.startswith("litellm"):
            try:
                url = c.request.url  # type: ignore[attr-defined]
            except Exception:
                continue
            if url.host:
                return f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
    return ""


def _is(c: BaseException, *names: str) -> bool:
    return any(t.__name__ in names for t in type(c).__mro__)


NETWORK_ADVICE = "check the network connection (offline? a proxy?) or the provider's status"


def _network_cause(chain: list[BaseException]) -> tuple[str, str, str] | None:
    """``(cause, what happened, what to do)`` when the chain holds a transport failure, innermost first."""
    for c in reversed(chain):
        err = getattr(c, "errno", None)
        if isinstance(c, socket.gaierror) or _is(c, "ClientConnectorDNSError"):
            return "unreachable", f"DNS lookup failed ({_detail(str(c))})", NETWORK_ADVICE
        if isinstance(c, ConnectionRefusedError) or err == errno.ECONNREFUSED:
            return ("unreachable", "connection refused",
                    "nothing listens there: check the API's base URL setting, the network or the provider's status")
        if err in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "unreachable", f"network unreachable ({_detail(str(c))})", NETWORK_ADVICE
    for c in reversed(chain):
        if _is(c, "ConnectTimeout", "ConnectionTimeoutError"):
            return "unreachable", "connecting timed out", NETWORK_ADVICE
        if _is(c, "ConnectError", "ClientConnectorError"):
            return "unreachable", _detail(str(c)) or "connection failed", NETWORK_ADVICE
        if isinstance(c, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) or _is(
                c, "RemoteProtocolError", "ServerDisconnectedError", "ReadError", "WriteError"):
            return "dropped", _detail(str(c)) or type(c).__name__, NETWORK_ADVICE
        if isinstance(c, json.JSONDecodeError):
            return "bad_response", f"not JSON: {_detail(str(c))}", "usually temporary: check the provider's status"
    for c in chain:
        if isinstance(c, TimeoutError) or _is(c, "APITimeoutError", "Timeout", "TimeoutException"):
            limit = re.search(r"timeout value=([\d.]+)", str(c))
            what = f"no answer within {float(limit.group(1)):g} s" if limit else "the request timed out"
            return ("timeout", what,
                    NETWORK_ADVICE + ", or allow more time (--planning-timeout)")
    for c in reversed(chain):
        if _is(c, "APIConnectionError", "ClientConnectionError") and re.search(
                r"(?i)connection (?:error|refused|reset|failed|aborted)|cannot connect|connect call failed|"
                r"failed to connect", str(c)):
            return "unreachable", _detail(str(c)) or "connection failed", NETWORK_ADVICE
    return None


#: where the exceptions of a provider's answer come from (anything else is no provider failure, unless it is a
#: transport failure)
_PROVIDER_LIBRARIES = ("litellm", "openai", "httpx", "aiohttp", "anthropic")


def classify_failure(exc: BaseException, model: str, *, target: ModelTarget | None = None) -> ModelFailure | None:
    """What a failed model call means, or ``None`` when ``exc`` is no provider failure (a bug: let it raise)."""
    chain = _chain(exc)
    network = _network_cause(chain)
    if network is None and type(exc).__module__.split(".")[0] not in _PROVIDER_LIBRARIES:
        return None
    provider = _provider(exc, model, target)
    api = "the scripted model server" if target is not None and target.scripted else f"the {provider} API"
    kind = type(exc).__name__
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    text = str(exc)
    detail = _detail(text)
    head = f"model {model}: "

    def fail(cause: str, retryable: bool, error_type: str, message: str) -> ModelFailure:
        return ModelFailure(cause, retryable, provider, clean_message(head + message), kind,
                            error_type if retryable else ModelConfigurationError.error_type)

    if network is not None and (status is None or status >= 500 or status == 408):
        cause, what, advice = network
        at = _endpoint(chain)
        where = f"{api} at {at}" if at else api
        if cause == "unreachable":
            return fail("unreachable", True, UNREACHABLE, f"cannot reach {where}: {what}; {advice}")
        if cause == "dropped":
            return fail("unreachable", True, UNREACHABLE, f"the connection to {where} was dropped ({what}); {advice}")
        if cause == "bad_response":
            return fail("bad_response", True, SERVER_ERROR, f"{api} sent a response that cannot be read ({what}); "
                                                            f"{advice}")
        return fail("timeout", True, TIMEOUT, f"{api} did not answer in time (timeout: {what}); {advice}")

    code = f"{status} {kind}" if status else kind
    quota = re.search(r"(?i)insufficient_quota|exceeded your current quota|credit balance is too low|"
                      r"billing|payment required", text)
    if _is(exc, "AuthenticationError") or status == 401:
        names = _key_vars(model, target)
        if re.search(r"(?i)api_key client option must be set|no api key|missing (an )?api key|api key is required|"
                     r"must provide an api key", text):
            return fail("auth", False, "", f"{api} needs an API key and none was found: set {names} (in the "
                                           "environment or a .env file)")
        return fail("auth", False, "", f"{api} rejected the API key ({code}: {detail}); set {names} to a valid key")
    if _is(exc, "PermissionDeniedError") or status == 403:
        return fail("permission", False, "", f"{api} refused access ({code}: {detail}); check that the key in "
                                             f"{_key_vars(model, target)} may use this model")
    if quota and (_is(exc, "RateLimitError", "BadRequestError") or status in (400, 402, 429)):
        return fail("quota", False, "", f"the {provider} account has no quota or credit left ({code}: {detail}); "
                                        "check its plan and billing")
    if _is(exc, "RateLimitError") or status == 429:
        return fail("rate_limit", True, RATE_LIMITED,
                    f"{api} is rate limiting this key ({code}: {detail}); retried with backoff, or slow down")
    if _is(exc, "NotFoundError") or status == 404:
        return fail("unknown_model", False, "",
                    f"{api} does not know this model or endpoint ({code}: {detail}); check the model name "
                    "(provider/model, e.g. openai/gpt-4o-mini) and any base URL setting")
    if _is(exc, "ContextWindowExceededError"):
        return fail("bad_request", False, "", f"the conversation no longer fits the model's context window "
                                              f"({code}: {detail})")
    if _is(exc, "BadRequestError", "UnprocessableEntityError", "UnsupportedParamsError") or status in (400, 413,
                                                                                                      422):
        return fail("bad_request", False, "", f"{api} refused the request as invalid ({code}: {detail}); "
                                              "retrying would not help")
    if _is(exc, "APIConnectionError"):  # LiteLLM's name for its own failures too, not only the network's
        return fail("error", True, CALL_FAILED, f"the call to {api} failed ({kind}: {detail})")
    if status is not None and status >= 500 or _is(exc, "InternalServerError", "ServiceUnavailableError",
                                                   "BadGatewayError", "APIStatusError", "APIError"):
        return fail("server_error", True, SERVER_ERROR,
                    f"{api} failed on its side ({code}: {detail}); usually temporary: check the provider's status")
    return fail("error", True, CALL_FAILED, f"the call to {api} failed ({code}: {detail})")

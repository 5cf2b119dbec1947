"""Model-call failures, classified: one clear line that names the provider, the cause and what to do, with no
object reprs, addresses or keys in it; retried when retrying can help, not retried when it cannot; and the
command line says so (while it retries, and once at the end) instead of retrying silently or ending in a
traceback.

The classifier is tested over LiteLLM's own exception types, built directly; the rest runs the real path:
LiteLLM against a closed local port, ``dah run`` as a user runs it, and a workflow on the session's Temporal
server against a local API that rejects the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agent import llm  # noqa: E402
from agent.contracts import AgentConfig  # noqa: E402
from agent.errors import ModelConfigurationError  # noqa: E402
from testbed.engines.temporal.cluster import run_prompt  # noqa: E402
from tests.events import HANG_S  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SSL_REPR = "<ssl.SSLContext object at 0x7f12345>"
FAKE_KEY = "sk-abc123def456ghi789jkl012mno345"
MODEL = "openai/gpt-4o-mini"


@pytest.fixture(scope="module")
def litellm():
    llm.preload_in_background()
    asyncio.run(llm.wait_loaded())
    return llm._litellm()


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_clean(message: str) -> None:
    assert "0x" not in message and "object at" not in message, message
    assert "abc123" not in message and FAKE_KEY not in message, message
    assert "\n" not in message and len(message) <= llm.MESSAGE_LIMIT, message


# -- the classifier, over LiteLLM's exception types ---------------------------------------------------------------


def test_connection_failure_is_unreachable_retried_and_clean(litellm) -> None:
    exc = litellm.APIConnectionError(
        message=f"Cannot connect to host api.openai.com:443 ssl:{SSL_REPR} [Name or service not known] "
                f"(api_key={FAKE_KEY})", llm_provider="openai", model="gpt-4o-mini")
    f = llm.classify_failure(exc, MODEL)
    assert (f.cause, f.retryable, f.error_type, f.provider) == ("unreachable", True, llm.UNREACHABLE, "openai")
    assert "cannot reach the openai API at api.openai.com:443" in f.message
    assert "check the network" in f.message
    assert_clean(f.message)
    err = f.error()
    assert isinstance(err, llm.ModelUnavailableError) and err.kind == "APIConnectionError"


def test_transport_error_under_a_500_is_unreachable_not_a_server_error(litellm) -> None:
    # What LiteLLM really raises offline: InternalServerError("Connection error."), the socket error its cause.
    exc = litellm.InternalServerError(message="InternalServerError: OpenAIException - Connection error.",
                                      llm_provider="openai", model="gpt-4o-mini")
    try:
        raise exc from ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")
    except litellm.InternalServerError as raised:
        f = llm.classify_failure(raised, MODEL)
    assert (f.cause, f.retryable, f.error_type) == ("unreachable", True, llm.UNREACHABLE)
    assert "connection refused" in f.message
    dns = litellm.InternalServerError(
        message=f"AnthropicException - Cannot connect to host api.anthropic.com:443 ssl:{SSL_REPR} "
                "[Name or service not known]. Handle with `litellm.InternalServerError`.",
        llm_provider="anthropic", model="claude-3-5-haiku-latest")
    dns.__cause__ = socket.gaierror(-2, "Name or service not known")
    f = llm.classify_failure(dns, "anthropic/claude-3-5-haiku-latest")
    assert f.cause == "unreachable" and "DNS lookup failed" in f.message and "anthropic API" in f.message
    assert "Handle with" not in f.message
    assert_clean(f.message)


def test_authentication_names_the_variable_never_the_key(litellm) -> None:
    exc = litellm.AuthenticationError(
        message=f"AuthenticationError: OpenAIException - Incorrect API key provided: {FAKE_KEY}. You can find "
                f"your API key at https://platform.openai.com/account/api-keys. {SSL_REPR}",
        llm_provider="openai", model="gpt-4o-mini")
    f = llm.classify_failure(exc, MODEL)
    assert (f.cause, f.retryable, f.error_type) == ("auth", False, ModelConfigurationError.error_type)
    assert "set OPENAI_API_KEY" in f.message and "rejected the API key" in f.message
    assert_clean(f.message)
    err = f.error()
    assert isinstance(err, ModelConfigurationError) and err.cause == "auth"
    missing = litellm.AuthenticationError(message="The api_key client option must be set", llm_provider="anthropic",
                                          model="claude-3-5-haiku-latest")
    f = llm.classify_failure(missing, "anthropic/claude-3-5-haiku-latest")
    assert "needs an API key" in f.message and "set ANTHROPIC_API_KEY" in f.message


def test_rate_limit_is_retried_and_quota_is_not(litellm) -> None:
    f = llm.classify_failure(litellm.RateLimitError(message="Rate limit reached for requests", llm_provider="openai",
                                                    model="gpt-4o-mini"), MODEL)
    assert (f.cause, f.retryable, f.error_type) == ("rate_limit", True, llm.RATE_LIMITED)
    assert "429" in f.message and "rate limiting" in f.message
    quota = litellm.RateLimitError(message="You exceeded your current quota, please check your plan and billing",
                                   llm_provider="openai", model="gpt-4o-mini")
    f = llm.classify_failure(quota, MODEL)
    assert (f.cause, f.retryable) == ("quota", False)


def test_unknown_model_and_bad_request_are_not_retried(litellm) -> None:
    f = llm.classify_failure(litellm.NotFoundError(message="The model `gpt-5x` does not exist", model="gpt-5x",
                                                   llm_provider="openai"), "openai/gpt-5x")
    assert (f.cause, f.retryable, f.error_type) == ("unknown_model", False, ModelConfigurationError.error_type)
    assert "check the model name" in f.message and "gpt-5x" in f.message
    f = llm.classify_failure(litellm.BadRequestError(message="Invalid 'messages': empty array", model="gpt-4o-mini",
                                                     llm_provider="openai"), MODEL)
    assert (f.cause, f.retryable) == ("bad_request", False)
    f = llm.classify_failure(litellm.ContextWindowExceededError(message="too long", model="gpt-4o-mini",
                                                                llm_provider="openai"), MODEL)
    assert (f.cause, f.retryable) == ("bad_request", False) and "context window" in f.message


def test_server_errors_and_timeouts_are_retried(litellm) -> None:
    for exc in (litellm.InternalServerError(message="The server had an error", llm_provider="openai",
                                            model="gpt-4o-mini"),
                litellm.ServiceUnavailableError(message="overloaded", llm_provider="openai", model="gpt-4o-mini")):
        f = llm.classify_failure(exc, MODEL)
        assert (f.cause, f.retryable, f.error_type) == ("server_error", True, llm.SERVER_ERROR)
        assert type(exc).__name__ in f.message  # histories and checkers still see LiteLLM's class
    f = llm.classify_failure(litellm.Timeout(message="Request timed out.", model="gpt-4o-mini",
                                             llm_provider="openai"), MODEL)
    assert (f.cause, f.retryable, f.error_type) == ("timeout", True, llm.TIMEOUT)
    assert "did not answer in time" in f.message


def test_a_bug_is_no_provider_failure(litellm) -> None:
    assert llm.classify_failure(KeyError("choices"), MODEL) is None
    assert llm.classify_failure(FileNotFoundError(2, "No such file"), MODEL) is None
    # LiteLLM also names its own failures APIConnectionError: retried, but not called a network failure
    f = llm.classify_failure(litellm.APIConnectionError(message="'NoneType' object has no attribute 'get'",
                                                        llm_provider="openai", model="gpt-4o-mini"), MODEL)
    assert (f.cause, f.retryable, f.error_type) == ("error", True, llm.CALL_FAILED)


def test_clean_message_strips_reprs_addresses_and_secrets(monkeypatch) -> None:
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "plainsecretvalue")
    text = (f"failed {SSL_REPR} at <Foo object at 0xdeadbeef> id 0x7f00 key {FAKE_KEY} "
            "Authorization: Bearer abc.def.ghi token plainsecretvalue\n" + "x" * 1000)
    out = llm.clean_message(text)
    assert_clean(out)
    assert "plainsecretvalue" not in out and "Bearer abc" not in out and out.endswith("…")
    assert llm.api_key_env_vars("anthropic/claude-3-5-haiku-latest") == ["ANTHROPIC_API_KEY"]


# -- the real path -------------------------------------------------------------------------------------------------


async def test_a_call_to_a_closed_port_is_unreachable(litellm) -> None:
    """LiteLLM's real error against a port nothing listens on (the scripted target: an OpenAI-compatible URL)."""
    base = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(llm.ModelUnavailableError) as info:
        await llm.complete("scripted", [{"role": "user", "content": "hi"}], [], scripted_base_url=base,
                           run_key="t", timeout_s=5)
    assert info.value.cause == "unreachable" and info.value.error_type == llm.UNREACHABLE
    assert "cannot reach the scripted model server at 127.0.0.1" in str(info.value)
    assert "connection refused" in str(info.value)
    assert_clean(str(info.value))


def test_dah_run_against_an_unreachable_api_says_why_and_stops_after_max_attempts(tmp_path: Path) -> None:
    """``dah run`` with a live model whose API is a closed local port, limited attempts: the retry is announced
    once, the run ends in one line that names the cause and --max-attempts, and there is no traceback."""
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "OPENAI_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"}
    out = subprocess.run([sys.executable, "-m", "testbed", "run", "hi", "--model", MODEL, "--max-attempts", "2",
                          "--retry-initial", "1.5", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=HANG_S, cwd=ROOT, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text and "0x" not in text and FAKE_KEY not in text, text
    lines = text.splitlines()
    retrying = [line for line in lines if "model call failed (attempt 1)" in line]
    assert len(retrying) == 1 and "retrying" in retrying[0] and "--max-attempts 2" in retrying[0], text
    final = [line for line in lines if line.startswith("dah run: error:")]
    assert len(final) == 1, text
    assert "cannot reach the openai API at 127.0.0.1" in final[0] and "connection refused" in final[0], text
    assert "gave up after 2 attempts (--max-attempts 2)" in final[0], text
    assert len(lines) <= 4, text  # workflow id, the retry, the end (no log lines, no failure chain)


@contextmanager
def rejecting_api() -> Iterator[tuple[str, list[str]]]:
    """An OpenAI-compatible API that answers every call 401, quoting the key back the way OpenAI does."""
    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", 0)))
            calls.append(self.path)
            key = self.headers.get("authorization", "").removeprefix("Bearer ")
            body = json.dumps({"error": {"message": f"Incorrect API key provided: {key}.", "type":
                                         "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()
            self.send_response(401)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", calls
    finally:
        server.shutdown()
        server.server_close()


async def test_a_rejected_key_fails_the_run_at_once_naming_the_variable(stack, monkeypatch) -> None:
    """A workflow on the session's Temporal server, its in-process worker calling an API that rejects the key:
    one call (not retried), and the run's failure says which variable to set without quoting the key."""
    from temporalio.client import WorkflowFailureError

    from testbed.engines.temporal.session import failure_line

    with rejecting_api() as (base, calls):
        monkeypatch.setenv("OPENAI_BASE_URL", base)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        cfg = AgentConfig(model=MODEL)
        cfg.planning.initial_interval_s = 0.1
        with pytest.raises(WorkflowFailureError) as info:
            await asyncio.wait_for(run_prompt(stack, cfg, "hi"), timeout=HANG_S)
    assert calls == ["/v1/chat/completions"]  # not retried
    line = failure_line(info.value)
    assert "the openai API rejected the API key" in line and "set OPENAI_API_KEY" in line, line
    assert "(not retried)" in line
    assert_clean(line)
    assert "abc123" not in str(info.value.cause)  # nor in the history


def test_progress_lines_are_once_per_cause() -> None:
    """What ``dah run`` shows while an activity is retried: its first failure, a new cause, then 4, 8, 16 ..."""
    from temporalio.api.workflow.v1 import PendingActivityInfo

    from testbed.engines.temporal.session import retry_line

    state: dict = {}
    printed = []
    for attempt, message in [(2, "a"), (3, "a"), (4, "a"), (5, "a"), (6, "b"), (7, "b"), (9, "b")]:
        p = PendingActivityInfo(attempt=attempt, maximum_attempts=0)
        p.activity_type.name = "plan_next_action"
        p.last_failure.message = message
        p.last_failure.application_failure_info.type = llm.UNREACHABLE
        line = retry_line(p, state)
        if line:
            printed.append((attempt - 1, line))
    assert [n for n, _ in printed] == [1, 4, 5, 8]
    assert "--max-attempts N bounds them" in printed[0][1] and "still failing after 4 attempts" in printed[1][1]
    p = PendingActivityInfo(attempt=2, maximum_attempts=1)
    assert retry_line(p, {}) is None  # no failure yet: nothing to say

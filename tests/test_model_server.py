"""Tests for testbed.model_server: real sockets, real LiteLLM/httpx clients, no mocks.

Every server started here is stopped by a context manager; the one subprocess is
terminated by its own pid.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before any litellm import: no price-map download

import httpx
import pytest

from testbed.faults.model import FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from tests.events import HANG_S, wait_for

ROOT = Path(__file__).resolve().parents[1]

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}


def echo_responder(body: dict) -> dict:
    """Trivial responder: "calc X" -> calculator tool call, "BAD" -> ValueError, else echo."""
    text = str(body["messages"][-1].get("content") or "")
    if text == "BAD":
        raise ValueError("scripted responder has no route for prompt 'BAD'")
    if text.startswith("calc "):
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "calculator",
                                         "arguments": json.dumps({"expression": text[5:]})}}],
        }
    return {"role": "assistant", "content": f"echo: {text}"}


@contextmanager
def serve(**kwargs: Any) -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(echo_responder, **kwargs) as server:
        yield server


def chat_body(text: str = "hello", model: str = "direct", **extra: Any) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def post_chat(server: ScriptedModelServer, text: str = "hello", *, model: str = "direct", run: str | None = None,
              timeout: float = HANG_S, **extra: Any) -> httpx.Response:
    headers = {"X-DAH-Run": run} if run else {}
    return httpx.post(f"{server.url}/chat/completions", json=chat_body(text, model, **extra),
                      headers=headers, timeout=timeout)


@pytest.fixture(scope="module")
def litellm() -> Any:
    import litellm as _litellm  # imported lazily: slow, and the subprocess responder import must stay light

    _litellm.suppress_debug_info = True
    return _litellm


async def ask(litellm: Any, server: ScriptedModelServer, text: str = "hello", *, scenario: str = "direct",
              run: str | None = None, **kwargs: Any) -> Any:
    if run is not None:
        kwargs["extra_headers"] = {"X-DAH-Run": run}
    if kwargs.get("tools"):
        # litellm 1.106.2 imports its MCP gateway (needs the optional `mcp` package) whenever tools are passed
        kwargs["_skip_mcp_handler"] = True
    return await litellm.acompletion(
        model=f"openai/{scenario}", messages=[{"role": "user", "content": text}],
        api_base=server.url, api_key="scripted", max_retries=0, num_retries=0, timeout=HANG_S, **kwargs,
    )


def causes(exc: BaseException) -> list[BaseException]:
    """The exception and everything it was raised from (LiteLLM wraps transport errors)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


# --------------------------------------------------------------------------- through LiteLLM


async def test_plain_answer_through_litellm(litellm: Any) -> None:
    with serve() as server:
        resp = await ask(litellm, server, "hello there")
        assert resp.choices[0].message.content == "echo: hello there"
        assert resp.choices[0].finish_reason == "stop"
        assert isinstance(resp.usage.prompt_tokens, int) and resp.usage.total_tokens > 0
        stats = server.stats()
        assert stats["requests"] == 1 and stats["responses_ok"] == 1
        assert stats["by_scenario"] == {"direct": 1} and stats["by_run"] == {"global": 1}


async def test_tool_call_through_litellm(litellm: Any) -> None:
    with serve() as server:
        resp = await ask(litellm, server, "calc 25 * 4", tools=[CALC_TOOL])
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        assert call.function.name == "calculator"
        assert json.loads(call.function.arguments) == {"expression": "25 * 4"}


async def test_status_503_first_n_counted_per_run_key(litellm: Any) -> None:
    with serve(faults=[FaultRule.parse("status:503,first_n=3")]) as server:
        for run in ("run-a", "run-b"):  # each run key gets its own 3 failures
            for _ in range(3):
                with pytest.raises(litellm.ServiceUnavailableError):
                    await ask(litellm, server, run=run)
            resp = await ask(litellm, server, "after", run=run)
            assert resp.choices[0].message.content == "echo: after"
        stats = server.stats()
        assert stats["faults_applied"] == {"status": 6}
        assert stats["by_run"] == {"run-a": 4, "run-b": 4}
        assert stats["responses_ok"] == 2


async def test_status_429_rate_limit(litellm: Any) -> None:
    with serve(faults=[FaultRule.parse("status:429")]) as server:
        with pytest.raises(litellm.RateLimitError):
            await ask(litellm, server)
        raw = post_chat(server)
        assert raw.status_code == 429
        assert raw.headers["Retry-After"] == "1"
        assert raw.json()["error"]["code"] == "rate_limit_exceeded"


async def test_reset_is_a_connection_error(litellm: Any) -> None:
    with serve(faults=[FaultRule.parse("reset,first_n=2")]) as server:
        import openai

        # LiteLLM maps openai's "Connection error." to InternalServerError; the transport error is its cause
        with pytest.raises(litellm.InternalServerError) as info:
            await ask(litellm, server)
        assert any(isinstance(c, openai.APIConnectionError) for c in causes(info.value))
        assert any(isinstance(c, ConnectionResetError) for c in causes(info.value))
        with pytest.raises((httpx.ReadError, httpx.ConnectError, httpx.RemoteProtocolError)):
            post_chat(server)
        assert post_chat(server).status_code == 200  # first_n exhausted
        assert server.stats()["faults_applied"] == {"reset": 2}


async def test_malformed_json_raises_on_client(litellm: Any) -> None:
    with serve(faults=[FaultRule.parse("malformed_json,first_n=2")]) as server:
        with pytest.raises(litellm.InternalServerError) as info:
            await ask(litellm, server)
        assert any(isinstance(c, json.JSONDecodeError) for c in causes(info.value))
        raw = post_chat(server)
        assert raw.status_code == 200 and raw.headers["content-type"] == "application/json"
        with pytest.raises(json.JSONDecodeError):
            json.loads(raw.content)


async def test_malformed_output_arguments_are_not_json(litellm: Any) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    with serve(faults=[FaultRule.parse("malformed_output,first_n=1")]) as server:
        resp = await ask(litellm, server, tools=[tool])
        call = resp.choices[0].message.tool_calls[0]
        assert call.function.name == "lookup"  # first offered tool
        with pytest.raises(json.JSONDecodeError):
            json.loads(call.function.arguments)
        assert post_chat(server).json()["choices"][0]["message"]["content"] == "echo: hello"
    with serve(faults=[FaultRule.parse("malformed_output")]) as server:
        msg = post_chat(server).json()["choices"][0]["message"]
        assert msg["tool_calls"][0]["function"]["name"] == "calculator"  # default when no tools offered


# --------------------------------------------------------------------------- hang / stop


def test_hang_with_hang_s_closes_without_answer() -> None:
    with serve(faults=[FaultRule.parse("hang,first_n=2,hang_s=0.3")]) as server:
        with pytest.raises(httpx.ReadTimeout):
            post_chat(server, timeout=0.1)  # still held when the client gives up
        t0 = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):
            post_chat(server, timeout=HANG_S)  # closed by the server after hang_s with no response (not timed out)
        assert time.monotonic() - t0 >= 0.25
        assert post_chat(server).status_code == 200


def test_stop_releases_hung_request_promptly() -> None:
    server = ScriptedModelServer(echo_responder, faults=[FaultRule.parse("hang")]).start()
    errors: list[BaseException] = []

    def client() -> None:
        try:
            post_chat(server, timeout=600.0)  # far beyond the join below: its error is the stop's doing
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            errors.append(exc)

    worker = threading.Thread(target=client, daemon=True)
    try:
        worker.start()
        wait_for(lambda: server.stats()["faults_applied"].get("hang", 0) >= 1, "the request's hang", every_s=0.01)
        assert server.stats()["faults_applied"] == {"hang": 1}
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < 30  # not held by the request that hangs forever
        worker.join(timeout=60)
        assert not worker.is_alive()
        assert errors and isinstance(errors[0], httpx.TransportError)
        server.stop()  # idempotent
    finally:
        server.stop()


# --------------------------------------------------------------------------- rule scoping


def test_duration_window_expires() -> None:
    # Within the window (a long one: a busy machine's requests still fall in it), then after it (a short one).
    with serve(faults=[FaultRule.parse("status:500,duration_s=120")]) as server:
        assert post_chat(server).status_code == 500
        assert post_chat(server).status_code == 500
    with serve(faults=[FaultRule.parse("status:500,duration_s=0.3")]) as server:
        time.sleep(0.4)
        assert post_chat(server).status_code == 200


def test_scenario_scoped_rule_only_hits_its_scenario() -> None:
    with serve(faults=[FaultRule.parse("status:503,scenario=openai/flaky")]) as server:
        assert post_chat(server, model="openai/direct").status_code == 200
        assert post_chat(server, model="flaky").status_code == 503
        assert post_chat(server, model="openai/flaky").status_code == 503
        assert server.stats()["by_scenario"] == {"direct": 1, "flaky": 2}
        names = [m["id"] for m in httpx.get(f"{server.url}/models").json()["data"]]
        assert set(names) == {"direct", "flaky", "scripted"}


def test_first_matching_rule_wins_and_falls_through() -> None:
    rules = [FaultRule.parse("status:429,first_n=1"), FaultRule.parse("status:500,first_n=1")]
    with serve(faults=rules) as server:
        assert [post_chat(server).status_code for _ in range(3)] == [429, 500, 200]


# --------------------------------------------------------------------------- latency


def test_fixed_latency_applies_to_answers_and_status_faults() -> None:
    # 1 s: a request without it is quicker, even on a busy machine
    with serve(latency=LatencyModel.parse("1000"), faults=[FaultRule.parse("status:503,first_n=1")]) as server:
        for expected in (503, 200):
            t0 = time.monotonic()
            assert post_chat(server).status_code == expected
            assert time.monotonic() - t0 >= 1.0
        server.set_latency(LatencyModel.parse("0"))
        t0 = time.monotonic()
        assert post_chat(server).status_code == 200
        assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("spec", ["uniform:50,150", "normal:100,20", "lognormal:100,0.5", "exponential:100"])
def test_seeded_samplers_are_reproducible(spec: str) -> None:
    model = LatencyModel.parse(spec)
    a = [model.sampler(1)() for _ in range(1)]  # a fresh sampler per call must restart the sequence
    s1, s1_again, s2 = model.sampler(1), model.sampler(1), model.sampler(2)
    seq1 = [s1() for _ in range(50)]
    assert seq1 == [s1_again() for _ in range(50)]
    assert seq1 != [s2() for _ in range(50)]
    assert a[0] == seq1[0]
    assert all(x >= 0 for x in seq1)
    assert 0.02 < sum(seq1) / len(seq1) < 0.5  # seconds, around the ~100 ms scale of every spec
    if model.kind == "uniform":
        assert all(0.05 <= x <= 0.15 for x in seq1)


def test_normal_is_clamped_at_zero() -> None:
    sample = LatencyModel.parse("normal:1,100").sampler(3)
    assert min(sample() for _ in range(200)) == 0.0


@pytest.mark.parametrize(("spec", "kind", "params"), [
    ("0", "fixed", (0.0,)), ("120", "fixed", (120.0,)), ("fixed:120", "fixed", (120.0,)),
    ("uniform:50,150", "uniform", (50.0, 150.0)), ("normal:100,20", "normal", (100.0, 20.0)),
    ("lognormal:100,0.5", "lognormal", (100.0, 0.5)), ("exponential:100", "exponential", (100.0,)),
])
def test_latency_parse_valid(spec: str, kind: str, params: tuple[float, ...]) -> None:
    model = LatencyModel.parse(spec)
    assert (model.kind, model.params) == (kind, params)
    assert LatencyModel.parse(model.to_spec()) == model
    assert model.describe()


@pytest.mark.parametrize("spec", ["", "abc", "gamma:1,2", "uniform:150,50", "uniform:1", "normal:100",
                                  "fixed:-5", "exponential:x", "fixed:nan"])
def test_latency_parse_errors(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        LatencyModel.parse(spec)
    assert repr(spec) in str(info.value)


# --------------------------------------------------------------------------- fault specs


def test_fault_parse_valid_and_round_trip() -> None:
    rule = FaultRule.parse("malformed_json,first_n=1,scenario=direct")
    assert (rule.mode, rule.first_n, rule.scenario) == ("malformed_json", 1, "direct")
    assert FaultRule.parse("status:429,duration_s=10") == FaultRule("status", status=429, duration_s=10.0)
    assert FaultRule.parse("hang,hang_s=5").hang_s == 5.0
    assert FaultRule.parse("status").status == 503
    for spec in ("status:503,first_n=3", "hang,first_n=1", "reset,first_n=2", "hang,hang_s=5"):
        r = FaultRule.parse(spec)
        assert FaultRule.from_dict(json.loads(json.dumps(r.to_dict()))) == r


@pytest.mark.parametrize(("spec", "needle"), [
    ("explode", "'explode'"), ("status:abc", "status:abc"), ("status:200", "200"),
    ("status:503,first_n", "'first_n'"), ("status:503,bogus=1", "'bogus=1'"), ("hang,first_n=-1", "first_n"),
    ("reset:5", "'reset:5'"), ("reset,hang_s=1", "hang_s"), ("hang,hang_s=soon", "hang,hang_s=soon"),
])
def test_fault_parse_errors(spec: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        FaultRule.parse(spec)
    assert needle in str(info.value)


def test_fault_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown fault rule key"):
        FaultRule.from_dict({"mode": "status", "colour": "red"})
    with pytest.raises(ValueError, match="unknown fault mode"):
        FaultRule.from_dict({"mode": "melt"})


# --------------------------------------------------------------------------- HTTP surface


def test_errors_health_models_and_keep_alive() -> None:
    with serve() as server:
        bad = post_chat(server, "BAD")
        assert bad.status_code == 400 and "no route for prompt 'BAD'" in bad.json()["error"]["message"]
        raw = httpx.post(f"{server.url}/chat/completions", content=b"{not json", timeout=HANG_S)
        assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz").json() == {"ok": True}
        assert httpx.get(f"{server.url}/nope").status_code == 404
        # also accepted without the /v1 prefix
        plain = httpx.post(f"http://127.0.0.1:{server.port}/chat/completions", json=chat_body("x"), timeout=HANG_S)
        body = plain.json()
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["model"] == "direct" and isinstance(body["created"], int)
        # two requests on one HTTP/1.1 connection: the server must keep it alive
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_S)
        try:
            for text in ("one", "two"):
                conn.request("POST", "/v1/chat/completions", body=json.dumps(chat_body(text)),
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                assert json.loads(resp.read())["choices"][0]["message"]["content"] == f"echo: {text}"
                assert not resp.will_close
        finally:
            conn.close()
        stats = server.stats()
        assert stats["requests"] == 5 and stats["responses_ok"] == 3 and stats["responses_error"] == 2


def test_admin_endpoints_switch_faults_at_run_time() -> None:
    with serve() as server, httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=HANG_S,
                                         headers={"Authorization": f"Bearer {server.admin_token}"}) as admin:
        assert post_chat(server, run="r1").status_code == 200
        rules = [FaultRule.parse("status:500,first_n=1").to_dict()]
        assert admin.post("/admin/faults", json={"rules": rules}).status_code == 200
        assert [post_chat(server, run="r1").status_code for _ in range(2)] == [500, 200]
        assert admin.post("/admin/faults", json={"rules": [{"mode": "status", "status": 503}]}).status_code == 200
        assert post_chat(server).status_code == 503
        assert admin.delete("/admin/faults").status_code == 200
        assert post_chat(server).status_code == 200
        bad = admin.post("/admin/faults", json={"rules": [{"mode": "melt"}]})
        assert bad.status_code == 400 and "melt" in bad.json()["error"]["message"]
        assert admin.post("/admin/latency", json={"spec": "fixed:120", "seed": 1}).status_code == 200
        t0 = time.monotonic()
        assert post_chat(server).status_code == 200
        assert time.monotonic() - t0 >= 0.12
        assert admin.post("/admin/latency", json={"spec": "soon"}).status_code == 400
        stats = admin.get("/admin/stats").json()
        assert stats["faults_applied"] == {"status": 2}
        assert stats["by_run"] == {"r1": 3, "global": 3}
        assert stats == server.stats()


# --------------------------------------------------------------------------- subprocess entry point


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_subprocess_ready_serves_and_exits_on_sigterm() -> None:
    cmd = [sys.executable, "-m", "testbed.model_server", "--responder", "tests.test_model_server:echo_responder",
           "--fault", "status:503,first_n=1", "--model-latency", "fixed:0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "no READY line within 10 s"
        line = proc.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:") and line.endswith("/v1\n")
        url = line.split()[1]
        first = httpx.post(f"{url}/chat/completions", json=chat_body("sub"), timeout=HANG_S)
        second = httpx.post(f"{url}/chat/completions", json=chat_body("sub"), timeout=HANG_S)
        assert (first.status_code, second.status_code) == (503, 200)
        assert second.json()["choices"][0]["message"]["content"] == "echo: sub"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0
        assert proc.stdout.read() == ""  # exactly one stdout line
    finally:
        if proc.poll() is None:
            proc.kill()  # only the pid this test started
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize(("args", "needle"), [
    (["--model-latency", "gamma:1"], "gamma:1"),
    (["--fault", "status:503,frist_n=3"], "frist_n=3"),
    (["--responder", "no_such_module_xyz:respond"], "no_such_module_xyz"),
])
def test_subprocess_bad_args_exit_2(args: list[str], needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", "testbed.model_server", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2
    assert needle in done.stderr and done.stdout == ""


def test_subprocess_help() -> None:
    done = subprocess.run([sys.executable, "-m", "testbed.model_server", "--help"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0
    for flag in ("--host", "--port", "--model-latency", "--fault", "--seed", "--responder"):
        assert flag in done.stdout

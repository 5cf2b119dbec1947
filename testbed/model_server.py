"""Scripted OpenAI-compatible model server: a stand-in LLM API with fault injection.

Contract
--------
* ``ScriptedModelServer`` serves the two OpenAI model APIs over real HTTP/1.1 with keep-alive, so a
  client's whole path (LiteLLM -> openai SDK -> httpx, an agent framework's own client) is exercised:
  ``POST /v1/chat/completions`` and ``POST /v1/responses`` (also without ``/v1``), each whole or
  streamed (``"stream": true``: server-sent events over a chunked body; chat ends with ``data: [DONE]``
  and honours ``stream_options.include_usage``, Responses sends ``event: <type>`` frames from
  ``response.created`` to ``response.completed``). ``testbed.model_wire`` holds the formats.
  Point a client at ``server.url`` (ends in ``/v1``) with any API key and any model name, e.g. LiteLLM's
  ``acompletion(model="openai/<scenario>", api_base=server.url, api_key="scripted", max_retries=0)`` or
  ``openai.OpenAI(base_url=server.url, api_key="any")``.
* Answer *content* comes from a pluggable ``Responder``: it receives an OpenAI chat request body (dict; a
  Responses request arrives translated to one) and returns the assistant message dict.  A ``ValueError``
  from the responder becomes HTTP 400 with an OpenAI-style error body; any other exception becomes HTTP 500.
* The run key of a request is its ``X-DAH-Run`` header (else ``"global"``); the scenario is
  ``body["model"]`` without a leading ``"openai/"`` (the default responder answers a name it has no
  scenario for with its ``auto`` route).
* ``FaultRule``s (``testbed.faults.model``: each mode's contract) are checked in order, on both APIs, streamed
  or not; the first active matching rule is applied and counted per (rule, run key): ``status``, ``hang``,
  ``reset``, ``malformed_json``, ``malformed_output``, ``stream_cut``.
* A ``LatencyModel`` sample (seeded, reproducible) is slept before every normal answer and
  before status / malformed faults, never before ``hang`` / ``reset``.
* Other routes: ``GET /v1/models``, ``GET /healthz``, and the admin routes ``GET /admin/stats``,
  ``POST|DELETE /admin/faults``, ``POST /admin/latency`` (loopback only, ``Authorization: Bearer <admin_token>``).
* The service plumbing is ``testbed.http_service``'s (its contract): the admin token (``server.admin_token``; the
  subprocess takes it from ``DAH_MODEL_ADMIN_TOKEN``), only this user's connections, the bounds (here at most
  ``MAX_CONNECTIONS`` connections and ``MAX_BODY_BYTES`` a body, 413), a prompt, idempotent ``stop()``.
* ``python -m testbed.model_server`` runs it as a subprocess: prints exactly one line
  ``READY <url>`` to stdout, serves until SIGTERM/SIGINT, exits 0; bad specs exit 2.

The model routes are open to any process of this user's: they are what the agent under test calls (see SECURITY.md).

Library code logs through ``logging`` (DEBUG per request) and never logs request headers,
because they carry API keys.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import logging
import math
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.commands import CommandParser
from harness import model_record
from testbed import model_wire, task_planner
from testbed.http_service import HEADER_TIMEOUT_S, READ_TIMEOUT_S, HTTPService, ServiceHandler, serve_until_signalled
from testbed.faults.model import FAULT_FORMS, FaultRule, first_active, malformed_tool_call, status_error
from testbed.model_wire import strip_provider

__all__ = [
    "Responder",
    "LatencyModel",
    "ScriptedModelServer",
    "LATENCY_KINDS",
    "main",
]

logger = logging.getLogger(__name__)

Responder = Callable[[dict], dict]

DEFAULT_RESPONDER = "testbed.scripted_routes:respond"
RUN_HEADER = "X-DAH-Run"
GLOBAL_RUN = "global"
#: run keys kept apart at most (any local process can send the header: past this, new keys share one count)
MAX_RUN_KEYS = 1024
MAX_RUN_KEY_CHARS = 200
OTHER_RUNS = "(other runs)"
DEFAULT_MODEL_NAME = "scripted"
#: the environment variable the subprocess reads its admin token from (never a flag: argv is public to ``ps``)
ADMIN_TOKEN_ENV = "DAH_MODEL_ADMIN_TOKEN"

#: the largest request body (the agent sends whole conversations: a few MB at the most in practice)
MAX_BODY_BYTES = 32 * 1024 * 1024
#: connections served at once (one thread each); the agent's workers keep a few each
MAX_CONNECTIONS = 256


# kind -> number of parameters it takes
LATENCY_KINDS: dict[str, int] = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2, "exponential": 1}
_LATENCY_FORMS = (
    "'<ms>' or 'fixed:<ms>', 'uniform:<lo_ms>,<hi_ms>', 'normal:<mean_ms>,<sd_ms>', "
    "'lognormal:<median_ms>,<sigma>', 'exponential:<mean_ms>'"
)


# --------------------------------------------------------------------------- latency


@dataclass(frozen=True)
class LatencyModel:
    """Response latency distribution, in milliseconds, sampled from a seeded RNG."""

    kind: str = "fixed"  # fixed | uniform | normal | lognormal | exponential
    params: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        # Validate here so direct construction and parse() enforce the same rules.
        if self.kind not in LATENCY_KINDS:
            raise ValueError(
                f"unknown latency kind {self.kind!r}; allowed forms: {_LATENCY_FORMS}"
            )
        want = LATENCY_KINDS[self.kind]
        params = tuple(float(p) for p in self.params)
        object.__setattr__(self, "params", params)
        spec = self.to_spec()
        if len(params) != want:
            raise ValueError(
                f"latency {self.kind!r} takes {want} parameter(s), got {len(params)} in {spec!r}; "
                f"allowed forms: {_LATENCY_FORMS}"
            )
        if any(not math.isfinite(p) or p < 0 for p in params):
            raise ValueError(f"latency parameters must be finite and >= 0 in {spec!r}")
        if self.kind == "uniform" and params[0] > params[1]:
            raise ValueError(f"uniform latency needs lo <= hi in {spec!r}")

    @classmethod
    def parse(cls, spec: str) -> "LatencyModel":
        """Parse "120", "fixed:120", "uniform:50,150", "normal:100,20", "lognormal:100,0.5", "exponential:100"."""
        text = spec.strip()
        kind, sep, rest = text.partition(":")
        if not sep:
            kind, rest = "fixed", text  # bare number = fixed milliseconds
        kind = kind.strip().lower()
        if kind not in LATENCY_KINDS:
            raise ValueError(f"bad latency spec {spec!r}: unknown kind {kind!r}; allowed forms: {_LATENCY_FORMS}")
        try:
            params = tuple(float(p) for p in rest.split(",")) if rest.strip() else ()
        except ValueError:
            raise ValueError(
                f"bad latency spec {spec!r}: parameters must be numbers; allowed forms: {_LATENCY_FORMS}"
            ) from None
        try:
            return cls(kind, params)
        except ValueError as exc:
            raise ValueError(f"bad latency spec {spec!r}: {exc}") from None

    def sampler(self, seed: int) -> Callable[[], float]:
        """Return a function giving successive latency samples in seconds; same seed -> same sequence."""
        rng = random.Random(seed)
        p = self.params
        draw: Callable[[], float]
        if self.kind == "fixed":
            draw = lambda: p[0]  # noqa: E731
        elif self.kind == "uniform":
            draw = lambda: rng.uniform(p[0], p[1])  # noqa: E731
        elif self.kind == "normal":
            draw = lambda: max(0.0, rng.gauss(p[0], p[1]))  # noqa: E731
        elif self.kind == "lognormal":
            # median m => mu = ln(m); a zero median degenerates to always 0
            draw = (lambda: rng.lognormvariate(math.log(p[0]), p[1])) if p[0] > 0 else (lambda: 0.0)
        else:  # exponential
            draw = (lambda: rng.expovariate(1.0 / p[0])) if p[0] > 0 else (lambda: 0.0)
        return lambda: draw() / 1000.0

    def describe(self) -> str:
        """Human-readable summary, e.g. "normal(mean=100ms, sd=20ms)"."""
        p = [f"{x:g}" for x in self.params]
        if self.kind == "fixed":
            return f"fixed({p[0]}ms)"
        if self.kind == "uniform":
            return f"uniform({p[0]}ms..{p[1]}ms)"
        if self.kind == "normal":
            return f"normal(mean={p[0]}ms, sd={p[1]}ms, clamped at 0)"
        if self.kind == "lognormal":
            return f"lognormal(median={p[0]}ms, sigma={p[1]})"
        return f"exponential(mean={p[0]}ms)"

    def to_spec(self) -> str:
        """Canonical spec string that parse() accepts, e.g. "normal:100,20"."""
        return f"{self.kind}:" + ",".join(f"{x:g}" for x in self.params)


# --------------------------------------------------------------------------- server


class _Handler(ServiceHandler):
    """The model routes and their admin routes, on the service plumbing (``testbed.http_service``)."""

    server_version = "DAHScriptedModel/1.0"
    max_body_bytes = MAX_BODY_BYTES

    @property
    def owner(self) -> ScriptedModelServer:
        return self.server.owner  # type: ignore[return-value]

    def _models(self, body: bytes) -> None:
        now = int(time.time())
        data = [{"id": name, "object": "model", "created": now, "owned_by": "durable-agent-harness"}
                for name in self.owner.model_names()]
        self._send_json(200, {"object": "list", "data": data})

    def _admin_clear_faults(self, body: bytes) -> None:
        self.owner.set_faults([])
        self._send_json(200, {"ok": True, "rules": []})

    def _admin_set_faults(self, raw: bytes) -> None:
        try:
            payload = self._json(raw or b"{}", "the request body")
            rules_in = payload.get("rules") if isinstance(payload, dict) else None
            if not isinstance(rules_in, list):
                raise ValueError('body must be {"rules": [FaultRule dicts]}')
            rules = [FaultRule.from_dict(r) for r in rules_in]
        except (ValueError, TypeError) as exc:
            self._send_error(400, f"bad fault rules: {exc}")
            return
        self.owner.set_faults(rules)
        self._send_json(200, {"ok": True, "rules": [r.to_dict() for r in rules]})

    def _admin_set_latency(self, raw: bytes) -> None:
        try:
            payload = self._json(raw or b"{}", "the request body")
            if not isinstance(payload, dict) or not isinstance(payload.get("spec"), str):
                raise ValueError('body must be {"spec": "<latency spec>", "seed": <int, optional>}')
            latency = LatencyModel.parse(payload["spec"])
            seed = payload.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise ValueError(f"seed must be an integer, got {seed!r}")
        except ValueError as exc:
            self._send_error(400, f"bad latency: {exc}")
            return
        self.owner.set_latency(latency, seed=seed)
        self._send_json(200, {"ok": True, "latency": latency.to_spec(), "describe": latency.describe()})

    # -- model calls: chat completions and the Responses API, whole or streamed
    def _model_call(self, raw: bytes, api: str) -> None:
        """Answer one model request of ``api`` ("chat" or "responses"): its fault if a rule matches, else the
        responder's message, whole or as a stream (``"stream": true``)."""
        owner = self.owner
        run_key = owner._run_key(self.headers.get(RUN_HEADER))
        try:
            body = self._json(raw, "the request body")
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
        except ValueError as exc:
            owner._count_request(None, run_key)
            self._send_error(400, f"invalid JSON body: {exc}")
            return
        try:
            chat = model_wire.responses_to_chat(body) if api == "responses" else body
        except ValueError as exc:
            owner._count_request(None, run_key)
            self._send_error(400, f"invalid Responses request: {exc}")
            return
        stream = body.get("stream") is True
        model = body.get("model")
        scenario = strip_provider(model) if isinstance(model, str) and model else DEFAULT_MODEL_NAME
        owner._count_request(scenario, run_key)

        rule = owner._match_fault(scenario, run_key)
        if rule is not None and rule.mode != "stream_cut":
            owner._record(api, stream, chat, None, fault=rule.mode)
        if rule is not None:
            logger.debug("fault %s for scenario=%s run=%s (%s%s)", rule.describe(), scenario, run_key, api,
                         ", streamed" if stream else "")
            if rule.mode == "hang":
                owner._wait_stop(rule.hang_s)  # hold the connection, answer nothing
                self.close_connection = True
                return
            if rule.mode == "reset":
                self._reset_connection()
                return
            owner._sleep_latency()
            if rule.mode == "status":
                self._send_status_fault(rule.status)
                return
            if rule.mode == "malformed_json":
                self._send_malformed_json(api, body, chat, scenario, stream)
                return
            if rule.mode == "malformed_output":
                self._send_answer(api, body, chat, scenario,
                                  malformed_tool_call(chat, f"call_malformed_{owner._next_id()}"), stream)
                return
        else:
            owner._sleep_latency()
        try:
            message = owner.responder(chat)
        except ValueError as exc:
            owner._count_outcome(ok=False)
            self._send_error(400, f"responder rejected the request: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a responder bug must not kill the server
            logger.exception("responder failed for scenario=%s", scenario)
            owner._count_outcome(ok=False)
            self._send_error(500, f"responder failed: {type(exc).__name__}: {exc}", "server_error", "responder_error")
            return
        if not isinstance(message, dict):
            owner._count_outcome(ok=False)
            self._send_error(500, f"responder returned {type(message).__name__}, expected a message dict",
                             "server_error", "responder_error")
            return
        message = {"role": "assistant", **message}
        if "content" not in message:
            message["content"] = None
        owner._record(api, stream, chat, message)
        owner._count_outcome(ok=True)
        self._send_answer(api, body, chat, scenario, message, stream,
                          cut=rule is not None and rule.mode == "stream_cut")

    def _send_answer(self, api: str, body: dict, chat: dict, scenario: str, message: dict, stream: bool,
                     *, cut: bool = False) -> None:
        """``message`` in ``api``'s shape; ``cut``: stop halfway and close (the ``stream_cut`` fault)."""
        owner = self.owner
        if api == "responses":
            response_id = f"resp_{owner._next_id()}"
            if stream:
                self._send_stream([f"event: {name}\ndata: {json.dumps(event)}\n\n"
                                   for name, event in model_wire.response_events(body, response_id, message)], cut)
                return
            payload = model_wire.response_object(body, response_id, message)
        else:
            completion_id = f"chatcmpl-{owner._next_id()}"
            if stream:
                chunks = model_wire.chat_chunks(chat, completion_id, scenario, message)
                self._send_stream([f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"], cut)
                return
            payload = model_wire.chat_completion(chat, completion_id, scenario, message)
        if not cut:
            self._send_json(200, payload)
            return
        whole = json.dumps(payload).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(whole)))  # promises the whole body, sends half of it
        self.end_headers()
        self.wfile.write(whole[: len(whole) // 2])
        self.wfile.flush()
        self.close_connection = True

    def _send_stream(self, frames: list[str], cut: bool = False) -> None:
        """Server-sent events, one HTTP chunk per event. ``cut``: only the first half of the events (never the
        last), then the connection closes without the chunked body's end, as a connection lost mid-stream."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if cut:
            frames = frames[: max(1, min(len(frames) - 1, len(frames) // 2))]
        for frame in frames:
            data = frame.encode("utf-8")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        if cut:
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_malformed_json(self, api: str, body: dict, chat: dict, scenario: str, stream: bool) -> None:
        """200 with a truncated JSON document: the whole body, or a streamed answer's first event."""
        ok = {"role": "assistant", "content": "ok"}
        if api == "responses":
            good = json.dumps(model_wire.response_object(body, "resp_malformed", ok))
            frame = "event: response.created\ndata: {}\n\n"
        else:
            good = json.dumps(model_wire.chat_completion(chat, "chatcmpl-malformed", scenario, ok))
            frame = "data: {}\n\n"
        half = good[: max(1, len(good) // 2)]
        if stream:
            self._send_stream([frame.format(half)] + (["data: [DONE]\n\n"] if api == "chat" else []))
        else:
            self._send_raw(200, half.encode("utf-8"))

    def _send_status_fault(self, status: int) -> None:
        message, type_, code, headers = status_error(status)
        self._send_error(status, message, type_, code, headers)

    routes = {**ServiceHandler.routes, ("GET", "/v1/models"): _models, ("GET", "/models"): _models,
              ("POST", "/v1/chat/completions"): lambda h, body: h._model_call(body, "chat"),
              ("POST", "/chat/completions"): lambda h, body: h._model_call(body, "chat"),
              ("POST", "/v1/responses"): lambda h, body: h._model_call(body, "responses"),
              ("POST", "/responses"): lambda h, body: h._model_call(body, "responses"),
              ("POST", "/admin/faults"): _admin_set_faults, ("POST", "/admin/latency"): _admin_set_latency,
              ("DELETE", "/admin/faults"): _admin_clear_faults}


class ScriptedModelServer(HTTPService):
    """OpenAI-compatible HTTP server answering from a responder, with latency and fault injection."""

    handler = _Handler
    admin_token_env = ADMIN_TOKEN_ENV
    url_path = "/v1"

    def __init__(self, responder: Responder, *, host: str = "127.0.0.1", port: int = 0,
                 latency: LatencyModel | None = None, faults: list[FaultRule] | None = None, seed: int = 0,
                 admin_token: str | None = None, max_connections: int = MAX_CONNECTIONS,
                 read_timeout_s: float = READ_TIMEOUT_S, header_timeout_s: float = HEADER_TIMEOUT_S,
                 record: Path | None = None):
        """``admin_token``: what the admin routes require (default: a new random one, ``self.admin_token``);
        ``record``: where the model record goes (``harness.model_record``; None: no record)."""
        super().__init__(host=host, port=port, admin_token=admin_token, max_connections=max_connections,
                         read_timeout_s=read_timeout_s, header_timeout_s=header_timeout_s)
        self.record = model_record.RecordWriter(record) if record is not None else None
        self.responder = responder
        self.seed = seed
        self._lock = threading.Lock()  # guards rules, counters, stats, sampler
        self._latency = latency or LatencyModel()
        self._sample = self._latency.sampler(seed)
        self._rules: list[FaultRule] = []
        self._rule_counts: dict[tuple[int, str], int] = {}
        self._installed_at = time.monotonic()
        self._ids = 0
        self._stats: dict[str, Any] = {}
        self._seen: dict[str, None] = {}  # insertion-ordered set of scenario names
        self._reset_stats()
        self.set_faults(list(faults or []))

    def _started(self) -> None:
        with self._lock:
            self._installed_at = time.monotonic()  # duration_s windows start when serving starts
        logger.debug("scripted model server listening on %s (latency %s, %d fault rule(s))",
                     self.url, self._latency.describe(), len(self._rules))

    def _stopped(self) -> None:
        if self.record is not None:
            self.record.close()
        logger.debug("scripted model server on port %s stopped", self._port)

    # -- runtime configuration
    def set_faults(self, rules: list[FaultRule]) -> None:
        rules = list(rules)
        with self._lock:
            self._rules = rules
            self._rule_counts = {}
            self._installed_at = time.monotonic()
        logger.debug("fault rules set: %s", [r.describe() for r in rules] or "none")

    def set_latency(self, latency: LatencyModel, *, seed: int | None = None) -> None:
        """Replace the latency model; the sampler restarts from ``seed`` (default: the server seed)."""
        with self._lock:
            self._latency = latency
            self._sample = latency.sampler(self.seed if seed is None else seed)
        logger.debug("latency set: %s", latency.describe())

    @property
    def latency(self) -> LatencyModel:
        return self._latency

    @property
    def faults(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def stats(self) -> dict:
        with self._lock:
            return copy.deepcopy(self._stats)

    def model_names(self) -> list[str]:
        with self._lock:
            names = dict(self._seen)
            for rule in self._rules:
                if rule.scenario:
                    names.setdefault(rule.scenario, None)
        names.setdefault(DEFAULT_MODEL_NAME, None)
        return list(names)

    # -- internals used by the handler
    def _record(self, api: str, stream: bool, chat: dict, answer: dict | None, fault: str | None = None) -> None:
        """One request of a task (its conversation holds a token) in the model record, if the server keeps one
        (``record``: ``harness.model_record``); other requests are not recorded."""
        if self.record is None:
            return
        messages = chat.get("messages") if isinstance(chat.get("messages"), list) else []
        try:
            seen = model_record.items([m for m in messages if isinstance(m, dict)])
        except Exception:  # noqa: BLE001 - a request the record cannot read is not recorded
            return
        tokens = [t for item in seen if item["k"] == "user" for t in item["tokens"]]
        if not tokens:
            return
        plain = [m for m in messages if isinstance(m, dict)]
        found = task_planner.task_token(plain)
        token = found[0] if found else None
        step = sum(1 for m in plain[found[1] + 1:] if m.get("role") == "assistant") if found else 0
        entry: dict[str, Any] = {"api": api, "stream": stream, "token": token, "tokens": tokens, "seen": seen,
                                 "answer": model_record.answer_items(answer) if answer else [],
                                 "final": bool(answer) and not answer.get("tool_calls")
                                 or _calls_output_tool(answer), "mark": _mark(token, answer)}
        if fault:
            entry["fault"] = fault
        entry["step"] = step
        self.record.write(entry)

    def _reset_stats(self) -> None:
        self._stats = {"requests": 0, "by_scenario": {}, "by_run": {}, "faults_applied": {},
                       "responses_ok": 0, "responses_error": 0}

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def _run_key(self, header: str | None) -> str:
        """The run key a request is counted under: its header, bounded in length and in how many are kept."""
        key = (header or GLOBAL_RUN)[:MAX_RUN_KEY_CHARS]
        with self._lock:
            if key in self._stats["by_run"] or len(self._stats["by_run"]) < MAX_RUN_KEYS:
                return key
        return OTHER_RUNS

    def _count_request(self, scenario: str | None, run_key: str) -> None:
        with self._lock:
            s = self._stats
            s["requests"] += 1
            s["by_run"][run_key] = s["by_run"].get(run_key, 0) + 1
            if scenario is not None:
                s["by_scenario"][scenario] = s["by_scenario"].get(scenario, 0) + 1
                self._seen.setdefault(scenario, None)
            else:
                s["responses_error"] += 1  # unparsable body

    def _count_outcome(self, *, ok: bool) -> None:
        with self._lock:
            self._stats["responses_ok" if ok else "responses_error"] += 1

    def _match_fault(self, scenario: str, run_key: str) -> FaultRule | None:
        """First active rule matching this request (``testbed.faults.model.first_active``); counts it as applied."""
        with self._lock:
            rule = first_active(self._rules, self._rule_counts, time.monotonic() - self._installed_at, scenario,
                                run_key)
            if rule is not None:
                applied = self._stats["faults_applied"]
                applied[rule.mode] = applied.get(rule.mode, 0) + 1
            return rule

    def _sleep_latency(self) -> None:
        with self._lock:
            delay = self._sample()
        if delay > 0:
            self._stopping.wait(delay)  # interruptible so stop() stays prompt

    def _wait_stop(self, timeout: float | None) -> None:
        self._stopping.wait(timeout)


# --------------------------------------------------------------------------- CLI


def _calls_output_tool(answer: dict | None) -> bool:
    return bool(answer) and any(task_planner.is_output_tool((c.get("function") or {}).get("name", ""))
                                for c in answer.get("tool_calls") or [])


def _mark(token: str | None, answer: dict | None) -> str | None:
    """What a reply must contain to carry this final answer: the final text (or, for a structured answer or an
    output tool's arguments, the string in it that carries the token); None for no final answer."""
    if not token or not answer:
        return None
    final = model_record.final_text(token)
    texts = [answer.get("content")] + [(c.get("function") or {}).get("arguments") for c in answer.get("tool_calls") or []
                                        if task_planner.is_output_tool((c.get("function") or {}).get("name", ""))]
    return final if any(isinstance(t, str) and final in t for t in texts) else None


def _load_responder(ref: str) -> Responder:
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"bad --responder {ref!r}: expected MODULE:FUNC, e.g. {DEFAULT_RESPONDER}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"bad --responder {ref!r}: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"bad --responder {ref!r}: {module_name!r} has no callable {attr!r}")
    return fn


def _arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


LATENCY_GRAMMAR = ("MS or fixed:MS, uniform:LO,HI, normal:MEAN,SD, lognormal:MEDIAN,SIGMA or exponential:MEAN "
                   "(milliseconds)")


def latency_spec(text: str) -> str:
    """argparse type of a latency SPEC: checked now (a bad one is a usage error naming it), kept as text."""
    try:
        LatencyModel.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_model_latency(parser: Any, *, default: str | None, default_text: str,
                      what: str = "the scripted model's response latency") -> argparse.Action:
    """``--model-latency SPEC`` (cli.options): one grammar everywhere; each command documents its own
    default. ``parser`` may be an argument group."""
    return parser.add_argument("--model-latency", type=latency_spec, default=default, metavar="SPEC",
                               help=f"{what}: {LATENCY_GRAMMAR} (default {default_text})")


def build_arg_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m testbed.model_server",
        description=(
            "Scripted OpenAI-compatible model server with fault injection. Serves POST /v1/chat/completions "
            "and POST /v1/responses, whole or streamed, for any model name (answers come from a responder "
            "function), GET /v1/models, GET /healthz and loopback-only admin "
            "routes (GET /admin/stats, POST|DELETE /admin/faults, POST /admin/latency), which need "
            f"'Authorization: Bearer TOKEN' with the TOKEN given in ${ADMIN_TOKEN_ENV} (unset: the admin routes "
            "are closed). Prints one line 'READY <url>' to stdout once listening, then serves until SIGTERM/SIGINT."
        ),
        epilog=(
            "latency specs: 0 | 120 | fixed:120 | uniform:50,150 | normal:100,20 (mean, sd; clamped at 0) | "
            "lognormal:100,0.5 (median ms, sigma) | exponential:100 (mean ms).  "
            f"fault specs: {FAULT_FORMS}.  "
            "Requests are grouped per run key from the X-DAH-Run header (default 'global'); first_n counts "
            "per run key."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free port (default: 0)")
    add_model_latency(parser, default="0", default_text="0", what="response latency distribution")
    parser.add_argument("--fault", type=_arg_type(FaultRule.parse), action="append", default=[], metavar="SPEC",
                        help="fault rule, repeatable; rules are checked in order, first match applies")
    parser.add_argument("--seed", type=int, default=0, help="seed for latency sampling (default: 0)")
    parser.add_argument("--responder", default=DEFAULT_RESPONDER, metavar="MODULE:FUNC",
                        help="function mapping a chat request body to an assistant message (default: %(default)s)")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="stderr log level (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_arg_parser()
    args = parser.parse_args(argv)  # bad specs exit 2 here, naming the value
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        responder = _load_responder(args.responder)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    return serve_until_signalled(ScriptedModelServer, responder, host=args.host, port=args.port,
                                 latency=LatencyModel.parse(args.model_latency), faults=args.fault, seed=args.seed)


if __name__ == "__main__":
    sys.exit(main())

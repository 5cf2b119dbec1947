"""The scripted model's faults: what ``testbed.model_server`` does to a chat-completion request a rule matches.

Contract
--------
* A ``FaultRule`` names a mode and when it applies: to the first ``first_n`` matching requests per run key (the
  ``X-DAH-Run`` header), for ``duration_s`` after the rules were set, only for one ``scenario`` (the request's
  model name, ``openai/`` stripped). Rules are checked in order, on both model APIs (chat completions and
  Responses), streamed or not; the first active one applies (``first_active``) and is counted.
* Modes, and what the client sees:
  ``status``: that HTTP status with an OpenAI-shaped error body (``status_error``); 429 adds ``Retry-After: 1``.
  ``hang``: no answer; the connection is held ``hang_s`` (or until the server stops), then closed.
  ``reset``: a TCP RST instead of an answer.
  ``malformed_json``: 200 with a truncated JSON body (streamed: the first event's data truncated).
  ``malformed_output``: 200, a valid envelope around a tool call whose ``arguments`` is not JSON
  (``malformed_tool_call``).
  ``stream_cut``: 200, then about half the answer and a close: a stream without its terminal event or the
  chunked body's end; a whole answer short of its ``Content-Length``.
* The server sleeps its latency sample before ``status`` and the malformed modes, never before ``hang`` or
  ``reset``. Who sets rules: ``dah model-server --fault SPEC`` / ``dah worker --model-fault SPEC``
  (``FaultRule.parse``), ``POST /admin/faults``, and the nemesis ``model_outage`` (``testbed.faults.nemesis``)
  through ``Stack.set_model_faults``; ``Stack.heal`` clears them.

The delivery on the wire (holding, resetting or cutting the connection) is the server's, which owns the socket.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from testbed.model_wire import strip_provider

FAULT_MODES: tuple[str, ...] = ("status", "hang", "reset", "malformed_json", "malformed_output", "stream_cut")
FAULT_KEYS: tuple[str, ...] = ("status", "first_n", "duration_s", "scenario", "hang_s")
FAULT_FORMS = (
    f"'<mode>[,key=value...]' with mode in {{{', '.join(FAULT_MODES)}}} "
    f"(status may be written 'status:<code>') and keys in {{{', '.join(FAULT_KEYS)}}}, "
    "e.g. 'status:503,first_n=3', 'hang,hang_s=5', 'malformed_json,first_n=1,scenario=direct'"
)


@dataclass
class FaultRule:
    """One fault the scripted model server applies to matching chat-completion requests.

    Modes: ``status`` (an error status with an OpenAI-style error body; 429 adds
    ``Retry-After``), ``hang`` (never answer; close after ``hang_s`` or at stop),
    ``reset`` (TCP RST), ``malformed_json`` (200 with a truncated body),
    ``malformed_output`` (200, a tool call whose ``arguments`` is not JSON),
    ``stream_cut`` (200, then the connection closes mid-answer: a streamed answer
    stops after about half its events, without its terminal event; a whole
    answer stops halfway through its body).
    """

    mode: str
    status: int = 503  # for mode=status; 429 also sends Retry-After
    first_n: int | None = None  # apply to the first N matching requests per run key; None = unlimited
    duration_s: float | None = None  # apply only this long after installation; None = no time limit
    scenario: str | None = None  # only this scenario ("openai/" prefix stripped); None = all
    hang_s: float | None = None  # for mode=hang: hold this long then close; None = until server stops

    def __post_init__(self) -> None:
        # Validate here so from_dict() and the admin endpoint get the same checks as parse().
        if self.mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {self.mode!r}; allowed modes: {', '.join(FAULT_MODES)}")
        if isinstance(self.status, bool) or not isinstance(self.status, int) or not 400 <= self.status <= 599:
            raise ValueError(f"fault status must be an HTTP 4xx/5xx code, got {self.status!r}")
        if self.first_n is not None and (
            isinstance(self.first_n, bool) or not isinstance(self.first_n, int) or self.first_n < 0
        ):
            raise ValueError(f"fault first_n must be an integer >= 0, got {self.first_n!r}")
        for key in ("duration_s", "hang_s"):
            val = getattr(self, key)
            if val is not None:
                if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val < 0:
                    raise ValueError(f"fault {key} must be a number >= 0, got {val!r}")
                setattr(self, key, float(val))
        if self.hang_s is not None and self.mode != "hang":
            raise ValueError(f"fault key hang_s only applies to mode 'hang', not {self.mode!r}")
        if self.scenario is not None:
            if not isinstance(self.scenario, str) or not self.scenario:
                raise ValueError(f"fault scenario must be a non-empty string, got {self.scenario!r}")
            self.scenario = strip_provider(self.scenario)

    @classmethod
    def parse(cls, spec: str) -> FaultRule:
        """Parse the CLI form, e.g. "status:503,first_n=3", "hang,hang_s=5", "reset,first_n=2"."""
        parts = [p.strip() for p in spec.split(",")]
        head, rest = parts[0], parts[1:]
        mode, sep, arg = head.partition(":")
        mode = mode.strip().lower()
        if mode not in FAULT_MODES:
            raise ValueError(
                f"bad fault spec {spec!r}: unknown mode {mode!r}; allowed modes: {', '.join(FAULT_MODES)}; "
                f"form: {FAULT_FORMS}"
            )
        kwargs: dict[str, Any] = {}
        if sep:
            if mode != "status":
                raise ValueError(f"bad fault spec {spec!r}: only 'status' takes ':<code>', got {head!r}")
            kwargs["status"] = arg
        for part in rest:
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in FAULT_KEYS:
                raise ValueError(
                    f"bad fault spec {spec!r}: bad part {part!r}; allowed keys: {', '.join(FAULT_KEYS)}; "
                    f"form: {FAULT_FORMS}"
                )
            if key in kwargs:
                raise ValueError(f"bad fault spec {spec!r}: key {key!r} given twice")
            kwargs[key] = value.strip()
        try:
            if "status" in kwargs:
                kwargs["status"] = int(kwargs["status"])
            if "first_n" in kwargs:
                kwargs["first_n"] = int(kwargs["first_n"])
            for key in ("duration_s", "hang_s"):
                if key in kwargs:
                    kwargs[key] = float(kwargs[key])
        except ValueError:
            raise ValueError(
                f"bad fault spec {spec!r}: status/first_n must be integers and duration_s/hang_s numbers"
            ) from None
        try:
            return cls(mode=mode, **kwargs)
        except ValueError as exc:
            raise ValueError(f"bad fault spec {spec!r}: {exc}") from None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FaultRule:
        if not isinstance(d, dict):
            raise ValueError(f"fault rule must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown fault rule key(s) {unknown}; allowed: {sorted(known)}")
        if "mode" not in d:
            raise ValueError("fault rule needs a 'mode'")
        return cls(**d)

    def describe(self) -> str:
        """Spec-like string for logs, e.g. "status:503,first_n=3"."""
        out = f"status:{self.status}" if self.mode == "status" else self.mode
        for key in ("first_n", "duration_s", "scenario", "hang_s"):
            val = getattr(self, key)
            if val is not None:
                out += f",{key}={val:g}" if isinstance(val, float) else f",{key}={val}"
        return out


#: status -> (message, type, code), shaped like the real OpenAI error bodies
STATUS_ERRORS: dict[int, tuple[str, str, str]] = {
    429: ("Rate limit reached (injected fault)", "rate_limit_error", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request (injected fault)", "server_error", "internal_error"),
    502: ("Bad gateway (injected fault)", "server_error", "bad_gateway"),
    503: ("The engine is currently overloaded, please try again later (injected fault)", "server_error",
          "service_unavailable"),
    504: ("Gateway timeout (injected fault)", "server_error", "gateway_timeout"),
}


def status_error(status: int) -> tuple[str, str, str, dict[str, str] | None]:
    """The ``status`` fault's answer: (error message, error type, error code, extra headers)."""
    message, type_, code = STATUS_ERRORS.get(
        status,
        (f"Injected HTTP {status}", "invalid_request_error" if status < 500 else "server_error", f"http_{status}"),
    )
    return message, type_, code, {"Retry-After": "1"} if status == 429 else None


def malformed_tool_call(chat: dict, call_id: str) -> dict:
    """The ``malformed_output`` fault's assistant message: a call of the request's first tool (else
    ``calculator``) whose ``arguments`` is not JSON (its closing brace is missing)."""
    name = "calculator"
    try:
        name = str(chat.get("tools")[0]["function"]["name"]) or name  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        pass
    call = {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": '{"expression": "25 * 4"'}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def first_active(rules: list[FaultRule], used: dict[tuple[int, str], int], elapsed_s: float, scenario: str,
                 run_key: str) -> FaultRule | None:
    """The first rule that applies to a request of ``scenario`` and ``run_key`` now (``elapsed_s`` since the rules
    were set), counted in ``used`` ((rule index, run key) -> times applied); None if none does. The caller holds
    whatever lock guards ``used``."""
    for idx, rule in enumerate(rules):
        if rule.scenario is not None and rule.scenario != scenario:
            continue
        if rule.duration_s is not None and elapsed_s > rule.duration_s:
            continue
        key = (idx, run_key)
        if rule.first_n is not None and used.get(key, 0) >= rule.first_n:
            continue
        used[key] = used.get(key, 0) + 1
        return rule
    return None

"""Every fault the harness injects into an agent itself, and into the model API it calls.

Network, process and server faults come from outside (``chaos/nemesis.py``,
``testbed/net.py``). The faults here act *inside* the agent's worker or its
model API, at points an outside observer cannot hit exactly:

* **crash points** (``CRASH_POINTS``): the worker SIGKILLs itself right after
  a model call completed or right after an effect was applied, before the
  activity reports back. Each point fires once per effect ledger (the first
  worker to reach it), so the restarted worker can finish the work.
* **logic bugs** (``bugs``): the named tools raise on every attempt, the
  hot-fix scenario's broken build; a worker started without them is the fix.
* **mutations** (``MUTATIONS``): deliberately broken builds that exist to prove
  a checker catches what it claims to (``unkeyed_effects``: every effect is
  applied on every attempt, its idempotency key ignored).
* **model API fault rules** (``FaultRule``): the scripted model server answers
  an error status, hangs, resets the connection, sends garbage or cuts its
  answer (streamed or not) mid-way.

The agent-side faults reach a worker either explicitly (``dah worker
--crash-at/--bug/--mutation``) or through its environment
(``AgentFaults.environment()``: ``DAH_CRASH_AT``, ``DAH_BUGS``,
``DAH_MUTATIONS``), which is how an agent we did not write gets them: its
activities record executions and effects through ``harness.recording``, and
the recording calls these seams at the right moments. Nothing here runs unless
a fault was asked for.

The environment contract (bring-your-own targets)
-------------------------------------------------

Every worker process the chaos harness starts for a target (``testbed.engines``:
process or container) gets these variables when the scenario asks for the fault
(``ClusterSpec.crash_at`` / ``bugs`` / ``mutations``; unset otherwise), on top of
the target's own ``[env]``. Values are comma-separated names. An
``EffectLedger`` opened without ``faults=`` reads them itself
(``AgentFaults.from_environment()``), so a target that records through
``harness.recording`` needs no code for them:

* ``DAH_LEDGER`` = the effect ledger's path (the target's ``ledger``, under the
  run's state dir; set when the target declares one): where the recording
  writes. Call ``EffectLedger.from_environment()``.
* ``DAH_CRASH_AT`` = ``after_model_call``: the worker SIGKILLs itself once a
  model call is recorded ``ok``, before its activity reports back. Call
  ``begin_execution(ident, name, model_call=True)``, then
  ``end_execution(id, "ok")`` (it fires there).
* ``DAH_CRASH_AT`` = ``after_effect``: the worker SIGKILLs itself once an
  effect is applied and recorded, before its activity reports back. Call
  ``apply_once`` / ``apply_once_async`` (it fires as they return).
* ``DAH_BUGS`` = tool or activity names: ``begin_execution`` for such a name
  raises ``InjectedBug`` (a retryable failure) on every attempt, until a
  worker without the bug runs. Call ``begin_execution(ident, name)`` at the
  start of every attempt.
* ``DAH_MUTATIONS`` = ``unkeyed_effects``: ``apply_once`` applies the effect on
  every attempt, its idempotency key ignored; each time is recorded (ledger
  table ``mutations``). Call ``apply_once`` / ``apply_once_async``; a mutated
  path of the agent's own asks ``faults.mutated(name)`` and, where it takes
  it, calls ``ledger.record_mutation(name, ident, tool)``.
* ``DAH_MUTATIONS`` = ``attempt_keyed_effects``: ``apply_once`` records each
  effect under a key that includes the attempt number, so a retry applies it
  again (and the ledger cannot see the duplicate: the workspace can). Call
  ``apply_once`` / ``apply_once_async``.
* ``DAH_MUTATIONS`` = ``swallow_tool_errors`` or ``slow_tool_without_heartbeat``:
  the reference agent's own tool activities (a retryable tool failure turned
  into the answer "ok"; a tool that works past its heartbeat timeout without
  heartbeating); ``cancel_on_sigterm``: the reference worker cancels its
  in-flight work on SIGTERM instead of draining it. An agent of yours plants
  its own the same way.

A crash point fires once per ledger (the first worker to reach it; the table
``crash_points`` says which), so the restarted worker can finish the work. A
declared mutation with no ``mutations`` row, or a crash point scheduled that
never fired, means the bug was not exercised: ``injection_evidence`` says
``unknown``, never ``pass``. ``{identity}`` in the worker command is the worker
identity the nemesis matches against the ledger's ``worker`` column and
Temporal's: pass it as the ``worker`` of ``ExecutionIdentity.current``.

Standard library only: this module is imported in a target agent's own Python.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

log = logging.getLogger(__name__)

#: where a worker may SIGKILL itself: point -> what has happened and what has not
CRASH_POINTS: dict[str, str] = {
    "after_model_call": "the model call completed and was recorded; its activity has not reported back",
    "after_effect": "the effect was applied and recorded; its activity has not reported back",
}
#: deliberately broken builds: name -> what is broken
MUTATIONS: dict[str, str] = {
    "unkeyed_effects": "every effect is applied on every attempt: its idempotency key is ignored",
    "attempt_keyed_effects": "each effect's idempotency key includes the attempt number, so a retry is a new "
                             "effect (a common way to get keys wrong)",
    "swallow_tool_errors": "a tool that fails retryably returns a made-up answer instead of failing (the reference "
                           "agent's tool activities)",
    "slow_tool_without_heartbeat": "a tool first works longer than its heartbeat timeout without heartbeating "
                                   "(the reference agent's tool activities), so every attempt times out",
    "cancel_on_sigterm": "on SIGTERM the worker cancels what it runs instead of draining it (the reference agent's "
                         "worker; the SDK's default), so the server retries that work elsewhere",
}
#: a reader of older run directories: a mutation's old name, as a saved run's scenario and ledger spell it -> its
#: name now (so an older run re-checks, and reruns with the same build); not a spelling to use
MUTATION_ALIASES = {"unkeyed_append": "unkeyed_effects"}
ENV_CRASH_AT, ENV_BUGS, ENV_MUTATIONS = "DAH_CRASH_AT", "DAH_BUGS", "DAH_MUTATIONS"


class InjectedBug(RuntimeError):
    """The hot-fix scenario's logic bug: raised on every attempt until a worker without it is deployed."""


def _names(value: str | None) -> frozenset[str]:
    return frozenset(n.strip() for n in (value or "").split(",") if n.strip())


@dataclass(frozen=True)
class AgentFaults:
    """The faults one worker process carries (none by default)."""

    crash_at: frozenset[str] = frozenset()
    bugs: frozenset[str] = frozenset()  # tool or activity names that raise on every attempt
    mutations: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "crash_at", frozenset(self.crash_at))
        object.__setattr__(self, "bugs", frozenset(self.bugs))
        object.__setattr__(self, "mutations", frozenset(MUTATION_ALIASES.get(m, m) for m in self.mutations))
        bad = sorted(self.crash_at - set(CRASH_POINTS))
        if bad:
            raise ValueError(f"crash point {', '.join(bad)}: unknown; points are {', '.join(CRASH_POINTS)}")
        bad = sorted(self.mutations - set(MUTATIONS))
        if bad:
            raise ValueError(f"mutation {', '.join(bad)}: unknown; mutations are {', '.join(MUTATIONS)}")

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> AgentFaults:
        """The faults the harness asked for through the environment (none when the variables are unset)."""
        env = os.environ if env is None else env
        return cls(_names(env.get(ENV_CRASH_AT)), _names(env.get(ENV_BUGS)), _names(env.get(ENV_MUTATIONS)))

    def environment(self) -> dict[str, str]:
        """The variables that give a worker process these faults (for ``from_environment`` on its side)."""
        out = {ENV_CRASH_AT: ",".join(sorted(self.crash_at)), ENV_BUGS: ",".join(sorted(self.bugs)),
               ENV_MUTATIONS: ",".join(sorted(self.mutations))}
        return {k: v for k, v in out.items() if v}

    def without_bugs(self) -> AgentFaults:
        """The hot-fix: the same worker, built without its logic bugs."""
        return AgentFaults(self.crash_at, frozenset(), self.mutations)

    def __bool__(self) -> bool:
        return bool(self.crash_at or self.bugs or self.mutations)

    def describe(self) -> str:
        parts = [f"crash_at={','.join(sorted(self.crash_at))}" if self.crash_at else "",
                 f"bugs={','.join(sorted(self.bugs))}" if self.bugs else "",
                 f"mutations={','.join(sorted(self.mutations))}" if self.mutations else ""]
        return " ".join(p for p in parts if p)

    # -- the seams: called by harness.recording (and the reference agent's activities) ---------------------

    def raise_if_buggy(self, name: str) -> None:
        if name in self.bugs:
            raise InjectedBug(f"injected logic bug in {name} (this worker was started with the bug {name!r})")

    def mutated(self, name: str) -> bool:
        return MUTATION_ALIASES.get(name, name) in self.mutations

    def wants_crash(self, point: str) -> bool:
        return point in self.crash_at

    @staticmethod
    def crash(point: str, worker: str) -> None:
        """SIGKILL this process now: nothing after this line runs, no activity result is sent."""
        log.warning("crash point %s reached: SIGKILLing worker %s", point, worker)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = AgentFaults()


# ----------------------------------------------------------------------------------------- the model API

FAULT_MODES: tuple[str, ...] = ("status", "hang", "reset", "malformed_json", "malformed_output", "stream_cut")
FAULT_KEYS: tuple[str, ...] = ("status", "first_n", "duration_s", "scenario", "hang_s")
FAULT_FORMS = (
    f"'<mode>[,key=value...]' with mode in {{{', '.join(FAULT_MODES)}}} "
    f"(status may be written 'status:<code>') and keys in {{{', '.join(FAULT_KEYS)}}}, "
    "e.g. 'status:503,first_n=3', 'hang,hang_s=5', 'malformed_json,first_n=1,scenario=direct'"
)


def strip_provider(model: str) -> str:
    """Scenario name of a model string: LiteLLM strips "openai/" but raw clients may not."""
    return model[len("openai/"):] if model.startswith("openai/") else model


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

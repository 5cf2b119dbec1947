"""The in-agent fault seam: every fault the harness injects into an agent's worker itself.

The orchestrator's faults (process kills and pauses, network, the Temporal server, the scripted model's fault
rules, the effects service's faults, the planted workflows) live in ``testbed/faults/``, whose docstring maps
every fault. These stay here, in the standard-library ``harness`` package, because they act *inside* the agent's
worker, at points an outside observer cannot hit exactly, and an agent we did not write imports this module in
its own Python; ``harness/recording.py`` is where they fire.

* **crash points** (``CRASH_POINTS``): the worker SIGKILLs itself right after
  a model call completed or right after an effect was applied, before the
  activity reports back. Each point fires once per effect ledger (the first
  worker to reach it), so the restarted worker can finish the work.
* **logic bugs** (``bugs``): the named tools raise on every attempt, the
  hot-fix scenario's broken build; a worker started without them is the fix.
* **mutations** (``MUTATIONS``): deliberately broken builds that exist to prove
  a checker catches what it claims to (``unkeyed_effects``: every effect is
  applied on every attempt, its idempotency key ignored).

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
``unknown``, never ``pass``. The nemesis names a worker as the Temporal server
lists it (``{identity}`` in the worker command, or without it the SDK's default
``<pid>@<hostname>``) and matches that against the ledger's ``worker`` column:
pass the same identity as the ``worker`` of ``ExecutionIdentity.current``.

Standard library only: this module is imported in a target agent's own Python.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

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
    # An agent's context gone wrong across a crash (the example CalcAgent's model activity reads these): what the
    # context and replies checks, judging by the model's record, must catch.
    "context_repeats_user_message": "a retried model call sends the user's message again (appended to its context "
                                    "a second time)",
    "context_drops_tool_result": "a restarted worker's model calls leave out the turn's last tool result (kept "
                                 "only in the memory of the worker that died)",
    "stale_reply_after_crash": "a retried model call answers with the conversation's previous answer (a cache "
                               "read back after the crash) instead of asking the model",
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

"""The reference agent's loop on engines other than Temporal and the checkpoint backend.

``agent/loop.py`` knows no engine; each module here makes its two effects (a model call, a tool call) durable
steps of one engine and runs the same ``run_turn``:

* ``agent.engines.dbos_agent``: DBOS Transact (a workflow per message; each model and tool call a ``@DBOS.step``;
  the system database SQLite or PostgreSQL);
* ``agent.engines.restate_agent``: Restate (a service handler per message; each call a ``ctx.run``; a Restate
  server process holds the journal).

``agent.engines.steps`` holds what a step does, the same on every engine: the model call and the tool call,
each recorded in the effect ledger under an identity stable across retries and recoveries.
"""


class EngineUnavailable(RuntimeError):
    """An engine cannot run on this machine (its server binary or database is not installed): the message says
    what is missing and how to install it. Benchmarks report such an engine ``unavailable``, never leave it out."""

"""The checkpoint engine: this project's own durable runs, with no server (docs/engines.md).

A run is a task function (``agent_task``: the agent loop) whose steps are checkpointed in a store
(``stores``: SQLite, files or memory); ``durable_run.run_durable`` replays completed steps and runs the rest;
``service`` holds the queue and the worker that takes runs under a lease; ``temporal_adapter`` runs the same
task on Temporal; ``engine.CheckpointEngine`` is the engine (``testbed.engines.base``); ``cli`` is
``dah checkpoint``.
"""

#: the checkpoint engine's runs, steps, events and queue, in a state dir
CHECKPOINT_DB = "checkpoint.sqlite3"

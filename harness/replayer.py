"""Replay saved event histories on a cold worker: ``python -m harness.replayer DIR --workflow MODULE:CLASS``.

The replayer is built the way the agent's workers are, from what the target declared (``testbed/engines/byo/target.py``):

    --plugin MODULE:NAME           (repeatable) a Temporal plugin (``temporalio.plugin.SimplePlugin``, any
                                   ``temporalio.worker.Plugin``) or a zero-argument callable returning one
    --data-converter MODULE:NAME   a ``temporalio.converter.DataConverter`` (payload codec, pydantic, ...) or a
                                   zero-argument callable returning one
    --workflow-runner MODULE:NAME  a ``temporalio.worker.WorkflowRunner`` (``UnsandboxedWorkflowRunner``, a
                                   sandboxed runner with passthrough modules, ...) or a zero-argument callable
    --namespace NAME               the namespace the histories ran in (what ``workflow.info().namespace`` says)
    --no-strict                    only Temporal's own replay check: no comparison of inputs (``harness.strict_replay``)
    --strict-ignore JSON_PATH      (repeatable) a JSON path left out of every compared input, e.g.
                                   ``$.messages[*].timestamp``: a value a framework computes afresh on each replay

Strict by default: besides Temporal's own check (the sequence of commands), every activity and child workflow the
replay schedules is compared, type and input, with the event that scheduled it (``harness.strict_replay``).

Prints one line ``REPLAY-RESULT {"replayed": n, "failures": [{workflow_id, run_id, error}], "strict": {...},
"uses": {...}}`` (``strict``: ``harness.strict_replay.Comparison.as_dict`` over every history that replayed, or
``{"off": true}``; ``uses``: the plugins, data converter and workflow runner it replayed with) and exits 0
whenever it could judge (failures are in the JSON). If a declared object cannot be loaded or built it prints
``REPLAY-RESULT {"error": "..."}`` naming the object and exits 3. If the saved histories cannot be read (a symlink
inside the run directory, a file over its bound, one that is not JSON: ``harness.run_files``' rules) it prints
``REPLAY-RESULT {"unreadable": "..."}``, the one line that says which and why, and exits 4. Any other exit means it
could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.converter import DataConverter
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, WorkflowRunner

from harness.event_history import load_saved
from harness.strict_replay import Comparison, InputRecorder, compare

try:
    from temporalio.worker import Plugin
except ImportError:  # a temporalio older than plugins (a target's own pins)
    Plugin = None  # type: ignore[assignment,misc]

RESULT_PREFIX = "REPLAY-RESULT "
#: the exit status when a declared workflow, plugin, converter or runner could not be loaded
SETUP_ERROR = 3
#: the exit status when the saved histories could not be read
UNREADABLE = 4


class SetupError(Exception):
    """A declared object could not be loaded or is not what it was declared as."""


def load_object(option: str, spec: str) -> Any:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SetupError(f"{option} {spec!r}: expected MODULE:NAME, e.g. my_agent.temporal:make_plugin")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # ImportError, AttributeError, or anything the module raised while importing
        raise SetupError(f"{option} {spec!r}: cannot load it ({type(exc).__name__}: {exc}); is its package "
                         "importable from the target's cwd / PYTHONPATH?") from None
    return obj


def build(option: str, spec: str, kind: type) -> Any:
    """``spec``'s object if it is a ``kind``, else what calling it with no arguments returns (a ``kind``)."""
    obj = load_object(option, spec)
    if not isinstance(obj, kind):
        if not callable(obj):
            raise SetupError(f"{option} {spec!r}: a {type(obj).__name__}, neither a {kind.__name__} nor a "
                             "zero-argument callable returning one")
        try:
            obj = obj()
        except Exception as exc:
            raise SetupError(f"{option} {spec!r}: calling it raised {type(exc).__name__}: {exc}") from None
        if not isinstance(obj, kind):
            raise SetupError(f"{option} {spec!r}: calling it returned a {type(obj).__name__}, not a "
                             f"{kind.__name__}")
    return obj


def load_class(spec: str) -> type:
    module, _, name = spec.partition(":")
    if not name:
        raise SetupError(f"--workflow {spec!r}: expected MODULE:CLASS, e.g. agent.workflow:AgentWorkflow")
    return load_object("--workflow", spec)


def active_config(replayer: Replayer) -> dict[str, Any]:
    """The replayer's configuration after every plugin's ``configure_replayer``."""
    try:
        return dict(replayer.config(active_config=True))
    except TypeError:  # older temporalio: no plugins, so the config it was given is the one in use
        return dict(replayer.config())


def make_replayer(workflow: type, plugins: Sequence[str] = (), data_converter: str | None = None,
                  workflow_runner: str | None = None, recorder: InputRecorder | None = None,
                  namespace: str | None = None) -> tuple[Replayer, dict[str, Any]]:
    """A ``Replayer`` built like the agent's workers, and what it uses (for the result's ``uses``). With a
    ``recorder`` it is the first interceptor (plugins append theirs after it), so it sees each call as scheduled."""
    kwargs: dict[str, Any] = {"interceptors": [recorder]} if recorder is not None else {}
    if namespace:
        kwargs["namespace"] = namespace
    if plugins and Plugin is None:
        raise SetupError(f"--plugin {plugins[0]!r}: this temporalio has no worker plugins; upgrade it")
    built = [build("--plugin", spec, Plugin) for spec in plugins]
    if built:
        kwargs["plugins"] = built
    if data_converter:
        kwargs["data_converter"] = build("--data-converter", data_converter, DataConverter)
    if workflow_runner:
        kwargs["workflow_runner"] = build("--workflow-runner", workflow_runner, WorkflowRunner)
    try:
        replayer = Replayer(workflows=[workflow], **kwargs)
    except Exception as exc:  # e.g. the sandbox refusing the workflow's module, a plugin's configure_replayer
        raise SetupError(f"building the replayer for {workflow.__qualname__} raised {type(exc).__name__}: "
                         f"{exc}") from None
    config = active_config(replayer)
    converter = config.get("data_converter") or DataConverter.default
    uses = {
        "plugins": [{"spec": spec, "name": p.name()} for spec, p in zip(plugins, built)],
        "data_converter": {"spec": data_converter,
                           "payload_converter": type(converter.payload_converter).__qualname__,
                           "payload_codec": (type(converter.payload_codec).__qualname__
                                             if converter.payload_codec else None)},
        "workflow_runner": {"spec": workflow_runner,
                            "type": type(config.get("workflow_runner")).__qualname__},
        "interceptors": [type(i).__qualname__ for i in config.get("interceptors") or []],
    }
    return replayer, uses


async def replay(saved: dict[str, list[tuple[str, WorkflowHistory]]], replayer: Replayer,
                 recorder: InputRecorder | None = None, ignore: Sequence[str] = ()) -> dict:
    """Replay every saved history (``harness.event_history.load_saved``), one at a time; with a ``recorder``
    (installed by ``make_replayer``), compare each replayed call's type and input with the history's
    (``harness.strict_replay``; ``ignore``: JSON paths left out)."""
    histories = [(run_id, history) for chain in saved.values() for run_id, history in chain]
    failures = []
    strict: dict[str, Any] = {"off": True}
    config = active_config(replayer)
    if recorder is not None:
        installed = recorder in (config.get("interceptors") or [])
        strict = {} if installed else {
            "error": "a plugin's configure_replayer dropped the strict-replay interceptor: inputs not compared"}
    total = Comparison()
    converter = config.get("data_converter") or DataConverter.default
    for run_id, history in histories:
        if recorder is not None:
            recorder.take()  # nothing left over from another history
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:  # already a failure: its calls are not compared
            err = result.replay_failure
            failures.append({"workflow_id": history.workflow_id, "run_id": run_id,
                             "error": f"{type(err).__name__}: {err}"})
        elif recorder is not None and "error" not in strict:
            try:
                total.merge(await compare(history.workflow_id, run_id, history.events, recorder.take(), converter,
                                          ignore))
            except Exception as exc:  # never a pass: the comparison is unknown, Temporal's own check still stands
                strict = {"error": f"comparing {history.workflow_id}'s inputs raised {type(exc).__name__}: "
                                   f"{exc}"[:400]}
    if recorder is not None and "error" not in strict:
        strict = {**total.as_dict(), "ignored_paths": list(ignore)}
    return {"replayed": len(histories), "failures": failures, "strict": strict}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.replayer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("histories", type=Path, help="directory of <workflow id>/<n>-<run id>.json event histories")
    parser.add_argument("--workflow", default="agent.workflow:AgentWorkflow", help="MODULE:CLASS of the workflow")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE:NAME",
                        help="a worker plugin the agent's workers use (repeatable, in order)")
    parser.add_argument("--data-converter", metavar="MODULE:NAME", help="the agent's data converter")
    parser.add_argument("--workflow-runner", metavar="MODULE:NAME", help="the agent's workflow runner")
    parser.add_argument("--namespace", help="the namespace the event histories ran in (default: the Replayer's)")
    parser.add_argument("--no-strict", dest="strict", action="store_false",
                        help="do not compare activity and child workflow inputs with the event history's")
    parser.add_argument("--strict-ignore", action="append", default=[], metavar="JSON_PATH",
                        help="a JSON path left out of every compared input, e.g. '$.messages[*].timestamp' "
                             "(repeatable): a value the agent's framework computes afresh on every replay")
    args = parser.parse_args(argv)
    recorder = InputRecorder() if args.strict else None
    try:
        replayer, uses = make_replayer(load_class(args.workflow), args.plugin, args.data_converter,
                                       args.workflow_runner, recorder, args.namespace)
    except SetupError as exc:
        print(RESULT_PREFIX + json.dumps({"error": str(exc)}), flush=True)
        return SETUP_ERROR
    try:
        saved = load_saved(args.histories)
    except (OSError, ValueError) as exc:  # RefusedPath, RunDirError: run data that is not read, said in one line
        print(RESULT_PREFIX + json.dumps({"unreadable": str(exc)}), flush=True)
        return UNREADABLE
    result = asyncio.run(replay(saved, replayer, recorder, args.strict_ignore))
    print(RESULT_PREFIX + json.dumps({**result, "uses": uses}), flush=True)  # tagged: the SDK's core may log to stdout
    return 0


if __name__ == "__main__":
    from harness.exit import exit_now

    exit_now(main())

"""The driver API, version 3: what a target's driver receives and must provide. Standard library only.

A driver puts the load on the agent: it starts the conversations, sends the messages, records each operation
(invoke, then ok / fail / info: Jepsen's semantics, ``harness.operations``) and reads the conversations back at
the end. A target file names none (its ``[chat]`` table: ``harness.chat_driver`` drives it) or its own
``driver = "MODULE:NAME"``, a factory called in the target's Python (``harness.driver_host``) as

    make_driver(*, client, history, task_queue, workload, seed)

``client`` (a connected ``temporalio.client.Client``), ``history`` (the run's operation log, the keyword's one older name kept for drivers already written: ``invoke(process, f, value)`` ->
op, ``complete(op, type, value, error)``, ``event(process, f, value)``), ``task_queue`` (the run's), ``workload``
(a ``Workload`` below: a dataclass, so ``dataclasses.asdict(workload)`` works) and ``seed`` (int). It returns an
object with ``workflow_ids`` (list of str: the conversations, known up front), ``async run()`` (drive the load),
``async finish()`` (end the conversations, read them back) and ``to_json()`` (``conversations``: each with
``workflow_id``, ``started``, ``planned`` messages (``text``, ``expect``, ``kind``, ``path``, ``content``),
``final_history`` (``role``/``content`` messages) and ``final_status``, and optionally ``ends``: false for a chat
that never ends, whose workflow is rightly RUNNING at the end); optionally ``stop()`` (no new messages: called
when the faults heal). A planned message of kind ``task`` carries its token in ``content``
(``harness.model_record.make_token``): the scripted model answers it by planning a turn over the agent's own
tools, and the ``replies`` and ``context`` checks judge it against what the model said.

The module may declare ``DRIVER_API = 3`` (or 2: what version 3 added is optional): a driver module declaring
another version, a factory whose signature
lacks one of these keywords, or a driver lacking a method fails when the target loads (``python -m chaos``
checks it before any run, ``check_factory``), and again when the driver is built (``check_driver``), in one line
saying what changed. History of the contract:

- 1: the workload was a ``SimpleNamespace`` (``vars(workload)``; ``dataclasses.asdict`` raised TypeError).
- 2: the workload is the ``Workload`` dataclass, and carries the scenario's settings (``scenario``,
  ``max_history_events``, ``workflow_task_timeout_s``, ``timeouts``).
- 3: a conversation may declare ``ends: false`` (a chat that never ends: RUNNING at the end is right, and it may
  have continued as new); planned messages may be of kind ``task``, their token in ``content``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass
from typing import Any

DRIVER_API_VERSION = 3
#: the versions a driver module may declare: version 3 only added what a driver may say, so a version 2 driver runs
COMPATIBLE_VERSIONS = (2, 3)
#: the keywords the factory is called with
FACTORY_KEYWORDS = ("client", "history", "task_queue", "workload", "seed")
#: what the driver object must have (``stop`` is optional)
DRIVER_METHODS = ("run", "finish", "to_json")
CHANGES = {1: "since version 2 the workload is a dataclass (harness.driver_api.Workload), not a SimpleNamespace, "
              "and carries the scenario's settings"}
#: what each version added that an older driver may not know (shown when a target loads, never a refusal)
ADDED = {3: "a conversation may declare ends = false (its chat never ends: RUNNING at the end is right), and "
            "planned messages of kind 'task' (their token in content) are judged by the replies and context checks"}


@dataclass
class Workload:
    """The load a scenario asks for, and the scenario settings a driver needs to honour."""

    conversations: int = 3
    messages: int = 4  # per conversation, at least: with until_heal, each keeps sending until stop()
    until_heal: bool = True
    think_s: float = 0.4  # mean pause between a reply and the next message (seeded)
    op_timeout_s: float = 60.0  # past this a send is recorded as info
    try_timeout_s: float = 4.0  # a send's first try (re-sent under the same id; each timed-out try doubles, to 8x)
    append_ratio: float = 0.4  # the share of messages with a side effect (the chat driver's notes)
    flaky_ratio: float = 0.0
    repair_ratio: float = 0.0
    # -- the scenario's settings
    scenario: str = ""
    max_history_events: int = 0  # the scenario wants continue-as-new past this many events (0: the agent's own)
    workflow_task_timeout_s: float = 10.0  # what the scenario's timeouts profile starts workflows with
    timeouts: str = "fast"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        """The fields this version knows (a newer harness's extra fields are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def check_factory(factory: Any, module: Any = None) -> str | None:
    """What makes ``factory`` unfit for this API version (None: fit), in one line."""
    declared = getattr(module, "DRIVER_API", None) if module is not None else None
    if declared is not None and declared not in COMPATIBLE_VERSIONS:
        change = CHANGES.get(declared, "see harness/driver_api.py") if isinstance(declared, int) else ""
        return (f"it declares DRIVER_API = {declared!r}, this harness speaks version {DRIVER_API_VERSION}"
                + (f" ({change})" if change else "") + "; update it and set DRIVER_API = "
                + str(DRIVER_API_VERSION))
    if not callable(factory):
        return f"it is a {type(factory).__name__}, not a callable factory"
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None  # a builtin: nothing to read; the call says
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    missing = [k for k in FACTORY_KEYWORDS if k not in params or params[k].kind is inspect.Parameter.POSITIONAL_ONLY]
    extra = [n for n, p in params.items() if n not in FACTORY_KEYWORDS and p.default is p.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing or extra:
        return (f"its signature is {factory.__name__}{inspect.signature(factory)}; version {DRIVER_API_VERSION} "
                f"calls it with the keywords {', '.join(FACTORY_KEYWORDS)}"
                + (f" (it lacks {', '.join(missing)})" if missing else "")
                + (f" (it also requires {', '.join(extra)})" if extra else ""))
    return None


def check_driver(driver: Any) -> str | None:
    """What the built driver lacks (None: nothing), in one line."""
    missing = [m for m in DRIVER_METHODS if not callable(getattr(driver, m, None))]
    if not hasattr(driver, "workflow_ids"):
        missing.insert(0, "workflow_ids")
    if missing:
        return (f"the driver it built ({type(driver).__name__}) lacks {', '.join(missing)}; version "
                f"{DRIVER_API_VERSION} needs workflow_ids, async run(), async finish() and to_json()")
    return None


def load_factory(spec: str) -> tuple[Any, str | None]:
    """``MODULE:NAME`` imported, and what makes it unfit (None: fit)."""
    import importlib

    module_name, _, name = spec.partition(":")
    module = importlib.import_module(module_name)
    factory = getattr(module, name)
    problem = check_factory(factory, module)
    return factory, (f"driver {spec}: {problem}" if problem else None)


# -- templates and paths: what a [chat] table declares (harness.chat_driver; the lost checker reads paths too)

def fill_template(template: Any, values: dict[str, str]) -> Any:
    """A JSON template with its ``{name}`` placeholders replaced: a string that is exactly one placeholder becomes
    the value itself; any other string gets plain replacement (never ``str.format``); lists and tables recurse."""
    if isinstance(template, str):
        for key, value in values.items():
            if template == "{" + key + "}":
                return value
        for key, value in values.items():
            template = template.replace("{" + key + "}", str(value))
        return template
    if isinstance(template, list):
        return [fill_template(v, values) for v in template]
    if isinstance(template, dict):
        return {k: fill_template(v, values) for k, v in template.items()}
    return template


def at_path(value: Any, path: str) -> Any:
    """``value`` at the dotted ``path`` ("" : itself; a number indexes a list); KeyError naming the step missing."""
    for step in path.split(".") if path else []:
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.lstrip("-").isdigit() and -len(value) <= int(step) < len(value):
            value = value[int(step)]
        else:
            shown = json.dumps(value, default=str)[:120]
            raise KeyError(f"no {step!r} in {shown} (path {path!r})")
    return value


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.driver_api --check MODULE:NAME``: import the factory in this interpreter and check it
    (what ``python -m chaos`` runs in the target's Python when the target loads). Prints one line; 0 if fit."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.driver_api")
    parser.add_argument("--check", required=True, metavar="MODULE:NAME")
    args = parser.parse_args(argv)
    try:
        _, problem = load_factory(args.check)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised, said in one line
        problem = f"driver {args.check}: cannot load it ({type(exc).__name__}: {exc})".replace("\n", " ")
    print(problem or f"driver {args.check}: fits driver API version {DRIVER_API_VERSION}")
    return 1 if problem else 0


if __name__ == "__main__":
    raise SystemExit(main())

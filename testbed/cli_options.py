"""The options every command spells the same way (docs/commands.md, "One interface across the commands").

    --durability {temporal,checkpoint,dbos,dbos-postgres,restate}   the agent's durability backend (dah,
                                         python -m chaos; python -m benchmarks: temporal and checkpoint)
    --model-latency SPEC                 the scripted model's response latency, one grammar
                                         (testbed.model_server.add_model_latency)
    --out DIR                            the runs root (default runs/); each command writes into its own folder
                                         under it: runs/<scenario>/, runs/bench/, runs/migration_fuzz/
    progress                             on stderr (``progress``); results tables and machine output on stdout

An old spelling (of a flag, or of a value) still works for a while and says so in one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.printable import printable

DURABILITY = ("temporal", "checkpoint", "dbos", "dbos-postgres", "restate")
#: old durability values -> their names now
OLD_DURABILITY = {"journal": "checkpoint"}
RUNS = Path("runs")


def deprecated(prog: str, old: str, new: str) -> None:
    """The one-line note an old spelling gets (on stderr: stdout stays the command's results)."""
    print(f"{prog}: {old} is deprecated; use {new}", file=sys.stderr, flush=True)


class _Renamed(argparse.Action):
    """Stores the value under the canonical flag's name; an old spelling of the flag (``option_string``) or of a
    value (``old_values``) still works, with a deprecation note. Choices are checked here so that old values
    are accepted without being listed in ``--help`` or in the error message."""

    def __init__(self, option_strings: Sequence[str], dest: str, canonical: str,
                 allowed: Sequence[str] | None = None, old_values: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        self.canonical, self.allowed, self.old_values = canonical, allowed, old_values or {}
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and option_string != self.canonical:
            deprecated(parser.prog, option_string, self.canonical)
        if values in self.old_values:
            deprecated(parser.prog, f"{self.canonical} {values}", f"{self.canonical} {self.old_values[values]}")
            values = self.old_values[values]
        if self.allowed is not None and values not in self.allowed:
            parser.error(f"argument {self.canonical}: invalid choice: {values!r} "
                         f"(choose from {', '.join(self.allowed)})")
        setattr(namespace, self.dest, values)


def add_renamed(parser: Any, flag: str, *old_flags: str, choices: Sequence[str] | None = None,
                old_values: dict[str, str] | None = None, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(flag, **kwargs)``, plus ``old_flags`` as hidden deprecated aliases of it (and
    ``old_values`` as deprecated values). ``parser`` may be an argument group."""
    dest = kwargs.pop("dest", flag.lstrip("-").replace("-", "_"))
    if choices is not None:
        kwargs.setdefault("metavar", "{" + ",".join(choices) + "}")
    common = {"dest": dest, "action": _Renamed, "canonical": flag, "allowed": choices, "old_values": old_values,
              "type": kwargs.get("type"), "metavar": kwargs.get("metavar")}
    action = parser.add_argument(flag, **{**common, **kwargs})
    for old in old_flags:
        parser.add_argument(old, **common, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return action


def add_durability(parser: Any, *old_flags: str, help: str, choices: Sequence[str] = DURABILITY) -> argparse.Action:
    """``--durability {temporal,checkpoint,...}`` (default temporal; ``journal``: checkpoint's old name);
    ``choices``: the backends this command supports (default all)."""
    return add_renamed(parser, "--durability", *old_flags, choices=choices, old_values=OLD_DURABILITY,
                       default="temporal", help=help)


def add_out(parser: Any, folder: str, default: Path = RUNS) -> argparse.Action:
    """``--out DIR``: the runs root, as for every command; this one writes into DIR/<folder>/."""
    return parser.add_argument("--out", type=Path, default=default, metavar="DIR",
                               help=f"the runs root: this command writes into DIR/{folder}/ (default {default}/)")


def runs_root(out: Path, folder: str, prog: str) -> Path:
    """The runs root ``--out`` names, for a command whose own folder under it is ``folder``.

    ``--out`` used to name that folder itself for some commands (``--out runs/bench``): a root whose last part
    is the folder's name is taken in that old sense (the same directory as before), with a note."""
    if out.name == folder:
        deprecated(prog, f"--out {out} (the {folder} folder itself)",
                   f"--out {out.parent} (the runs root; {folder}/ is added)")
        return out.parent
    return out


def progress(start: float | None = None) -> Callable[[str], None]:
    """A progress printer: ``[  12.3s] message`` lines on stderr, seconds since ``start`` (default now); the message
    ``printable`` (it may quote run data)."""
    started = time.monotonic() if start is None else start

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {printable(message)}", file=sys.stderr, flush=True)
    return say

"""Placeholders in a command a target file declares (``{task_queue}``, ``{workflow_id}``, ...), filled safely.

A value may come from run data (a saved scenario's name fills ``{task_queue}``; a saved history's folder name
fills ``{workflow_id}``) and a target's command may pass it to a shell: a name placeholder's value is therefore
checked against ``PLACEHOLDER_NAME`` before it is filled, and a command is filled in one pass (a value holding
``{python}`` is never filled again).

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: the placeholders whose values are names (a scenario's, a run's, a workflow's): each must match
#: ``PLACEHOLDER_NAME``, so that a value taken from run data is never shell text nor an option (``-e ...``) to
#: a command that passes it on, and never a path
NAME_PLACEHOLDERS = ("task_queue", "identity", "namespace", "workflow_id")
PLACEHOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,254}")


def placeholder_problem(key: str, value: str) -> str | None:
    """Why ``value`` may not fill ``{key}`` (None: it may): a name placeholder's value outside
    ``PLACEHOLDER_NAME``."""
    if key in NAME_PLACEHOLDERS and not PLACEHOLDER_NAME.fullmatch(value):
        return (f"{{{key}}} would be {value[:80]!r}, which is not a name: letters, digits and _.:@+=- only, "
                "beginning with a letter or digit")
    return None


def fill(template: tuple[str, ...] | list[str], values: Mapping[str, str]) -> list[str]:
    """The command with every ``{placeholder}`` replaced, in one pass (a value is never filled again; unknown
    braces are left alone). ValueError for a name placeholder's value outside ``PLACEHOLDER_NAME``."""
    for key, value in values.items():
        problem = placeholder_problem(key, value)
        if problem:
            raise ValueError(problem)
    if not values:
        return list(template)
    pattern = re.compile(r"\{(" + "|".join(re.escape(k) for k in values) + r")\}")
    return [pattern.sub(lambda m: values[m.group(1)], part) for part in template]

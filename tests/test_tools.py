"""Tools, workspace confinement and the effect ledger, without Temporal."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agent.errors import ToolExecutionError, ToolRetryableError, ToolValidationError
from harness.recording import EffectLedger, ExecutionIdentity
from agent.tools import TOOLS, ToolContext, run_tool, validate_arguments


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ws = tmp_path / "sandbox" / "wf-1"
    ws.mkdir(parents=True)
    ledger = EffectLedger(tmp_path / "ledger.sqlite3")
    yield ToolContext(ws, ledger, ExecutionIdentity("wf-1", "run-1", "7", 1, "test-worker"))
    ledger.close()


def run(name: str, ctx: ToolContext, **args: object) -> str:
    validate_arguments(TOOLS[name], args)
    return asyncio.run(run_tool(TOOLS[name], args, ctx))


@pytest.mark.parametrize("expr,expected", [("25 * 4", "100"), ("(1 + 2) / 4", "0.75"), ("10 // 3", "3"),
                                           ("max(2, 7) - abs(-1)", "6"), ("7 / 7", "1")])
def test_calculator(ctx: ToolContext, expr: str, expected: str) -> None:
    assert run("calculator", ctx, expression=expr) == expected


@pytest.mark.parametrize("expr", ["25 x 4", "__import__('os')", "1 / 0", "2 ** 99999", "'a' * 3", "open('/etc/passwd')"])
def test_calculator_refuses_with_validation_errors(ctx: ToolContext, expr: str) -> None:
    with pytest.raises(ToolValidationError):
        run("calculator", ctx, expression=expr)


def test_arguments_are_validated_against_the_schema(ctx: ToolContext) -> None:
    with pytest.raises(ToolValidationError, match="missing required argument"):
        run("calculator", ctx)
    with pytest.raises(ToolValidationError, match="must be string"):
        run("calculator", ctx, expression=4)
    with pytest.raises(ToolValidationError, match="unknown argument 'mode'"):
        run("calculator", ctx, expression="1", mode="x")


def test_weather_is_deterministic(ctx: ToolContext) -> None:
    assert run("weather", ctx, city="Paris") == run("weather", ctx, city="paris".title())


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../x", "..", "", "a\x00b"])
def test_paths_outside_the_workspace_are_refused(ctx: ToolContext, path: str) -> None:
    with pytest.raises(ToolValidationError):
        run("read_file", ctx, path=path)
    with pytest.raises(ToolValidationError):
        run("write_file", ctx, path=path, content="x")
    assert not (ctx.workspace.parent.parent / "etc").exists()


def test_symlinks_cannot_smuggle_a_path_out(ctx: ToolContext, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, ctx.workspace / "link")
    with pytest.raises(ToolValidationError, match="escapes"):
        run("write_file", ctx, path="link/pwned.txt", content="x")
    assert list(outside.iterdir()) == []


def test_files_round_trip_inside_the_workspace(ctx: ToolContext) -> None:
    assert run("write_file", ctx, path="notes/a.txt", content="alpha") == "wrote 5 bytes to notes/a.txt"
    assert run("read_file", ctx, path="notes/./a.txt") == "alpha"
    assert run("list_files", ctx) == "notes/a.txt"
    with pytest.raises(ToolValidationError, match="does not exist"):
        run("read_file", ctx, path="nope.txt")


def test_a_retried_attempt_does_not_apply_the_effect_twice(ctx: ToolContext) -> None:
    run("write_file", ctx, path="a.txt", content="one")
    (ctx.workspace / "a.txt").write_text("changed by someone else")
    retry = ToolContext(ctx.workspace, ctx.ledger, ExecutionIdentity("wf-1", "run-1", "7", 2, "other-worker"))
    assert run("write_file", retry, path="a.txt", content="one") == "wrote 3 bytes to a.txt"  # same answer
    assert (ctx.workspace / "a.txt").read_text() == "changed by someone else"  # not re-applied
    (effect,) = ctx.ledger.effects("wf-1")
    assert (effect["state"], effect["apply_count"], effect["applied_attempt"]) == ("applied", 1, 1)


def claimed_then_crashed(ctx: ToolContext, tool: str, target: str, content: str) -> ToolContext:
    """Attempt 1 claimed the effect and wrote ``content`` to ``target``, then crashed before marking it
    applied; returns the context of attempt 2."""
    ctx.ledger._conn.execute(
        "INSERT INTO effects (idempotency_key, workflow_id, tool, target, digest, state, apply_count, first_attempt,"
        " updated_at) VALUES (?, 'wf-1', ?, ?, 'd', 'pending', 1, 1, 0)", (ctx.ident.idempotency_key, tool, target))
    (ctx.workspace / target).write_text(content)
    return ToolContext(ctx.workspace, ctx.ledger, ExecutionIdentity("wf-1", "run-1", "7", 2, "w2"))


def test_an_interrupted_apply_is_recovered_without_a_duplicate(ctx: ToolContext) -> None:
    retry = claimed_then_crashed(ctx, "write_file", "a.txt", "one")
    run("write_file", retry, path="a.txt", content="one")
    (effect,) = ctx.ledger.effects("wf-1")
    assert (effect["state"], effect["apply_count"]) == ("applied", 1)


def test_ledger_counts_executions_and_effects_separately(ctx: ToolContext) -> None:
    for attempt in (1, 2, 3):
        ident = ExecutionIdentity("wf-1", "run-1", "7", attempt, "w")
        ex = ctx.ledger.begin_execution(ident, "write_file")
        run("write_file", ToolContext(ctx.workspace, ctx.ledger, ident), path="a.txt", content="x")
        ctx.ledger.end_execution(ex, "ok")
    summary = ctx.ledger.summary("wf-1")
    assert (summary.executions, summary.activities_executed_more_than_once) == (3, 1)
    assert (summary.effects_applied, summary.duplicated_effects) == (1, 0)


def test_fault_tools_raise_classified_errors(ctx: ToolContext) -> None:
    with pytest.raises(ToolRetryableError):
        run("flaky_service", ctx, request="x", fail_attempts=1)
    later = ToolContext(ctx.workspace, ctx.ledger, ExecutionIdentity("wf-1", "run-1", "7", 2, "w"))
    assert "attempt 2" in run("flaky_service", later, request="x", fail_attempts=1)
    with pytest.raises(ToolExecutionError):
        run("broken_service", ctx, request="x")

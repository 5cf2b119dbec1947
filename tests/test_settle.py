"""The settle phase waits for a big load while it is still being answered, and gives up on a stalled one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from chaos.runner import SETTLE_ROUNDS, RunContext, _settle
from harness.operations import OK, OperationLog

SETTLE_S = 0.2


async def _load(oplog: OperationLog, answers: int, every_s: float) -> None:
    for _ in range(answers):
        await asyncio.sleep(every_s)
        oplog.complete(oplog.invoke("client-0", "send_message", {}), OK, {"reply": "x"})


async def test_a_load_still_answering_is_waited_for(tmp_path: Path) -> None:
    oplog, said = OperationLog(tmp_path / "operations.jsonl"), []
    load = asyncio.ensure_future(_load(oplog, answers=6, every_s=SETTLE_S / 2))  # ~3 settle rounds
    await _settle(RunContext(SimpleNamespace(name="s", settle_s=SETTLE_S), [], oplog, lambda p: None,  # type: ignore[arg-type]
                             said.append), load)
    assert load.done() and not load.cancelled(), said
    assert said and all("waiting on" in s for s in said), said


async def test_a_stalled_load_is_abandoned_after_one_round_with_no_answer(tmp_path: Path) -> None:
    oplog, said = OperationLog(tmp_path / "operations.jsonl"), []
    load = asyncio.ensure_future(asyncio.sleep(60))
    await _settle(RunContext(SimpleNamespace(name="s", settle_s=SETTLE_S), [], oplog, lambda p: None,  # type: ignore[arg-type]
                             said.append), load)
    assert not load.done() and said == ["s: load still running after 0s settle (no message was answered in the last "
                                        "0s); abandoning it"], said
    load.cancel()


async def test_a_load_that_never_ends_is_abandoned_after_the_last_round(tmp_path: Path) -> None:
    oplog, said = OperationLog(tmp_path / "operations.jsonl"), []
    load = asyncio.ensure_future(_load(oplog, answers=10_000, every_s=SETTLE_S / 4))
    await _settle(RunContext(SimpleNamespace(name="s", settle_s=SETTLE_S), [], oplog, lambda p: None,  # type: ignore[arg-type]
                             said.append), load)
    assert not load.done() and len(said) == SETTLE_ROUNDS and "abandoning it" in said[-1], said
    load.cancel()

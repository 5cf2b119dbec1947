"""The effects_outage nemesis: the external effects service refuses every note for a while (its armed status
fault), then recovers; a run without the service records the fault as not injected, never as landed. The reference
suite leaves the scenario out (its agent's effects are its ledger's)."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from testbed.faults.nemesis import NemesisContext, effects_outage
from chaos.scenarios import SCENARIOS, SUITE
from harness.operations import FAIL, OK, OperationLog
from testbed.effects_service import EffectsService


def _post(url: str) -> int:
    req = urllib.request.Request(f"{url}/v1/notes", data=json.dumps({"text": "note-1"}).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _ctx(tmp_path: Path, service: EffectsService | None) -> NemesisContext:
    return NemesisContext(stack=SimpleNamespace(effects_service=service), oplog=OperationLog(tmp_path / "ops.jsonl"),
                          workflow_ids=[], rng=random.Random(1))


async def test_the_service_refuses_notes_while_the_outage_lasts_then_applies_them(tmp_path: Path) -> None:
    import asyncio

    with EffectsService(tmp_path / "effects.jsonl") as service:
        ctx = _ctx(tmp_path, service)
        outage = asyncio.ensure_future(effects_outage(ctx, status=503, duration_s=1.5))
        await asyncio.sleep(0.3)
        assert await asyncio.to_thread(_post, service.url) == 503
        value = await outage
        assert await asyncio.to_thread(_post, service.url) == 200
        assert [n["text"] for n in service.notes()] == ["note-1"]  # the refused one applied nothing
    assert value["requests_refused"] == 1 and value["evidence"] == [{"effects_requests_refused": 1}]
    done = [json.loads(line) for line in (tmp_path / "ops.jsonl").read_text().splitlines()][-1]
    assert done["type"] == OK and done["f"] == "effects_outage"


async def test_without_the_service_it_is_not_injected(tmp_path: Path) -> None:
    value = await effects_outage(_ctx(tmp_path, None), duration_s=0.1)
    assert "no effects service" in value["not_injected"] and value["evidence"] == []
    done = [json.loads(line) for line in (tmp_path / "ops.jsonl").read_text().splitlines()][-1]
    assert done["type"] == FAIL and done["error"].startswith("not injected")


def test_the_reference_suite_leaves_it_out() -> None:
    assert "effects_outage" in SCENARIOS and "effects_outage" not in SUITE

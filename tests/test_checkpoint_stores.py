"""The durable-run store contract: one conformance suite that every store passes (memory, files, SQLite),
and the runner's replay, divergence, clock and event semantics on each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from testbed.engines.checkpoint.records import (
    AwaitEventTimeoutError,
    DivergenceError,
    DurableRunManifest,
    InputMismatchError,
    LeaseHeldError,
    StepError,
    StepInputMismatchError,
    canonical_hash,
    canonical_json,
    manifest_hash,
)
from testbed.engines.checkpoint.durable_run import DurableContext, run_durable
from testbed.engines.checkpoint.stores import DurableRunStore, FileSystemStore, InMemoryStore, SqliteStore

MANIFEST = DurableRunManifest(project_id="durable-agent", task={"id": "t1", "intent": "answer"}, input={"q": 1})
OTHER = DurableRunManifest(project_id="durable-agent", task={"id": "t1", "intent": "answer"}, input={"q": 2})


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["memory", "files", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[DurableRunStore]:
    s: DurableRunStore = {"memory": InMemoryStore, "files": lambda: FileSystemStore(tmp_path / "fs"),
                          "sqlite": lambda: SqliteStore(tmp_path / "runs.sqlite3")}[request.param]()
    clock = Clock()
    s.now = clock  # type: ignore[method-assign]
    s.clock = clock  # type: ignore[attr-defined]
    yield s
    await s.close()


def test_canonical_json_sorts_keys_and_refuses_what_cannot_round_trip() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": None}]}) == '{"a":[1,{"c":null,"d":2}],"b":1}'
    assert canonical_hash({"a": 1, "b": 2}) == canonical_hash({"b": 2, "a": 1})
    for bad in (float("nan"), float("inf"), {1, 2}, object()):
        with pytest.raises(ValueError, match="not a canonical JSON value"):
            canonical_json(bad)
    assert manifest_hash(MANIFEST) != manifest_hash(OTHER)
    tagged = DurableRunManifest(**{**MANIFEST.__dict__, "tags": {"who": "x"}})
    assert manifest_hash(tagged) == manifest_hash(MANIFEST)  # tags are not identity


async def test_start_creates_then_resumes_with_the_completed_steps(store: DurableRunStore) -> None:
    start = await store.start_or_resume("r1", MANIFEST, "w1", lease_ms=10_000)
    assert (start.run.status, start.run.lease_holder_id, start.completed_steps) == ("running", "w1", [])
    await store.begin_step("r1", 0, "llm:plan", "llm", "h0", worker_id="w1")
    await store.complete_step("r1", 0, {"answer": 42}, worker_id="w1")
    await store.begin_step("r1", 1, "tool:x", "tool", "", worker_id="w1")  # begun, never completed
    again = await store.start_or_resume("r1", MANIFEST, "w1")
    assert [(s.step_index, s.intent, s.result) for s in again.completed_steps] == [(0, "llm:plan", {"answer": 42})]
    assert again.run.step_count == 2
    step1 = await store.load_step("r1", 1)
    assert (step1.status, step1.attempts) == ("running", 1)
    assert await store.load_step("r1", 7) is None


async def test_a_different_manifest_for_the_same_run_id_is_refused(store: DurableRunStore) -> None:
    await store.start_or_resume("r2", MANIFEST, "w1")
    with pytest.raises(InputMismatchError, match="same run id, different inputs"):
        await store.start_or_resume("r2", OTHER, "w1")


async def test_a_live_lease_is_exclusive_and_an_expired_one_can_be_taken_over(store: DurableRunStore) -> None:
    clock = store.clock  # type: ignore[attr-defined]
    await store.start_or_resume("r3", MANIFEST, "w1", lease_ms=5_000)
    with pytest.raises(LeaseHeldError, match="leased by w1"):
        await store.start_or_resume("r3", MANIFEST, "w2", lease_ms=5_000)
    clock.t += 4
    assert (await store.renew_lease("r3", "w1", lease_ms=5_000))[0] is True
    clock.t += 4  # 8 s after the start, but renewed at 4 s: still live
    with pytest.raises(LeaseHeldError):
        await store.start_or_resume("r3", MANIFEST, "w2")
    clock.t += 2  # expired
    taken = await store.start_or_resume("r3", MANIFEST, "w2", lease_ms=5_000)
    assert taken.run.lease_holder_id == "w2"
    assert await store.renew_lease("r3", "w1") == (False, None)  # the old holder learns it lost the run
    with pytest.raises(LeaseHeldError):  # ... and cannot commit over its successor
        await store.begin_step("r3", 0, "x", "logic", "", worker_id="w1")


async def test_begin_bumps_attempts_complete_and_fail_record_the_outcome(store: DurableRunStore) -> None:
    await store.start_or_resume("r4", MANIFEST, "w1")
    first = await store.begin_step("r4", 0, "tool:flaky", "tool", "abc")
    assert (first.attempts, first.status, first.kind, first.input_hash) == (1, "running", "tool", "abc")
    failed = await store.fail_step("r4", 0, StepError("boom", code="RuntimeError"))
    assert (failed.status, failed.error.message, failed.error.code) == ("failed", "boom", "RuntimeError")
    second = await store.begin_step("r4", 0, "tool:flaky", "tool", "abc")
    assert (second.attempts, second.status, second.error) == (2, "running", None)
    done = await store.complete_step("r4", 0, ["ok", 1, None])
    assert (done.status, done.result) == ("completed", ["ok", 1, None]) and done.completed_at
    with pytest.raises(ValueError):
        await store.begin_step("r4", 1, "x", "magic", "")  # not a step kind
    await store.begin_step("r4", 1, "x", "logic", "")
    with pytest.raises(ValueError, match="not a canonical JSON value"):
        await store.complete_step("r4", 1, float("nan"))


async def test_end_run_releases_the_lease(store: DurableRunStore) -> None:
    await store.start_or_resume("r5", MANIFEST, "w1")
    ended = await store.end_run("r5", "w1", "completed")
    assert (ended.status, ended.lease_holder_id, ended.completed_at is not None) == ("completed", None, True)
    assert (await store.start_or_resume("r5", MANIFEST, "w2")).run.lease_holder_id == "w2"
    with pytest.raises(ValueError):
        await store.end_run("r5", "w2", "paused")


async def test_first_emit_wins_and_later_emits_return_the_existing_record(store: DurableRunStore) -> None:
    await store.start_or_resume("r6", MANIFEST, "w1")
    assert await store.load_event("r6", "approved") is None
    accepted, record = await store.emit_event("r6", "approved", {"by": "alice"})
    assert accepted and record.payload == {"by": "alice"}
    again, existing = await store.emit_event("r6", "approved", {"by": "mallory"})
    assert not again and existing.payload == {"by": "alice"}
    assert (await store.load_event("r6", "approved")).payload == {"by": "alice"}


async def test_concurrent_emitters_exactly_one_wins(store: DurableRunStore) -> None:
    await store.start_or_resume("r7", MANIFEST, "w1")
    results = await asyncio.gather(*(store.emit_event("r7", "k", {"n": i}) for i in range(10)))
    winners = [r for accepted, r in results if accepted]
    assert len(winners) == 1
    assert all(r.payload == winners[0].payload for _, r in results)


# -- the runner, on every store ---------------------------------------------------------------------


async def test_resume_returns_recorded_results_without_running_them_again(store: DurableRunStore) -> None:
    calls: list[str] = []

    def task(crash_after: int | None):
        async def fn(ctx: DurableContext) -> list:
            out = []
            for i in range(4):
                async def work(i: int = i) -> int:
                    calls.append(f"step{i}")
                    return i * 10
                out.append(await ctx.step(f"step{i}", work, kind="logic", input_fingerprint={"i": i}))
                if crash_after == i:
                    raise RuntimeError("crash")
            out.append((await ctx.now()).year)
            out.append(len(await ctx.uuid()))
            return out
        return fn

    with pytest.raises(RuntimeError, match="crash"):
        await run_durable("r8", MANIFEST, store, task(crash_after=1), worker_id="w1")
    assert calls == ["step0", "step1"]
    done = await run_durable("r8", MANIFEST, store, task(None), worker_id="w1")
    assert calls == ["step0", "step1", "step2", "step3"]  # 0 and 1 came from the store
    assert (done.replayed, done.executed, done.record.status) == (2, 4, "completed")
    again = await run_durable("r8", MANIFEST, store, task(None), worker_id="w1")
    assert again.result == done.result and again.executed == 0  # now and uuid replay identically


async def test_divergence_and_input_mismatch_are_raised(store: DurableRunStore) -> None:
    async def original(ctx: DurableContext) -> None:
        await ctx.step("plan", lambda: 1, input_fingerprint=["a"])
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError):
        await run_durable("r9", MANIFEST, store, original, worker_id="w1")

    async def reordered(ctx: DurableContext) -> None:
        await ctx.step("act", lambda: 2)

    with pytest.raises(DivergenceError, match="recorded as 'plan', now 'act'"):
        await run_durable("r9", MANIFEST, store, reordered, worker_id="w1")

    async def other_input(ctx: DurableContext) -> None:
        await ctx.step("plan", lambda: 1, input_fingerprint=["b"])

    with pytest.raises(StepInputMismatchError):
        await run_durable("r9", MANIFEST, store, other_input, worker_id="w1")
    with pytest.raises(InputMismatchError):
        await run_durable("r9", OTHER, store, original, worker_id="w1")


async def test_await_event_waits_for_the_emit_and_replays_it(store: DurableRunStore) -> None:
    async def task(ctx: DurableContext) -> dict:
        return await ctx.await_event("approval", timeout_s=5, poll_s=0.01)

    async def approve() -> None:
        await asyncio.sleep(0.05)
        assert await ctx_emit("approval", {"ok": True})

    async def ctx_emit(key: str, payload: dict) -> bool:
        return (await store.emit_event("r10", key, payload))[0]

    result, _ = await asyncio.gather(run_durable("r10", MANIFEST, store, task, worker_id="w1"), approve())
    assert result.result == {"ok": True} and result.steps[0].kind == "event"

    async def impatient(ctx: DurableContext) -> None:
        await ctx.await_event("never", timeout_s=0.05, poll_s=0.01)

    with pytest.raises(AwaitEventTimeoutError, match="no event 'never'"):
        await run_durable("r11", MANIFEST, store, impatient, worker_id="w1")


async def test_losing_the_lease_aborts_the_running_step_and_keeps_the_committed_ones() -> None:
    store = InMemoryStore()
    ran: list[str] = []

    async def task(ctx: DurableContext) -> None:
        await ctx.step("first", lambda: "done")

        async def slow() -> None:
            ran.append("slow started")
            store._runs["r12"].lease_holder_id = "another-worker"  # taken over (our lease expired while paused)
            await asyncio.sleep(60)
            ran.append("slow finished")

        await ctx.step("slow", slow)

    started = time.monotonic()
    with pytest.raises(LeaseHeldError, match="lost its lease mid-step"):
        await run_durable("r12", MANIFEST, store, task, worker_id="w1", lease_ms=300)
    # cancelled at a renewal (every 100 ms), not left to sleep its 60 s: generous for a busy machine
    assert ran == ["slow started"] and time.monotonic() - started < 30
    assert (await store.load_step("r12", 0)).status == "completed"
    assert (await store.load_step("r12", 1)).status == "running"  # begun, never completed: the new holder redoes it
    with pytest.raises(LeaseHeldError, match="leased by another-worker"):  # and this worker cannot commit it
        await store.complete_step("r12", 1, None, worker_id="w1")


async def test_file_store_survives_a_torn_line_and_reads_appends_from_other_processes(tmp_path: Path) -> None:
    first, second = FileSystemStore(tmp_path), FileSystemStore(tmp_path)  # two "processes" on one root
    await first.start_or_resume("r13", MANIFEST, "w1")
    await first.begin_step("r13", 0, "a", "logic", "")
    await first.complete_step("r13", 0, 1)
    steps_file = next(tmp_path.glob("r13-*")) / "steps.jsonl"
    with open(steps_file, "a") as f:
        f.write('{"run_id": "r13", "step_index": 1, "intent": "b", "ki')  # a crash mid-append
    assert (await second.load_step("r13", 1)) is None  # the torn record was never acknowledged
    await second.begin_step("r13", 1, "b", "logic", "")
    await second.complete_step("r13", 1, 2)
    assert (await first.load_step("r13", 1)).result == 2  # read from what the other one appended
    assert [s.result for s in (await first.start_or_resume("r13", MANIFEST, "w1")).completed_steps] == [1, 2]

"""The one run lifecycle (``harness.rundir.RunDir.recording``, ``chaos.runner.run``): how a run's end is recorded,
and a cluster that outlives one run (the seam ``chaos.runner.run``'s ``cluster`` gives a caller).

The recording is tested on its own (cheap); the cluster seam for real: two seeds of ``kill_idle`` on one Temporal
server, their verdicts held against the same seeds each on a cluster of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from testbed.engines.temporal.engine import ReferenceOnTemporal
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from harness.rundir import RUNNER_ERROR, RunDir
from testbed.engines.temporal.connection import TemporalConnection
from testbed.stack import StackSpec, stack
from testbed.engines.temporal.server import EmbeddedTemporal
from tests.run_directory import problems


def _record(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


def test_a_run_that_returns_is_complete_and_latest(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path / "bench")
    with run_dir.recording("bench", "bench", seed=1) as rec:
        assert _record(run_dir.path)["status"] == "running"  # from the first moment
        rec.doing = "section table2"
    record = _record(run_dir.path)
    assert record["status"] == "complete" and "stopped_during" not in record and record["wall_s"] is not None
    assert (tmp_path / "bench" / "latest").resolve() == run_dir.path
    assert not (run_dir.logs / RUNNER_ERROR).exists()


def test_an_error_is_recorded_failed_with_its_traceback_where_it_was(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path / "migration_fuzz")
    ended: list[str] = []
    with pytest.raises(OSError, match="No space left"):
        with run_dir.recording("migration_fuzz", "migration_fuzz", seed=0) as rec:
            rec.before_ending = lambda: ended.append("operation log closed")
            rec.doing = "iterations"
            raise OSError("No space left on device")
    record = _record(run_dir.path)
    assert (record["status"], record["error"], record["stopped_during"]) == (
        "failed", "OSError: No space left on device", "iterations")
    assert ended == ["operation log closed"]
    assert "No space left on device" in (run_dir.logs / RUNNER_ERROR).read_text()
    assert not (tmp_path / "migration_fuzz" / "latest").exists()  # only a complete run is latest


def test_ctrl_c_and_cancellation_are_recorded_interrupted_and_propagate(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path / "x")
    with pytest.raises(KeyboardInterrupt):
        with run_dir.recording("bench", "bench"):
            raise KeyboardInterrupt
    assert (_record(run_dir.path)["status"], _record(run_dir.path)["stopped_during"]) == ("interrupted", "setup")
    assert not (run_dir.logs / RUNNER_ERROR).exists()  # a stop is no error

    async def cancelled_mid_call() -> None:
        other = RunDir.create(tmp_path / "y")
        with other.recording("bench", "bench"):
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                raise RuntimeError("a client library's own error, raised by the cancellation") from None

    with pytest.raises(asyncio.CancelledError):  # turned back into the stop it was, so asyncio.run sees it
        asyncio.run(cancelled_mid_call())
    [other] = [p for p in (tmp_path / "y").iterdir()]
    assert _record(other)["status"] == "interrupted" and "error" not in _record(other)


@dataclasses.dataclass
class OneServer:
    """A cluster that outlives one run: every run given this ``cluster`` uses one Temporal server, started before
    them and stopped after; each run's workers, model server, proxies and effects service are its own."""

    server: EmbeddedTemporal
    runs: int = 0

    def __call__(self, spec: StackSpec):  # chaos.runner.Cluster
        self.runs += 1
        cluster = dataclasses.replace(spec.engine, connection=TemporalConnection(address=self.server.address),
                                      db=None, ui=False)
        return stack(dataclasses.replace(spec, engine=cluster))


def _verdicts(path: Path) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in json.loads((path / "verdict.json").read_text())["checks"]}


@pytest.mark.slow
async def test_two_seeds_on_one_warm_server_give_the_verdicts_of_a_cluster_each(tmp_path: Path) -> None:
    scenario = SCENARIOS["kill_idle"]
    async with EmbeddedTemporal(log_file=tmp_path / "shared-temporal.log") as server:
        cluster = OneServer(server)
        warm = [await run(scenario, ReferenceOnTemporal(), seed=seed, out_root=tmp_path / "warm", cluster=cluster)
                for seed in (1, 2)]
        assert cluster.runs == 2 and server.pid is not None and server._proc.poll() is None  # still up after both
    fresh = [await run(scenario, ReferenceOnTemporal(), seed=seed, out_root=tmp_path / "fresh") for seed in (1, 2)]
    for w, f in zip(warm, fresh):
        record = _record(w.run_dir)
        assert record["status"] == "complete" and set(record["phases"]) >= {"setup", "faults", "settle", "stopped"}
        assert (w.run_dir / "conversations.json").exists() and (w.run_dir / "event_histories").is_dir()
        assert problems(w.run_dir) == [], w.run_dir
        assert not (w.run_dir / "logs" / "temporal.log").exists()  # no server of its own: the shared one
        assert (f.run_dir / "logs" / "temporal.log").exists()
        assert _verdicts(w.run_dir) == _verdicts(f.run_dir), (w.run_dir, f.run_dir)
        assert w.verdict == f.verdict == "pass", (w.checks, f.checks)

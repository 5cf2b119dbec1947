"""Chaos against an external cluster: a dev server this test starts on its own (so to the harness it is just an
address) in a non-default namespace. The harness starts no server, runs the scenario that applies through its
proxies, and reports the one that needs the embedded server as skipped, never as a pass."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from cli import chaos as cli
from testbed.engines.temporal.connection import CHILD_ENV
from testbed.engines.temporal.server import EmbeddedTemporal
from tests.run_directory import assert_valid

NAMESPACE = "dah-ext"


@pytest.fixture
def external(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import os

    for key in list(os.environ):  # the machine's own Temporal settings must not redirect this run
        if key.startswith("TEMPORAL_") or key == CHILD_ENV:
            monkeypatch.delenv(key)
    with EmbeddedTemporal(namespace=NAMESPACE, log_file=tmp_path / "external-temporal.log") as server:
        yield server


def test_chaos_runs_against_an_external_cluster_and_skips_what_needs_the_embedded_one(
        external: EmbeddedTemporal, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs"
    rc = cli.main(["run", "kill_idle", "server_restart", "--address", external.address, "--namespace", NAMESPACE,
                   "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.out + printed.err
    rows = {line.split()[0]: line.split()[-1] for line in printed.out.splitlines()
            if line.startswith(("kill_idle ", "server_restart "))}
    assert rows == {"kill_idle": "pass", "server_restart": "skipped"}
    assert "1 passed, 0 not passed, 1 skipped" in printed.out
    assert "server_restart: skipped: restart_server needs the embedded server: cannot restart an external cluster" \
        in printed.out
    assert not (out / "server_restart").exists()  # nothing ran for it

    run = (out / "kill_idle" / "latest").resolve()
    assert_valid(run)
    record = json.loads((run / "run.json").read_text())
    assert record["backend"]["temporal"]["address"] == external.address
    assert record["backend"]["temporal"]["namespace"] == NAMESPACE
    assert f"--address {external.address} --namespace {NAMESPACE}" in record["reproduce"]
    assert not (run / "logs" / "temporal.log").exists() and not (run / "state" / "temporal.db").exists()
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["verdict"] == "pass" and "temporal_history" in verdict["checked"]  # histories from dah-ext

    workers = (run / "logs" / "w1-1.log").read_text()
    queue = workers.split("task_queue=")[1].split()[0]
    assert queue.startswith("chaos-kill_idle-")  # a shared cluster: this run's own task queue

    async def namespaces_of(workflow_id: str) -> list[str]:
        found = []
        for ns in (NAMESPACE, "default"):
            client = await Client.connect(external.address, namespace=ns)
            try:
                await client.get_workflow_handle(workflow_id).describe()
                found.append(ns)
            except RPCError:
                pass
        return found

    conversations = json.loads((run / "conversations.json").read_text())["conversations"]
    assert asyncio.run(namespaces_of(conversations[0]["workflow_id"])) == [NAMESPACE]

"""Shared fixtures: one real embedded Temporal dev server, scripted model
server and in-process worker for the whole session (started once: ~1 s for
the server, ~5 s to import LiteLLM)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from agent.worker import WorkerSettings
from testbed.stack import Stack, StackSpec, stack as start_stack

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    state_dir = tmp_path_factory.mktemp("dah-state")
    settings = WorkerSettings.in_state_dir(state_dir, task_queue=f"test-{uuid.uuid4().hex[:8]}")
    async with start_stack(StackSpec(state_dir=state_dir, temporal_workers=[settings])) as s:
        yield s


@pytest.fixture
def model_faults(stack: Stack):
    """Install scripted-model fault rules for one test; cleared afterwards whatever happens."""
    yield stack.model_server.set_faults
    stack.model_server.set_faults([])


def temporal_server_pids() -> set[int]:
    """Pids of running `temporal server start-dev` processes that this test process could have left behind:
    its descendants and orphans (to prove none are left behind). A server another program on the machine is
    running right now (a chaos soak, a second test run), whose parent is that program, is not counted."""
    me = os.getpid()
    pids = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if not (len(cmd) >= 3 and Path(cmd[0]).name == "temporal" and cmd[1:3] == ["server", "start-dev"]):
            continue
        try:
            ancestors = [a.pid for a in p.parents()]
            parent = p.parent()
            orphan = parent is None or parent.pid == 1 or "python" not in Path((parent.cmdline() or [""])[0]).name
        except psutil.Error:
            continue
        if me in ancestors or orphan:
            pids.add(p.info["pid"])
    return pids

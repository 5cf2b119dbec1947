"""Replay saved histories on a cold worker: ``python -m harness.replayer DIR --workflow MODULE:CLASS``.

Prints one line ``REPLAY-RESULT {"replayed": n, "failures": [{workflow_id, run_id, error}]}`` and
exits 0 whenever it could judge (failures are in the JSON); any other exit means it could not.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer


RESULT_PREFIX = "REPLAY-RESULT "


def load_class(spec: str) -> type:
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--workflow {spec!r}: expected MODULE:CLASS, e.g. agent.workflow:AgentWorkflow")
    return getattr(importlib.import_module(module), name)


async def replay(histories_dir: Path, workflow: type) -> dict:
    files = sorted(histories_dir.glob("*/*.json"))  # <workflow id>/<n>-<run id>.json
    histories = [WorkflowHistory.from_json(f.parent.name, f.read_text()) for f in files]
    failures = []
    replayer = Replayer(workflows=[workflow])
    for f, history in zip(files, histories):
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            err = result.replay_failure
            failures.append({"workflow_id": history.workflow_id, "run_id": f.stem.split("-", 1)[1],
                             "error": f"{type(err).__name__}: {err}"})
    return {"replayed": len(histories), "failures": failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.replayer", description=__doc__)
    parser.add_argument("histories", type=Path, help="directory of <workflow id>/<n>-<run id>.json histories")
    parser.add_argument("--workflow", default="agent.workflow:AgentWorkflow", help="MODULE:CLASS of the workflow")
    args = parser.parse_args(argv)
    result = asyncio.run(replay(args.histories, load_class(args.workflow)))
    print(RESULT_PREFIX + json.dumps(result), flush=True)  # tagged: the SDK's core may log to stdout too
    return 0


if __name__ == "__main__":
    from harness.exit import exit_now

    exit_now(main())

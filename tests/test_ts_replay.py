"""The TypeScript replayer we ship (``plugins/temporal-replay``, its command ``dah-replay``) on each Temporal TypeScript
SDK version it claims. A small workflow (two activities, a local activity, a child workflow, a continue-as-new) runs
on a Node worker of that version against the embedded dev server, and its saved histories (``harness.event_history``,
the Python SDK's JSON) replay through ``npx --no-install dah-replay`` in a project that depends on the package as a
``file:`` dependency: exit 0 with one line saying the inputs were compared, also for the spellings other tools write
(snake_case names, old tctl enum names, no ``eventType``); exit 1, one line naming the activity or child workflow, its
event and both values, once the code schedules it with another input; exit 1 from the SDK's own check once the
commands change; exit 2 for a bad argument.

Needs the throwaway projects of ``make ts-replay-sdks`` (``.venv/ts-replay/sdk-VERSION``); skipped, saying so,
without them or without npm."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from harness.event_history import save_histories
from testbed.processes import spawn, stop
from testbed.engines.temporal.server import EmbeddedTemporal

ROOT = Path(__file__).resolve().parent.parent
SDKS = ROOT / ".venv" / "ts-replay"
VERSIONS = ["1.17.0", "1.24.0"]

WORKFLOWS = """\
'use strict';
const wf = require('@temporalio/workflow');

const { greet } = wf.proxyActivities({ startToCloseTimeout: '10 seconds', retry: { maximumAttempts: 3 } });
const { shout } = wf.proxyLocalActivities({ startToCloseTimeout: '10 seconds' });

async function Greeter({ name, runs }) {
  let text = await greet({ name, greeting: 'Hello' });
  text = await greet({ name: text, greeting: 'Welcome' });
  const stamp = await shout(name);
  const loud = await wf.executeChild(Shout, { args: [text], workflowId: `${wf.workflowInfo().workflowId}-${runs}` });
  if (runs > 1) await wf.continueAsNew({ name: stamp, runs: runs - 1 });
  return loud;
}

async function Shout(text) {
  return await shout(text);
}

module.exports = { Greeter, Shout };
"""

WORKER = """\
'use strict';
const { NativeConnection, Worker } = require('@temporalio/worker');

async function main() {
  const [address, taskQueue] = process.argv.slice(2);
  const connection = await NativeConnection.connect({ address });
  const worker = await Worker.create({
    connection,
    taskQueue,
    workflowsPath: require.resolve('./workflows'),
    activities: {
      greet: async ({ name, greeting }) => `${greeting}, ${name}`,
      shout: async (text) => text.toUpperCase(),
    },
  });
  await worker.run();
}

main().catch((err) => { console.error(err); process.exit(1); });
"""


def installed(version: str) -> bool:
    return (SDKS / f"sdk-{version}" / "node_modules" / ".bin" / "dah-replay").exists()


pytestmark = [
    pytest.mark.skipif(shutil.which("npm") is None or shutil.which("node") is None,
                       reason="the TypeScript replayer needs node and npm: make system-deps"),
    pytest.mark.skipif(not all(installed(v) for v in VERSIONS),
                       reason="the TypeScript SDKs the replayer is tested on are not installed: make ts-replay-sdks"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with EmbeddedTemporal(log_file=tmp_path_factory.mktemp("ts-replay") / "temporal.log") as s:
        yield s


def project(where: Path, version: str, workflows: str = WORKFLOWS) -> Path:
    """A node project of the given SDK version: these workflows, the worker, and the installed node_modules (the
    SDK and the replayer as a file: dependency, from make ts-replay-sdks)."""
    where.mkdir(parents=True)
    (where / "workflows.js").write_text(workflows)
    (where / "worker.js").write_text(WORKER)
    (where / "node_modules").symlink_to(SDKS / f"sdk-{version}" / "node_modules")
    return where


def dah_replay(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["npx", "--no-install", "dah-replay", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


async def run_greeter(server: EmbeddedTemporal, where: Path, out: Path) -> Path:
    """Run Greeter (two runs: one continue-as-new) on a worker of this project; its saved runs' folder."""
    task_queue = f"ts-replay-{uuid.uuid4().hex[:8]}"
    workflow_id = f"greeter-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(server.address)
    with (where / "worker.log").open("w") as log:
        worker = spawn(["node", "worker.js", server.address, task_queue], cwd=where, stdout=log,
                       stderr=subprocess.STDOUT)
        try:
            result = await asyncio.wait_for(
                client.execute_workflow("Greeter", {"name": "ada", "runs": 2}, id=workflow_id, task_queue=task_queue),
                120)
            assert result == "WELCOME, HELLO, ADA"
            assert await save_histories(client, [workflow_id], out) == []
        finally:
            stop(worker)
    folder = out / workflow_id
    assert len(list(folder.glob("*.json"))) == 2, (where / "worker.log").read_text()[-2000:]
    return folder


def spelled_otherwise(folder: Path) -> None:
    """Add the first run again as other tools write it: snake_case names; old tctl enum names and no eventType."""
    first = json.loads(sorted(folder.glob("*.json"))[0].read_text())

    def snake(value):
        if isinstance(value, dict):
            return {re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), k): snake(v) for k, v in value.items()}
        return [snake(v) for v in value] if isinstance(value, list) else value

    def pascal(constant: str, prefix: str) -> str:
        return "".join(word.capitalize() for word in constant.removeprefix(prefix).split("_"))

    (folder / "90-snake-case.json").write_text(json.dumps(snake(first)))
    legacy = json.loads(json.dumps(first))
    for i, event in enumerate(legacy["events"]):
        kind = event.pop("eventType")
        if i % 2:
            event["eventType"] = pascal(kind, "EVENT_TYPE_")
        for attributes in event.values():
            if isinstance(attributes, dict) and isinstance(attributes.get("taskQueue"), dict):
                attributes["taskQueue"]["kind"] = pascal(attributes["taskQueue"]["kind"], "TASK_QUEUE_KIND_")
    (folder / "91-tctl.json").write_text(json.dumps(legacy))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.slow
async def test_replays_strictly_on_each_sdk_version(version: str, server: EmbeddedTemporal, tmp_path: Path) -> None:
    here = project(tmp_path / "agent", version)
    runs = await run_greeter(server, here, tmp_path / "histories")
    spelled_otherwise(runs)

    ok = dah_replay(here, "--workflows", "./workflows.js", str(runs))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    line = ok.stdout.strip()
    assert "\n" not in line
    assert line.startswith(f"replayed 4 run(s) of {runs.name} on @temporalio/worker {version}: deterministic"), line
    # per run: two activities and one child compared; the local activity only counted
    assert "the inputs of 12 scheduled activities and child workflows compared" in line, line
    assert "4 local activities not compared" in line, line

    # The same commands, another activity input: the SDK's own replay accepts it, the comparison does not.
    changed = project(tmp_path / "changed", version, WORKFLOWS.replace("greeting: 'Welcome'", "greeting: 'Hi'"))
    bad = dah_replay(changed, "--workflows", "./workflows.js", str(runs))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    line = bad.stderr.strip()
    assert "\n" not in line
    assert re.search(r"00-[\w-]+\.json: activity greet \(id 2, event \d+\) scheduled with a different input on replay "
                     r'at \$\[0\]\.greeting: history "Welcome" vs replay "Hi"$', line), line

    child = project(tmp_path / "child", version, WORKFLOWS.replace("args: [text]", "args: [text.toLowerCase()]"))
    bad = dah_replay(child, "--workflows", "./workflows.js", str(runs))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"child workflow Shout \(id greeter-\w+-2, event \d+\) scheduled with a different input on "
                     r'replay at \$\[0\]: history "Welcome, Hello, ada" vs replay "welcome, hello, ada"',
                     bad.stderr), bad.stderr

    # Other commands: the SDK's own determinism check fails it, in one line.
    commands = project(tmp_path / "commands", version,
                       WORKFLOWS.replace("  const stamp =", "  await wf.sleep('1 ms');\n  const stamp ="))
    bad = dah_replay(commands, "--workflows", "./workflows.js", str(runs))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "\n" not in bad.stderr.strip()
    assert ": does not replay: " in bad.stderr and "ondeterminism" in bad.stderr, bad.stderr

    # Bad arguments: exit 2, one line saying what to pass.
    (tmp_path / "not-json.json").write_text("{")
    for args, said in [(["--workflows", "./workflows.js"], "no history given"),
                       ([str(runs)], "--workflows is required"),
                       (["--workflows", "./nope.js", str(runs)], "--workflows ./nope.js: no such file"),
                       (["--workflows", "./workflows.js", str(tmp_path / "absent")], "no such file or folder"),
                       (["--workflows", "./workflows.js", str(tmp_path / "not-json.json")], "not the proto3 JSON"),
                       (["--workflows", "./workflows.js", "--bogus", str(runs)], "Unknown option '--bogus'")]:
        usage = dah_replay(here, *args)
        assert usage.returncode == 2 and said in usage.stderr, (args, usage.stdout, usage.stderr)
        assert len(usage.stderr.strip().splitlines()) == 1, usage.stderr

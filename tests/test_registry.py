"""One registry (``harness.engines.REGISTRY``): an engine added there, and nowhere else, is seen by every tool. A
child Python adds a fake engine (the checkpoint engine under another name and suffix, with a check of its own)
before anything else is imported, then asks the chaos commands, the suite, the verdict's plan, the report and the
benchmarks what they know; nothing is started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.engines import REGISTRY, canonical, own_checks, split_twin, twin_suffixes

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, argparse
import harness.engines as h
h.REGISTRY += (h.Registered("fake", "checkpoint.engine:CheckpointEngine", {"name": "fake"}, suffix="@fake",
                            own_checks=("dbos_steps",)),)
from chaos import suite
from cli.chaos import build_parser as chaos_parser
from chaos.checker.verdict import plan
from testbed.engines import make_engine
from benchmarks.options import Options
from cli.bench import build_parser as bench_parser
from reports.verdicts import _columns
from reports.tables import _engine_rank

jobs = suite.jobs(argparse.Namespace(command="run", scenarios=["kill_mid_turn@fake"], durability="temporal"), None)
suite_args = chaos_parser().parse_args(["suite", "--engines", "temporal,fake"])
suite_jobs = suite.jobs(suite_args, None)
class Item:
    def __init__(self, column): self.column = column
print(json.dumps({
    "listed": [l.split()[0] for l in suite.scenario_list() if "@fake" in l],
    "job": [(label, type(engine).__name__, engine.name, engine.suffix) for label, _, engine in jobs],
    "suite": sorted({label for label, _, _ in suite_jobs if label.endswith("@fake")}),
    "durability": chaos_parser().parse_args(["run", "kill_mid_turn", "--durability", "fake"]).durability,
    "plan_fake": plan({"backend": {"name": "fake"}}, []).not_applicable.get("dbos_steps"),
    "plan_other": plan({"backend": {"name": "checkpoint"}}, []).not_applicable.get("dbos_steps"),
    "bench_default": list(Options().engines),
    "bench_cli": list(bench_parser().parse_args(["--engines", "fake,plain"]).engines),
    "report_columns": _columns([Item("fake"), Item("restate"), Item("temporal")]),
    "rank": [_engine_rank("plain"), _engine_rank("fake"), _engine_rank("nonesuch")],
    "made": type(make_engine("fake")).__name__,
}))
'''


def test_a_fake_engine_added_to_the_registry_is_seen_by_every_tool() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["listed"] == ["kill_mid_turn@fake", "model_outage@fake"]  # the checkpoint engine's twins
    assert seen["job"] == [["kill_mid_turn@fake", "CheckpointEngine", "fake", "@fake"]]
    assert seen["suite"] == ["kill_mid_turn@fake", "model_outage@fake"]
    assert seen["durability"] == "fake" and seen["made"] == "CheckpointEngine"
    assert seen["plan_fake"] is None  # its own check applies to its runs ...
    assert "fake" in seen["plan_other"]  # ... and is not applicable elsewhere, naming the engines it reads
    assert seen["bench_default"][0] == "plain" and seen["bench_default"][-1] == "fake"
    assert seen["bench_cli"] == ["fake", "plain"]
    assert seen["report_columns"] == ["temporal", "restate", "fake"]  # registry order
    assert seen["rank"] == [0, len(REGISTRY) + 1, len(REGISTRY) + 2]


def test_older_names_and_twin_labels_map_to_the_registry() -> None:
    assert canonical("dbos-sqlite") == "dbos" and canonical("someone-else") == "someone-else"
    assert split_twin("kill_mid_turn@dbos-postgres") == ("kill_mid_turn", "dbos-postgres")
    assert split_twin("kill_mid_turn@dbos") == ("kill_mid_turn", "dbos")
    assert split_twin("kill_mid_turn") == ("kill_mid_turn", "temporal")
    assert set(twin_suffixes().values()) == {r.name for r in REGISTRY} - {"temporal"}
    assert own_checks() == {"dbos_steps": ("dbos", "dbos-postgres"), "restate_journal": ("restate",)}

"""Holding a run directory to its written contract: ``harness/run_directory.schema.json`` (and RUN_DIRECTORY.md).

``assert_valid(path)`` checks every file a writer produced against the schema; the end-to-end tests of the
chaos runner, the benchmarks and the migration fuzzer call it on the run directories they make, so a writer
that adds, renames or drops a field without the schema (and its document) fails a test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "harness" / "run_directory.schema.json"
DOCUMENT = ROOT / "RUN_DIRECTORY.md"
#: files each kind of complete run must have
REQUIRED = {"chaos": ("run.json", "operations.jsonl", "conversations.json", "verdict.json"),
            "bench": ("run.json", "resources.json"),
            "migration_fuzz": ("run.json", "operations.jsonl", "results.json")}


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def problems(path: Path) -> list[str]:
    """Every way the run directory at ``path`` departs from the schema (empty: it keeps the contract)."""
    doc = schema()
    out: list[str] = []
    run_json = path / "run.json"
    if not run_json.exists():
        return [f"{path}: no run.json"]
    kind = json.loads(run_json.read_text()).get("kind")
    status = json.loads(run_json.read_text()).get("status")
    if status == "complete":
        out += [f"{path}: a complete {kind} run has no {name}" for name in REQUIRED.get(kind, ()) if
                not (path / name).exists()]
    for name, file_schema in doc["files"].items():
        f = path / name
        if not f.exists():
            continue
        validator = jsonschema.Draft202012Validator({**file_schema, "$defs": doc["$defs"]})
        documents = ([json.loads(line) for line in f.read_text().splitlines() if line.strip()]
                     if name.endswith(".jsonl") else [json.loads(f.read_text())])
        for n, document in enumerate(documents, 1):
            for error in validator.iter_errors(document):
                where = "/".join(str(p) for p in error.absolute_path) or "(top)"
                out.append(f"{f}{f':{n}' if name.endswith('.jsonl') else ''}: {where}: {error.message[:300]}")
    return out


def assert_valid(path: Path) -> None:
    found = problems(Path(path))
    assert not found, "the run directory departs from harness/run_directory.schema.json:\n" + "\n".join(found[:20])


def schema_names() -> set[str]:
    """Every file name and field name the schema defines."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}).keys())
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    doc = schema()
    names.update(doc["files"])
    walk(doc)
    return names

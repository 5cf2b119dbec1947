"""One benchmark run, start to saved results: ``runs/bench/<UTC timestamp>/`` (format: benchmarks/README.md).

The run directory is written as the run goes: ``journal.json`` first (machine,
versions, configuration, status ``running``), then each section's JSON file as
soon as that section finishes. An interrupted or failed run keeps every
finished section and says ``interrupted`` / ``failed`` in its journal, so the
report can still use what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent import llm
from testbed.temporal_server import TUNED_DYNAMIC_CONFIG
from harness.recording import EffectLedger
from testbed.model_server import ScriptedModelServer
from testbed.scripted_routes import respond
from agent.checkpoint.steps import configure_worker
from benchmarks import checkpoint_bench, sections
from benchmarks.resources import ResourceSampler

log = logging.getLogger(__name__)

#: section name -> (function, the file its result goes to; None: the section writes its own files)
SECTIONS: dict[str, Callable[..., Any]] = {
    "table2": sections.table2,
    "tuning": sections.tuning,
    "length": sections.length,
    "throughput": sections.throughput,
    "recovery": sections.recovery,
    "micro": sections.micro,
    "checkpoint": checkpoint_bench.checkpoint,
}
SECTION_FILES = {"length": "length.json", "throughput": "throughput.json", "recovery": "recovery.json",
                 "checkpoint": "checkpoint_backend.json"}
QUICK_SKIPS = ("recovery",)
#: what runs with --durability checkpoint (the others measure Temporal itself: its server, workers and histories)
CHECKPOINT_SECTIONS = ("table2", "checkpoint", "micro")  # a worker kill costs the heartbeat and sticky timeouts: not within a minute


@dataclass
class Options:
    quick: bool = False
    only: tuple[str, ...] = ()  # empty: every section of the profile
    turns: int = 50  # measured turns per Table 2 series (the reference used 50)
    warmup: int = 3
    workloads: tuple[str, ...] = ("reply", "tool")
    model: str = "scripted"  # or a LiteLLM model for the model mode (a live provider; needs its key)
    model_latency: str = "lognormal:300,0.25"  # the scripted model's emulated latency in model mode
    tuning_turns: int = 30
    tuning_concurrency: int = 2  # conversations at once in the tuning section (more saturates one Python process)
    length_turns: int = 200
    can_every_events: int = 200
    worker_counts: tuple[int, ...] = (1, 2)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    throughput_turns: int = 10
    heartbeats: tuple[float, ...] = (2.0, 5.0, 10.0)
    recovery_tool_s: float = 4.0
    kill_after_s: float = 1.0
    seed: int = 0
    out: Path = Path("runs/bench")
    durability: str = "temporal"  # the durable loop of Table 2: "temporal" or "checkpoint" (agent/checkpoint)

    @classmethod
    def quick_profile(cls, **overrides: Any) -> Options:
        base = dict(quick=True, turns=5, warmup=2, model_latency="fixed:20", tuning_turns=3, tuning_concurrency=2,
                    length_turns=20, can_every_events=40, worker_counts=(1,), concurrency=(1, 4), throughput_turns=3,
                    heartbeats=(1.0,), recovery_tool_s=1.0, kill_after_s=0.3)
        return cls(**{**base, **overrides})

    def sections(self) -> list[str]:
        if self.only:
            return [s for s in SECTIONS if s in self.only]
        if self.durability == "checkpoint":
            return [s for s in SECTIONS if s in CHECKPOINT_SECTIONS]
        return [s for s in SECTIONS if not (self.quick and s in QUICK_SKIPS)]

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


@dataclass
class Bench:
    """What every section shares: the run directory, the model server, the ledger, the tuned server."""

    options: Options
    run_dir: Path
    say: Callable[[str], None]
    model: ScriptedModelServer
    ledger: EffectLedger
    sampler: ResourceSampler = field(default_factory=ResourceSampler)
    tuned: Any = None  # sections.LocalServer, started on first need
    results: dict[str, dict[str, list]] = field(default_factory=dict)

    @property
    def sandbox_root(self) -> Path:
        return self.run_dir / "state" / "sandbox"

    def extend(self, file: str, series: list[dict[str, Any]]) -> None:
        """Add series to ``<file>.json`` and write it now (an interruption later keeps them)."""
        self.results.setdefault(file, {"series": []})["series"].extend(series)
        write_json(self.run_dir / f"{file}.json", self.results[file])


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


async def run(options: Options, say: Callable[[str], None], command: str) -> Path:
    """Run the profile's sections; the run directory (complete, or partial with the reason in its journal)."""
    from chaos.runner import link_latest, machine_info

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = (options.out / stamp).resolve()
    run_dir.mkdir(parents=True, exist_ok=False)
    started = time.monotonic()
    wanted = options.sections()
    journal: dict[str, Any] = {
        "kind": "bench", "profile": "quick" if options.quick else "default", "seed": options.seed,
        "command": command, "status": "running", "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": None, "planned": wanted, "sections": [], "section_wall_s": {},
        "skipped": [s for s in SECTIONS if s not in wanted],
        "machine": await asyncio.to_thread(machine_info),
        "config": {**options.as_dict(), "warmup_turns": options.warmup},
        "server_profiles": {"tuned": dict(TUNED_DYNAMIC_CONFIG), "stock": {}},
        "notes": {
            "table2": "in-process worker, model server and client on the tuned embedded server; no proxies",
            "throughput": "worker processes reach Temporal and the model through the chaos harness's proxies "
                          "(no faults), as in chaos runs",
            "recovery": "two worker processes; the one running the tool activity is SIGKILLed and restarted",
        },
    }
    write_json(run_dir / "journal.json", journal)
    link_latest(run_dir)
    say(f"benchmark run {run_dir} (profile {journal['profile']}): {', '.join(wanted)}")
    (run_dir / "state" / "sandbox").mkdir(parents=True, exist_ok=True)
    try:
        with ScriptedModelServer(respond, seed=options.seed) as model, \
                EffectLedger(run_dir / "state" / "sandbox" / "ledger.sqlite3") as ledger:
            bench = Bench(options, run_dir, say, model, ledger)
            # What journal steps run in this process use (a Temporal worker, when one starts, sets the same).
            configure_worker(ledger=ledger, sandbox_root=bench.sandbox_root, model_base_url=model.url,
                             identity="bench")
            await llm.wait_loaded()  # LiteLLM takes seconds to import: not inside any timing
            async with contextlib.AsyncExitStack() as stack:
                temporal_table2 = options.durability == "temporal" and "table2" in wanted
                if temporal_table2 or {"tuning", "length", "checkpoint"} & set(wanted):
                    say("starting the embedded Temporal server (tuned profile) and in-process workers")
                    bench.tuned = await stack.enter_async_context(sections.local_server(bench, tuned=True))
                for name in wanted:
                    t0 = time.monotonic()
                    say(f"[{name}]")
                    fn = SECTIONS[name]
                    result = await fn(bench) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, bench)
                    if name in SECTION_FILES:
                        write_json(run_dir / SECTION_FILES[name], result)
                    journal["sections"].append(name)
                    journal["section_wall_s"][name] = round(time.monotonic() - t0, 1)
                    write_json(run_dir / "resources.json", bench.sampler.as_dict())
                    write_json(run_dir / "journal.json", journal)
                    say(f"[{name}] done in {journal['section_wall_s'][name]:.1f} s")
        journal["status"] = "complete"
    except (KeyboardInterrupt, asyncio.CancelledError):
        journal["status"] = "interrupted"
        raise
    except BaseException as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Ctrl-C cancels the run; a cancelled client call may surface as its own error type.
            journal["status"] = "interrupted"
            raise asyncio.CancelledError() from exc
        journal["status"] = "failed"
        journal["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        journal["wall_s"] = round(time.monotonic() - started, 1)
        write_json(run_dir / "journal.json", journal)
    return run_dir

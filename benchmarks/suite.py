"""One benchmark run, start to saved results: ``runs/bench/<UTC stamp>/`` (harness.rundir; files: RUN_DIRECTORY.md).

The run directory is written as the run goes: ``run.json`` first (machine,
versions, configuration, status ``running``), then each section's JSON file as
soon as that section finishes. An interrupted (Ctrl-C), terminated (SIGTERM)
or failed run keeps every finished section and says ``interrupted`` /
``terminated`` / ``failed`` in its ``run.json``, with the section it was in
(``stopped_during``), so the report can still use what was measured;
``latest`` moves only to a run that completed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import llm
from testbed.engines.checkpoint.steps import configure_worker
from benchmarks import checkpoint_bench, engines_bench, overhead, scale, sections
from benchmarks.options import BENCH_FOLDER, SECTION_NAMES, Bench, Options
from harness.engines import HOME
from harness.rundir import RunDir, command_line, machine_info
from harness.commands import tool
from testbed.engines.temporal.server import TUNED_DYNAMIC_CONFIG, temporal_binary_or_none

log = logging.getLogger(__name__)

#: section name -> (function, the file its result goes to; None: the section writes its own files)
SECTIONS: dict[str, Callable[..., Any]] = {
    "table2": sections.table2,
    "tuning": sections.tuning,
    "overhead": overhead.overhead,
    "length": sections.length,
    "throughput": sections.throughput,
    "recovery": sections.recovery,
    "micro": sections.micro,
    "checkpoint": checkpoint_bench.checkpoint,
    "engines": engines_bench.engines,
    "scale": scale.scale,
}
SECTION_FILES = {"length": "length.json", "throughput": "throughput.json", "recovery": "recovery.json",
                 "checkpoint": "checkpoint_backend.json", "engines": "engines.json", "scale": "scale.json"}


def reproduce_command(options: Options) -> str:
    """The command line of this run with every option explicit (defaults may change; this will not)."""
    return command_line(tool("benchmarks"), {
        "--quick": options.quick, "--only": ",".join(options.only) or None, "--turns": options.turns,
        "--workloads": ",".join(options.workloads), "--engines": ",".join(options.engines),
        "--engines-turns": options.engines_turns, "--overhead-rounds": options.overhead_rounds,
        "--overhead-load": options.overhead_load,
        **({"--scale-conversations": ",".join(map(str, options.scale_conversations)),
            "--scale-messages": options.scale_messages, "--scale-chain": options.scale_chain}
           if "scale" in options.sections() else {}),
        "--model": options.model, "--model-latency": options.model_latency,
        "--durability": options.durability, "--seed": options.seed, "--out": str(options.out),
        # an external cluster's address and namespace; its TLS and API key come from the environment or a profile
        "--address": options.connection.address if options.external else None,
        "--namespace": options.connection.namespace if options.external else None})


async def run(options: Options, say: Callable[[str], None], command: str) -> Path:
    """Run the profile's sections; the run directory (complete, or partial with the reason in its run.json)."""
    run_dir = RunDir.create(options.out / BENCH_FOLDER)
    unavailable = options.unavailable()
    wanted = [s for s in options.sections() if s not in unavailable]
    with run_dir.recording(
        "bench", "bench", profile="quick" if options.quick else "default", seed=options.seed, command=command,
        reproduce=reproduce_command(options), planned=wanted, sections=[], section_wall_s={},
        skipped=[s for s in SECTION_NAMES if s not in wanted], skipped_why=unavailable,
        config={**options.as_dict(), "warmup_turns": options.warmup},
        server_profiles={"tuned": dict(TUNED_DYNAMIC_CONFIG), "stock": {}},
        notes={
            "table2": "in-process worker, model server and client on the tuned embedded server; no proxies",
            "throughput": "worker processes reach Temporal and the model through fault proxies (no faults), as in "
                          "chaos runs",
            "recovery": "two worker processes; the one running the tool activity is SIGKILLed and restarted",
        }) as rec:
        record = run_dir.run
        run_dir.update(machine=await asyncio.to_thread(machine_info, temporal_binary_or_none()))
        say(f"benchmark run {run_dir.path} (profile {record['profile']}): {', '.join(wanted)}")
        for name, why in unavailable.items():
            say(f"[{name}] skipped: {why}")
        if options.external:
            record["notes"]["table2"] = (f"in-process worker, model server and client on the external cluster "
                                         f"{options.connection.address} (namespace {options.connection.namespace}); "
                                         "no proxies")
        await _sections(options, run_dir, wanted, say, rec)
    return run_dir.path


async def _sections(options: Options, run_dir: RunDir, wanted: list[str], say: Callable[[str], None],
                    rec: Any) -> None:
    """The sections, in order, on one local server; each one's result saved as soon as it ends."""
    record = run_dir.run
    # the home engine's tuned server (harness.engines.HOME): what Table 2 on it, tuning, overhead and length measure
    needs_server = (options.durability == HOME and "table2" in wanted) or bool(
        {"tuning", "overhead", "length", "checkpoint"} & set(wanted) or ("engines" in wanted and HOME in options.engines))
    if needs_server:
        say(f"connecting to {options.connection.address} (namespace {options.connection.namespace}) and starting "
            "in-process workers" if options.external else
            "starting the embedded Temporal server (tuned profile) and in-process workers")
    async with sections.local_server(run_dir, options, tuned=True, model=True, temporal=needs_server) as local:
        bench = Bench(options, run_dir, say, local.stack.model_server, local.stack.ledger,
                      tuned=local if needs_server else None)
        # What checkpoint steps run in this process use (a Temporal worker, when one starts, sets the same).
        configure_worker(ledger=bench.ledger, sandbox_root=bench.sandbox_root, model_base_url=bench.model.url,
                         identity="bench")
        await llm.wait_loaded()  # LiteLLM takes seconds to import: not inside any timing
        for name in wanted:
            t0 = time.monotonic()
            rec.doing = f"section {name}"  # run.json's stopped_during if the run is stopped
            say(f"[{name}]")
            fn = SECTIONS[name]
            result = await fn(bench) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, bench)
            if name in SECTION_FILES:
                run_dir.write_json(SECTION_FILES[name], result)
            record["sections"].append(name)
            record["section_wall_s"][name] = round(time.monotonic() - t0, 1)
            run_dir.write_json("resources.json", bench.sampler.as_dict())
            run_dir.save()
            say(f"[{name}] done in {record['section_wall_s'][name]:.1f} s")

"""What one benchmark run is asked to do (``Options``), and what its sections share while it runs (``Bench``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.worker import WorkerSettings
from harness.engines import PLAIN, names as engine_names
from benchmarks.resources import ResourceSampler
from harness.recording import EffectLedger
from harness.rundir import RunDir
from testbed.engines.temporal.connection import TemporalConnection
from testbed.model_server import ScriptedModelServer

#: every section, in the order a run measures them
SECTION_NAMES = ("table2", "tuning", "overhead", "length", "throughput", "recovery", "micro", "checkpoint", "engines",
                 "scale")
QUICK_SKIPS = ("recovery",)
#: sections a run measures only when asked (--only): the engines section starts PostgreSQL and Restate servers; the
#: scale section runs chaos runs of up to 100 conversations (minutes each)
OPT_IN = ("engines", "scale")  # a worker kill costs the heartbeat and sticky timeouts: not within a minute
#: what runs with --durability checkpoint (the others measure Temporal itself: its server, workers and histories)
CHECKPOINT_SECTIONS = ("table2", "checkpoint", "micro")
#: a run's folder under the runs root (--out): runs/bench/<stamp>/
BENCH_FOLDER = "bench"
#: sections that measure the embedded dev server itself, and why an external cluster cannot stand in for it
EMBEDDED_SECTIONS = {"tuning": "needs the embedded server: it compares the stock and tuned dev-server profiles, "
                               "which only a server this run starts can have"}


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
    overhead_rounds: int = 1  # the overhead section, repeated: the spread of its ratios over rounds
    overhead_load: int = 0  # CPU-bound processes beside a second run of every overhead round (0: idle rounds only)
    engines_turns: int = 20  # measured turns per series of the engines section (6 engines x 4 series)
    #: the engines section's engines (benchmarks.engines_bench.ENGINE_NAMES)
    engines: tuple[str, ...] = (PLAIN, *engine_names())
    tuning_concurrency: int = 2  # conversations at once in the tuning section (more saturates one Python process)
    length_turns: int = 200
    can_every_events: int = 200
    worker_counts: tuple[int, ...] = (1, 2)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    throughput_turns: int = 10
    heartbeats: tuple[float, ...] = (2.0, 5.0, 10.0)
    scale_conversations: tuple[int, ...] = (10, 30, 100)  # the scale section's kill_mid_turn sizes
    scale_messages: int = 20  # messages each conversation sends at least, at every scale size
    scale_chain: int = 230  # messages of each conversation of the continue-as-new size (0: none)
    recovery_tool_s: float = 4.0
    kill_after_s: float = 1.0
    seed: int = 0
    out: Path = Path("runs")  # the runs root: a run is written to out/bench/<stamp>/
    durability: str = "temporal"  # the durable loop of Table 2: "temporal" or "checkpoint" (testbed/engines/checkpoint)
    connection: TemporalConnection | None = None  # an external cluster (None: the embedded server, tuned)

    @classmethod
    def quick_profile(cls, **overrides: Any) -> Options:
        base = dict(quick=True, turns=5, warmup=2, model_latency="fixed:20", tuning_turns=3, tuning_concurrency=2,
                    engines_turns=3, length_turns=20, can_every_events=40, worker_counts=(1,), concurrency=(1, 4), throughput_turns=3,
                    heartbeats=(1.0,), recovery_tool_s=1.0, kill_after_s=0.3, scale_conversations=(2, 4),
                    scale_messages=3, scale_chain=0)
        return cls(**{**base, **overrides})

    @property
    def external(self) -> bool:
        return self.connection is not None and not self.connection.embedded

    def unavailable(self) -> dict[str, str]:
        """Sections asked for that this run cannot measure (section -> why): reported skipped, never run."""
        if not self.external:
            return {}
        return {s: why for s, why in EMBEDDED_SECTIONS.items() if s in self.sections()}

    def sections(self) -> list[str]:
        if self.only:
            return [s for s in SECTION_NAMES if s in self.only]
        if self.durability == "checkpoint":
            return [s for s in SECTION_NAMES if s in CHECKPOINT_SECTIONS]
        return [s for s in SECTION_NAMES if not (self.quick and s in QUICK_SKIPS) and s not in OPT_IN]

    def as_dict(self) -> dict[str, Any]:
        """The options for ``run.json``: the connection as its redacted dump (no secret is ever written)."""
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items() if k != "connection"}
        out["temporal"] = self.connection.redacted() if self.external else {"address": "embedded"}
        return out


@dataclass
class Bench:
    """What every section shares: the run directory, the model server, the ledger, the tuned server."""

    options: Options
    run: RunDir
    say: Callable[[str], None]
    model: ScriptedModelServer
    ledger: EffectLedger
    sampler: ResourceSampler = field(default_factory=ResourceSampler)
    tuned: Any = None  # sections.LocalServer, started on first need
    results: dict[str, dict[str, list]] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def sandbox_root(self) -> Path:
        return WorkerSettings.in_state_dir(self.run.state).sandbox_root

    def extend(self, file: str, series: list[dict[str, Any]]) -> None:
        """Add series to ``<file>.json`` and write it now (an interruption later keeps them)."""
        self.results.setdefault(file, {"series": []})["series"].extend(series)
        self.run.write_json(f"{file}.json", self.results[file])



"""``python -m chaos soak SCENARIO --seeds 1-100``: one scenario over many seeds, one after another.

Each seed is an ordinary run (``chaos.runner.run``) with its own run directory under ``--out``, exactly as
``python -m chaos run SCENARIO --seed N`` makes it. A run that raises (a worker dying at setup, a port clash,
a harness bug) is recorded ``failed`` in its own run directory and counts as ``error``; the soak goes on.
Ctrl-C (or SIGTERM) stops it, keeping what it did.

The soak's own run directory, ``<out>/soak-<scenario>/<UTC stamp>/`` (kind ``soak``), holds ``run.json`` and
``soak.json``: one row per seed finished, and the verdict distribution, rewritten after every seed
(``RUN_DIRECTORY.md``), and the CI files (``chaos.ci``): ``summary.json`` and ``junit.xml`` (or where
``--summary`` / ``--junit`` say). The exit status is 0 only when every seed passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos import ci
from chaos.checker.verdict import table_row
from harness.printable import printable
from harness.rundir import SCHEMA, RunDir, command_line, machine_info, stopped_status, utc_now
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult

ERROR = "error"
#: the verdicts a soak counts, in the order it shows them
OUTCOMES = (PASS, FAIL, UNKNOWN, ERROR)
SOAK_JSON = "soak.json"
SOAK_PREFIX = "soak-"
DEFAULT_SEEDS = "1-20"


def parse_seeds(text: str) -> list[int]:
    """``"1-20"``, ``"1-20,25,30-32"`` -> the seeds in that order, each once; ValueError naming what is wrong."""
    seeds: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            raise ValueError(f"seeds {text!r}: an empty item (write e.g. 1-20,25,30-32)")
        lo, dash, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if dash else (int(part), int(part))
        except ValueError:
            raise ValueError(f"seeds {text!r}: {part!r} is not a seed or a range of seeds (write e.g. 1-20,25,30-32)"
                             ) from None
        if first < 0:
            raise ValueError(f"seeds {text!r}: {part!r}: a seed is 0 or more")
        if last < first:
            raise ValueError(f"seeds {text!r}: {part!r}: a range goes up (write {last}-{first})")
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    return seeds


def format_seeds(seeds: list[int]) -> str:
    """``--seeds`` text for these seeds, in their order, runs of consecutive seeds as ranges: ``1-3,7``."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass
class Outcome:
    """One run as a suite or a soak counts it: its verdict (``pass``, ``fail``, ``unknown``, or ``error`` when
    the run raised), where it is and how to run it again."""

    label: str
    seed: int
    verdict: str
    run_dir: Path | None
    wall_s: float
    reproduce: str
    checks: list[CheckResult] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def non_pass(self) -> list[CheckResult]:
        """The checks that failed or could not tell (not_applicable ones count neither way)."""
        return [c for c in self.checks if c.verdict in (FAIL, UNKNOWN)]

    @property
    def error_line(self) -> str:
        """The error's first line (a worker's error may go on with its log's last lines)."""
        lines = [line for line in (self.error or "").splitlines() if line.strip()]
        return (lines[0] + (" (...)" if len(lines) > 1 else "")) if lines else ""

    def lines(self) -> list[str]:
        """What went wrong: the error (its further lines indented), or each failing/unknown check's summary."""
        if self.error:
            first, *rest = [line for line in self.error.splitlines() if line.strip()] or [""]
            return [f"error: {first}", *(f"  | {line}" for line in rest)]
        return [f"{c.name}: {c.verdict}: {c.summary}" for c in self.non_pass]

    def as_row(self) -> dict[str, Any]:
        """``soak.json``'s row for this seed."""
        return {"seed": self.seed, "verdict": self.verdict, "run_dir": str(self.run_dir) if self.run_dir else None,
                "wall_s": round(self.wall_s, 1), "checks": {c.name: c.verdict for c in self.checks},
                "reproduce": self.reproduce,
                "non_pass": [{"check": c.name, "verdict": c.verdict, "summary": c.summary} for c in self.non_pass],
                "error": self.error}


async def run_captured(label: str, scenario: Any, backend: Any, *, seed: int, out_root: Path,
                       progress: Callable[[str], None] = lambda s: None, ui: bool = False,
                       on_run_dir: Callable[[Path], None] = lambda p: None) -> Outcome:
    """``chaos.runner.run``, with an error turned into an ``error`` outcome (the run directory already says
    ``failed``, with the error and the reproduce command). Ctrl-C and cancellation still propagate."""
    from chaos import runner

    started = time.monotonic()
    try:
        r = await runner.run(scenario, backend, seed=seed, out_root=out_root, progress=progress, ui=ui,
                             on_run_dir=on_run_dir)
    except runner.RunFailed as exc:
        return Outcome(label, seed, ERROR, exc.run_dir, exc.wall_s, exc.reproduce,
                       row=table_row(label, None, [], verdict=ERROR), error=exc.error)
    except Exception as exc:  # before the run had a directory (e.g. the output directory cannot be made)
        reproduce = command_line("python -m chaos run", {"--seed": seed, **backend.reproduce()}, [label])
        return Outcome(label, seed, ERROR, None, time.monotonic() - started, reproduce,
                       row=table_row(label, None, [], verdict=ERROR), error=f"{type(exc).__name__}: {exc}")
    return Outcome(label, seed, r.verdict, r.run_dir, r.wall_s, r.reproduce, list(r.checks), dict(r.row))


def distribution(outcomes: list[Outcome]) -> dict[str, int]:
    return {v: sum(1 for o in outcomes if o.verdict == v) for v in OUTCOMES}


def tally(outcomes: list[Outcome]) -> str:
    """``3 pass, 1 fail, 0 unknown, 0 error``."""
    return ", ".join(f"{n} {v}" for v, n in distribution(outcomes).items())


def percentages(outcomes: list[Outcome]) -> dict[str, float]:
    total = len(outcomes)
    return {v: round(100.0 * n / total, 1) if total else 0.0 for v, n in distribution(outcomes).items()}


class SoakRecord:
    """The soak's run directory: ``run.json`` (kind ``soak``) and ``soak.json``, rewritten after every seed."""

    def __init__(self, out_root: Path, label: str, seeds: list[int], reproduce: str, ci_files: dict[str, Any],
                 **fields: Any) -> None:
        from testbed.temporal_server import temporal_binary_or_none

        self.label, self.seeds, self.outcomes = label, seeds, []
        self.interrupted_seed: int | None = None
        self.started = time.monotonic()
        self.dir = RunDir.create(Path(out_root) / f"{SOAK_PREFIX}{label}")
        self.ci = ci.CiRecord("soak", f"chaos soak {label}", [(label, s) for s in seeds],
                              ci_files.get("summary") or self.dir.path / ci.SOAK_SUMMARY,
                              ci_files.get("junit") or self.dir.path / ci.SOAK_JUNIT,
                              ci_files.get("shard"), ci_files.get("all_items"))
        # run.json as RunDir.begin writes it (kind "soak")
        self.dir.update(schema=SCHEMA, kind="soak", name=label, status="running", started=utc_now(), ended=None,
                        wall_s=None, seed=seeds[0], seeds=seeds, reproduce=reproduce,
                        machine=machine_info(temporal_binary_or_none()), **fields)
        self.save()

    @property
    def path(self) -> Path:
        return self.dir.path

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.ci.ended(outcome)
        self.save()

    def save(self) -> None:
        done = len(self.outcomes)
        self.dir.write_json(SOAK_JSON, {
            "schema": SCHEMA, "scenario": self.label, "status": self.dir.run.get("status"), "seeds": self.seeds,
            "done": done, "wall_s": round(time.monotonic() - self.started, 1),
            "distribution": distribution(self.outcomes), "percent": percentages(self.outcomes),
            "all_passed": bool(done) and done == len(self.seeds) and all(o.verdict == PASS for o in self.outcomes),
            "interrupted_seed": self.interrupted_seed,
            "runs": [o.as_row() for o in self.outcomes]})

    def finish(self, status: str, error: str | None = None) -> None:
        during = f"seed {self.interrupted_seed}" if self.interrupted_seed is not None else None
        self.dir.finish(status, time.monotonic() - self.started, error, during)
        self.ci.finish(status)
        self.save()


def summary(label: str, seeds: list[int], outcomes: list[Outcome], wall_s: float, soak_dir: Path,
            interrupted_seed: int | None = None, how: str = "interrupted") -> str:
    """The verdict distribution, then every seed that did not pass: what went wrong, how to reproduce, where (each
    line ``printable``).
    ``how``: how the soak was stopped during ``interrupted_seed`` (``interrupted``, ``terminated``)."""
    dist, pct = distribution(outcomes), percentages(outcomes)
    done = len(outcomes)
    lines = [f"soak {label}: {done} of {len(seeds)} seed(s) in {wall_s:.0f}s"
             + (f" ({how} during seed {interrupted_seed})" if interrupted_seed is not None else ""), ""]
    lines.append(f"  {'verdict':<8} {'seeds':>5} {'%':>6}")
    for v in OUTCOMES:
        lines.append(f"  {v:<8} {dist[v]:>5} {pct[v]:>6.1f}")
    bad = [o for o in outcomes if o.verdict != PASS]
    if bad:
        lines += ["", f"{len(bad)} seed(s) not passed:"]
        for o in bad:
            lines.append(f"  seed {o.seed}: {o.verdict}")
            lines += [f"    {line}" for line in o.lines()]
            lines.append(f"    reproduce: {o.reproduce}")
            lines.append(f"    run dir:   {o.run_dir if o.run_dir else '(none: it failed before it had one)'}")
    elif done == len(seeds):
        lines += ["", f"every seed passed ({done}/{done})"]
    elif done:
        lines += ["", f"every seed that finished passed ({done}); {len(seeds) - done} did not run to the end"]
    lines += ["", f"soak summary: {soak_dir / SOAK_JSON}"]
    return "\n".join(printable(line) for line in lines)


async def soak(label: str, scenario: Any, backend: Any, seeds: list[int], out_root: Path, *,
               reproduce: str, say: Callable[[str], None], verbose: bool = False,
               ci_files: dict[str, Any] | None = None) -> int:
    """Run ``scenario`` once per seed, in order; print progress and the summary; 0 only if every seed passed.
    Ctrl-C (SIGTERM): the soak's directory ends ``interrupted`` (``terminated``) with the seeds it finished, the
    summary is printed and the interrupt propagates. ``ci_files``: ``summary`` and ``junit`` paths (default:
    in the soak's directory), ``shard`` (``K/N``) and ``all_items`` (every shard's seeds), for ``chaos.ci``."""
    record = SoakRecord(out_root, label, seeds, reproduce, ci_files or {}, scenario=asdict(scenario),
                        backend=backend.record())
    say(f"soak {label}: {len(seeds)} seed(s) -> {record.path}")
    current: int | None = None
    try:
        for i, seed in enumerate(seeds, 1):
            current = seed
            say(f"seed {i}/{len(seeds)} (seed {seed}): {label} starting")
            o = await run_captured(label, scenario, backend, seed=seed, out_root=out_root,
                                   progress=say if verbose else (lambda s: None),
                                   on_run_dir=lambda p, seed=seed: record.ci.running(label, seed, p))
            record.add(o)
            current = None
            say(f"seed {i}/{len(seeds)} (seed {seed}): {o.verdict.upper()} in {o.wall_s:.0f}s -> "
                f"{o.run_dir or '(no run directory)'}   [{tally(record.outcomes)}]")
            for line in o.lines():
                say(f"  seed {seed} {line}")
    except BaseException as exc:
        interrupted = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))
        record.interrupted_seed = current
        record.finish(stopped_status() if interrupted else "failed",
                      None if interrupted else f"{type(exc).__name__}: {exc}")
        print()
        print(summary(label, seeds, record.outcomes, time.monotonic() - record.started, record.path, current,
                      record.dir.run["status"]), flush=True)
        print(f"CI files: {record.ci.paths()}", flush=True)
        raise
    record.finish("complete")
    print()
    print(summary(label, seeds, record.outcomes, time.monotonic() - record.started, record.path), flush=True)
    print(f"CI files: {record.ci.paths()}", flush=True)
    return 0 if all(o.verdict == PASS for o in record.outcomes) else 1

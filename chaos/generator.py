"""The generator: a seeded schedule of faults within the run's phases.

    warm-up (load only) -> faults (nemesis events at offsets) -> heal -> settle -> final check

A scenario lists fixed nemesis events and/or asks for a number of random
ones drawn from a menu; the same seed always gives the same schedule, which
is printed and written to the run directory (``run.json``) so a failing run can be reproduced.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class NemesisEvent:
    at_s: float  # offset into the fault phase
    op: str  # a name in testbed.faults.nemesis.NEMESES
    args: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The menu random (mixed) schedules draw from: (op, args) with seeded parameters.
def _menu(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("kill_worker", {"when": "busy", "activity": rng.choice(["model", None]), "down_s": rng.uniform(0.5, 3)}),
        ("pause_worker", {"pause_s": rng.uniform(4, 7)}),
        ("partition", {"link": "temporal", "mode": rng.choice(["blackhole", "reset", "down"]),
                       "duration_s": rng.uniform(3, 8)}),
        ("partition", {"link": "model", "mode": rng.choice(["blackhole", "reset", "down"]),
                       "duration_s": rng.uniform(3, 6)}),
        ("degrade_link", {"link": rng.choice(["temporal", "model"]), "latency_ms": rng.uniform(100, 400),
                          "jitter_ms": rng.uniform(0, 100), "rate_kbps": rng.choice([0.0, 50.0]),
                          "stream": rng.choice(["upstream", "downstream", "both"]), "duration_s": rng.uniform(3, 6)}),
        ("restart_server", {"down_s": rng.uniform(1, 3)}),
        ("model_outage", {"status": rng.choice([429, 503]), "duration_s": rng.uniform(2, 6)}),
    ]


def schedule(fixed: tuple[NemesisEvent, ...], random_events: int, fault_s: float, seed: int,
             exclude: frozenset[str] = frozenset()) -> list[NemesisEvent]:
    """Fixed events plus ``random_events`` drawn from the menu (less the ops in ``exclude``: those the cluster
    cannot have, e.g. a server restart of an external cluster), ordered by time. Pure function of its inputs."""
    rng = random.Random(f"schedule-{seed}")
    events = list(fixed)
    for _ in range(random_events):
        op, args = rng.choice([(op, args) for op, args in _menu(rng) if op not in exclude])
        events.append(NemesisEvent(round(rng.uniform(0, max(fault_s - 2, 0)), 2), op,
                                   {k: round(v, 2) if isinstance(v, float) else v for k, v in args.items()}))
    return sorted(events, key=lambda e: e.at_s)

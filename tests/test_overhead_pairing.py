"""The overhead section's pairing: an agent series and its floor take turns (A B A B), each agent turn is compared
with the floor turn measured beside it, and the rounds' ratios are summarised per series and load. Behaviour only:
no timing is asserted (the figures are the benchmark's to report). The CPU-bound processes beside a loaded round
are real processes, and must be gone when their block ends, however it ends."""

from __future__ import annotations

import math
import time

import psutil
import pytest

from agent.contracts import AgentConfig
from benchmarks.load import cpu_hogs
from benchmarks.overhead import OVERHEAD_CONFIGS, floor_shape, interleave, pair_with_floor, round_suffix
from harness.percentiles import floor_ratio_spreads, median_floor_ratio


class Recorder:
    def __init__(self, label: str, log: list[tuple[str, int]]) -> None:
        self.label, self.log = label, log

    async def turn(self, n: int) -> int:
        self.log.append((self.label, n))
        return n


async def test_the_agent_and_its_floor_take_turns_one_message_each_the_first_alternating() -> None:
    log: list[tuple[str, int]] = []
    await interleave(Recorder("agent", log), Recorder("floor", log), 4)
    assert log == [("agent", 1), ("floor", 1), ("floor", 2), ("agent", 2), ("agent", 3), ("floor", 3),
                   ("floor", 4), ("agent", 4)]


def test_each_agent_turn_is_divided_by_the_floor_turn_of_the_same_index() -> None:
    rows = [{"i": 1, "client_ms": 30.0, "model_ms": 10.0}, {"i": 2, "client_ms": 50.0, "model_ms": None},
            {"i": 3, "client_ms": 40.0, "model_ms": 0.0}]
    floor = [{"i": 2, "client_ms": 25.0}, {"i": 1, "client_ms": 40.0}]  # no floor turn 3
    paired = pair_with_floor(rows, floor)
    assert [(r["i"], r["floor_ms"], r["vs_floor"]) for r in paired] == [(1, 40.0, 0.5), (2, 25.0, 2.0),
                                                                          (3, None, None)]
    assert paired[0]["client_ms"] == 30.0  # the agent's own fields are kept
    assert median_floor_ratio(paired) == 1.25  # the turn without a floor is left out
    assert math.isnan(median_floor_ratio([{"i": 1, "client_ms": 1.0}]))  # measured without a floor


@pytest.mark.parametrize(("config", "workload", "shape"), [
    ("activities", "reply", (1, False)), ("local-model", "reply", (1, True)), ("activities", "tool", (3, False)),
    ("local-all", "tool", (3, True)), ("local-tools", "tool", None), ("local-model", "tool", None)])
def test_a_series_is_paired_with_the_floor_of_its_shape_or_none_for_a_mix(config: str, workload: str,
                                                                          shape: tuple[int, bool] | None) -> None:
    assert floor_shape(AgentConfig(**OVERHEAD_CONFIGS[config]), workload) == shape


def test_only_the_first_idle_round_keeps_the_plain_names() -> None:
    assert [round_suffix(r, k) for r, k in [(1, 0), (2, 0), (1, 2), (3, 2)]] == ["", "@idle-r2", "@load2-r1",
                                                                                 "@load2-r3"]


def _agent(variant: str, load: int, round_no: int, ratios: list[float]) -> dict:
    return {"name": f"process/{variant}/reply{round_suffix(round_no, load)}", "section": "overhead",
            "loop": "durable", "variant": variant, "workload": "reply", "round": round_no, "load_processes": load,
            "floor": "floor/1-dispatched" + round_suffix(round_no, load),
            "turns": [{"i": i + 1, "vs_floor": r} for i, r in enumerate(ratios)]}


def test_the_rounds_ratios_are_summarised_per_series_and_load() -> None:
    series = [_agent("activities", 0, 1, [1.0, 1.2, 1.1]), _agent("activities", 2, 1, [1.5, 1.3, 1.4]),
              _agent("activities", 0, 2, [0.9, 1.0, 0.95]), _agent("activities", 2, 2, [2.0, 2.0, 2.0]),
              _agent("activities", 0, 3, [1.3, 1.3, 1.3]), _agent("activities", 2, 3, [1.6, 1.6, 1.6]),
              {**_agent("local-tools", 0, 1, [5.0]), "floor": None},  # a mixed shape: no floor, no ratio
              {"name": "floor/1-dispatched", "section": "overhead", "loop": "floor", "turns": [{"i": 1}]},
              {**_agent("activities", 0, 1, [9.0]), "section": "tuning"}]
    spreads = floor_ratio_spreads(series)
    assert [(s["series"], s["floor"], s["load_processes"]) for s in spreads] == [
        ("process/activities/reply", "floor/1-dispatched", 0), ("process/activities/reply", "floor/1-dispatched", 2)]
    idle, loaded = spreads
    assert idle["rounds"] == [1.1, 0.95, 1.3] and loaded["rounds"] == [1.4, 2.0, 1.6]
    assert (idle["n"], idle["median"], idle["min"], idle["max"]) == (3, 1.1, 0.95, 1.3)
    assert idle["q1"] == pytest.approx(1.025) and idle["q3"] == pytest.approx(1.2)
    assert (loaded["median"], loaded["min"], loaded["max"]) == (1.6, 1.4, 2.0)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_cpu_bound_processes_spin_for_the_block_and_are_gone_after_it_even_on_ctrl_c() -> None:
    with cpu_hogs(2) as pids:
        assert len(pids) == 2 and _alive(pids) == pids
        time.sleep(0.3)
        assert all(psutil.Process(p).cpu_times().user > 0 for p in pids)  # they spin
    assert _alive(pids) == []
    with pytest.raises(KeyboardInterrupt):
        with cpu_hogs(1) as interrupted:
            raise KeyboardInterrupt
    assert _alive(interrupted) == []

"""Retention (harness/retention.py, ``dah gc``, the prune after every run): each runs folder keeps its newest N
runs and every protected one, and nothing else goes.

The run directories here are written by the harness's own writer (``RunDir.begin``/``finish``, ``write_json``),
named as real runs are, with the files a real run leaves (run.json, verdict.json, soak.json, summaries, a
report.md); one test makes real chaos runs (``chaos run --keep-runs``). A Hypothesis property holds the policy to
its definition on random trees: a protected run is never removed, and every other run beyond the newest N is.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import retention
from harness.rundir import LATEST, RunDir, write_json
from cli.dah import main as dah
from cli.options import prune_runs

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)


def stamp(minutes_ago: float, suffix: int = 1) -> str:
    name = (NOW - timedelta(minutes=minutes_ago)).strftime("%Y%m%dT%H%M%SZ")
    return name if suffix == 1 else f"{name}-{suffix}"


def make_run(root: Path, group: str, name: str, *, kind: str = "chaos", status: str = "complete",
             verdict: str | None = "pass", latest: bool = False, payload: int = 4096, **files: object) -> Path:
    """A run directory as the harness writes it: run.json through RunDir, verdict.json for a chaos run, a file of
    ``payload`` bytes standing in for what it measured, and ``files`` (name -> JSON)."""
    path = root / group / name
    path.mkdir(parents=True)
    run = RunDir(path)
    run.begin(kind, group.removeprefix("soak-"))
    if status != "running":
        run.run.update(status=status, ended=NOW.isoformat(), wall_s=1.0)
        run.save()
    if kind == "chaos" and verdict is not None:
        write_json(path / "verdict.json", {"schema": 2, "verdict": verdict, "checks": [
            {"name": "lost", "verdict": verdict, "summary": "", "details": {}}]})
    (path / "logs").mkdir()
    (path / "logs" / "w1-1.log").write_bytes(b"x" * payload)
    for name_, doc in files.items():
        write_json(path / name_.replace("__", "."), doc)
    if latest:
        run.link_latest()
    return path


def names(root: Path, group: str) -> list[str]:
    return sorted(p.name for p in (root / group).iterdir() if p.name != LATEST)


def collect(root: Path, keep: int | None = 2, **kw: object) -> retention.Plan:
    result = retention.plan(root, keep, now=NOW, **kw)
    retention.measure(result)
    result.notes += retention.remove(result)
    return result


def test_each_folder_keeps_its_newest_n_and_every_run_that_did_not_pass(tmp_path: Path) -> None:
    a = [make_run(tmp_path, "kill_idle", stamp(m)) for m in (50, 40, 30, 20, 10)]
    b = [make_run(tmp_path, "kill_mid_turn@dbos", stamp(m)) for m in (45, 35)]
    failed = {make_run(tmp_path, "kill_idle", stamp(60), verdict="fail").name,
              make_run(tmp_path, "kill_idle", stamp(61), verdict="unknown").name,
              make_run(tmp_path, "kill_idle", stamp(62), verdict=None).name,  # never checked
              make_run(tmp_path, "kill_idle", stamp(63), status="interrupted").name,
              make_run(tmp_path, "kill_idle", stamp(64), status="failed", verdict=None).name}
    result = collect(tmp_path, 2)
    assert names(tmp_path, "kill_idle") == sorted({a[-1].name, a[-2].name} | failed)
    assert names(tmp_path, "kill_mid_turn@dbos") == sorted(p.name for p in b)  # its own count: 2 of 2
    assert {r.path for r in result.removed} == set(a[:3])
    assert all(r.bytes >= 4096 for r in result.removed)
    # --include-failed: they go too, under the same rules (the newest 2 still kept)
    collect(tmp_path, 2, include_failed=True)
    assert names(tmp_path, "kill_idle") == sorted([a[-1].name, a[-2].name])


def test_latest_and_every_run_a_soak_summary_or_report_names_are_kept(tmp_path: Path) -> None:
    runs = {m: make_run(tmp_path, "kill_idle", stamp(m)) for m in range(10, 100, 10)}
    old_latest = runs[90]
    (tmp_path / "kill_idle" / LATEST).symlink_to(old_latest.name)  # latest at the oldest run
    # a soak names a seed's run by its absolute path; a suite summary, relative to the runs root; a report, as text
    make_run(tmp_path, "soak-kill_idle", stamp(5), kind="soak", soak__json={
        "runs": [{"seed": 1, "verdict": "pass", "run_dir": str(runs[80])}], "all_passed": True})
    make_run(tmp_path, "soak-kill_idle", stamp(4), kind="soak", summary__json={
        "kind": "chaos-summary", "runs": [{"scenario": "kill_idle", "seed": 2, "run_dir": f"../../kill_idle/{runs[70].name}"}]},
        soak__json={"runs": [], "all_passed": True})
    write_json(tmp_path / "suite-summary.json", {"kind": "chaos-summary", "runs": [
        {"scenario": "kill_idle", "seed": 1, "run_dir": f"kill_idle/{runs[60].name}"}]})
    report = tmp_path / "report-out"
    report.mkdir()
    (report / "report.md").write_text(f"| kill_idle | `runs/kill_idle/{runs[50].name}` | 2026-11-26 |\n")
    result = collect(tmp_path, 1, reports=[report])
    kept = {r.path.name: r.kept_because for r in result.kept if r.group == "kill_idle"}
    assert kept == {runs[10].name: "among the newest 1", old_latest.name: "latest",
                    runs[80].name: f"named by {tmp_path / 'soak-kill_idle' / stamp(5) / 'soak.json'}",
                    runs[70].name: f"named by {tmp_path / 'soak-kill_idle' / stamp(4) / 'summary.json'}",
                    runs[60].name: f"named by {tmp_path / 'suite-summary.json'}",
                    runs[50].name: f"named by {report / 'report.md'}"}
    assert names(tmp_path, "kill_idle") == sorted(kept)
    assert os.readlink(tmp_path / "kill_idle" / LATEST) == old_latest.name


def test_nothing_is_followed_through_a_link_and_nothing_outside_the_root_goes(tmp_path: Path) -> None:
    root, outside = tmp_path / "runs", tmp_path / "outside"
    outside_runs = [make_run(outside, "kill_idle", stamp(m)) for m in (50, 40, 30)]
    (outside / "precious.txt").write_text("keep me")
    root.mkdir()
    (root / "linked_group").symlink_to(outside / "kill_idle", target_is_directory=True)  # a group through a link
    runs = [make_run(root, "kill_idle", stamp(m)) for m in (50, 40, 30)]
    (root / "kill_idle" / stamp(45)).symlink_to(outside_runs[0], target_is_directory=True)  # a run through a link
    (runs[0] / "logs" / "escape").symlink_to(outside / "precious.txt")  # a link inside a run that goes
    (runs[0] / "state").symlink_to(outside, target_is_directory=True)
    (root / "kill_idle" / "not-a-run").mkdir()  # not named as a run: left alone
    (root / "kill_idle" / "not-a-run" / "run.json").write_text("{}")
    result = collect(root, 1)
    assert {r.path for r in result.removed} == set(runs[:2])
    assert {r.path for r in result.runs} == set(runs) and result.notes == []  # the linked ones never looked at
    assert sorted(p.name for p in (root / "kill_idle").iterdir()) == sorted([stamp(30), stamp(45), "not-a-run"])
    assert (root / "kill_idle" / stamp(45)).is_symlink()
    assert (outside / "precious.txt").read_text() == "keep me"
    assert [p.is_dir() for p in outside_runs] == [True, True, True]
    assert (root / "linked_group").is_symlink()


def test_a_run_still_being_written_or_unreadable_is_kept(tmp_path: Path) -> None:
    running = make_run(tmp_path, "kill_idle", stamp(90), status="running", verdict=None)
    being_made = tmp_path / "kill_idle" / stamp(80)
    being_made.mkdir()  # RunDir.create made it; run.json not written yet
    damaged = make_run(tmp_path, "kill_idle", stamp(70))
    (damaged / "run.json").write_text("{not json")
    newest = make_run(tmp_path, "kill_idle", stamp(10))
    result = collect(tmp_path, 0)
    assert [r.path for r in result.removed] == [newest]
    assert {r.path.name: r.kept_because for r in result.kept} == {
        running.name: "still running", being_made.name: "no run.json yet", damaged.name: "unreadable"}
    assert names(tmp_path, "kill_idle") == sorted([running.name, being_made.name, damaged.name])


def test_older_than_removes_only_runs_older_than_it(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "bench", stamp(m), kind="bench") for m in (3 * 1440, 2 * 1440, 60, 30)]
    result = collect(tmp_path, 1, older_than=retention.parse_duration("1d"))
    assert {r.path for r in result.removed} == set(runs[:2])
    assert {r.path.name: r.kept_because for r in result.kept} == {runs[2].name: "newer than --older-than",
                                                                  runs[3].name: "among the newest 1"}


def test_the_newest_complete_bench_run_with_each_result_file_is_kept(tmp_path: Path) -> None:
    table2 = make_run(tmp_path, "bench", stamp(90), kind="bench", latency__json={"series": []})
    older = make_run(tmp_path, "bench", stamp(100), kind="bench", latency__json={"series": []})
    micro = [make_run(tmp_path, "bench", stamp(m), kind="bench", micro__json={}) for m in (30, 20, 10)]
    make_run(tmp_path, "bench", stamp(5), kind="bench", status="interrupted", latency__json={"series": []})
    collect(tmp_path, 1)
    left = names(tmp_path, "bench")
    assert table2.name in left and micro[-1].name in left  # the report's table2 and micro sections
    assert older.name not in left and micro[0].name not in left


def test_durations_and_keep_values() -> None:
    assert retention.parse_duration("7d") == timedelta(days=7)
    assert retention.parse_duration("1d12h") == timedelta(hours=36)
    assert retention.parse_duration("90s") == timedelta(seconds=90)
    for bad in ("", "7", "d", "7x", "7d 3"):
        with pytest.raises(ValueError, match="a duration such as 7d"):
            retention.parse_duration(bad)
    assert retention.parse_keep("0") == 0 and retention.parse_keep("all") is None
    with pytest.raises(ValueError, match="or 'all'"):
        retention.parse_keep("-1")
    assert retention.default_keep({}) == retention.DEFAULT_KEEP
    assert retention.default_keep({"DAH_KEEP_RUNS": "3"}) == 3
    assert retention.default_keep({"DAH_KEEP_RUNS": "all"}) is None
    with pytest.raises(ValueError, match="DAH_KEEP_RUNS='x'"):
        retention.default_keep({"DAH_KEEP_RUNS": "x"})
    # runs named in the same second sort -2 after the first and -10 after -9
    names_ = [stamp(0, n) for n in (10, 1, 9, 2)]
    assert sorted(names_, key=retention._order) == [stamp(0), stamp(0, 2), stamp(0, 9), stamp(0, 10)]


def test_dah_gc_dry_run_removes_nothing_and_says_what_it_would(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    runs = [make_run(tmp_path, "kill_idle", stamp(m), payload=100_000) for m in (30, 20, 10)]
    assert dah(["gc", "--runs", str(tmp_path), "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert names(tmp_path, "kill_idle") == sorted(p.name for p in runs)
    assert f"would remove {runs[0]}" in out and f"would remove {runs[1]}" in out and str(runs[2]) not in out
    freed = sum(retention.size(retention.Run("kill_idle", p.name, p, NOW, "pass")) for p in runs[:2])
    assert f"would remove 2 run(s) ({retention.human_bytes(freed)}) in 1 group(s) under {tmp_path.resolve()}; " \
           f"kept 1 (1 newest)" in out
    assert dah(["gc", "--runs", str(tmp_path), "--keep", "1"]) == 0
    assert f"removed 2 run(s) ({retention.human_bytes(freed)})" in capsys.readouterr().out
    assert names(tmp_path, "kill_idle") == [runs[2].name]
    assert dah(["gc", "--runs", str(tmp_path / "nope")]) == 2
    assert "--runs" in capsys.readouterr().err


def test_prune_after_a_command_touches_only_the_folders_it_wrote_and_can_be_turned_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(timezone.utc)
    mine = [make_run(tmp_path, "kill_idle", (now - timedelta(hours=h)).strftime("%Y%m%dT%H%M%SZ")) for h in (3, 2)]
    others = [make_run(tmp_path, "bench", (now - timedelta(hours=h)).strftime("%Y%m%dT%H%M%SZ"), kind="bench")
              for h in (3, 2)]
    new = make_run(tmp_path, "kill_idle", now.strftime("%Y%m%dT%H%M%SZ"))  # what "the command" wrote
    monkeypatch.setenv("DAH_KEEP_RUNS", "all")
    prune_runs(tmp_path, now, None)  # opted out by the environment
    prune_runs(tmp_path, now, "all")  # and by the flag
    assert len(names(tmp_path, "kill_idle")) == 3
    monkeypatch.setenv("DAH_KEEP_RUNS", "1")
    prune_runs(tmp_path, now, "2")  # the flag wins over the environment
    assert names(tmp_path, "kill_idle") == sorted([mine[1].name, new.name])
    prune_runs(tmp_path, now, None)
    assert names(tmp_path, "kill_idle") == [new.name]
    assert names(tmp_path, "bench") == sorted(p.name for p in others)  # a folder the command did not write into
    err = capsys.readouterr().err
    assert "pruned 1 older run(s)" in err and "of kill_idle under" in err and "--keep-runs all" in err


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_chaos_run_prunes_after_itself_and_keep_runs_all_turns_it_off(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from cli.chaos import main as chaos

    old = make_run(tmp_path, "kill_idle", stamp(0))  # a passing run from before (2026-11-26)
    failed = make_run(tmp_path, "kill_idle", stamp(1), verdict="fail")
    assert chaos(["run", "kill_idle", "--out", str(tmp_path), "--keep-runs", "all"]) == 0
    assert len(names(tmp_path, "kill_idle")) == 3
    assert chaos(["run", "kill_idle", "--out", str(tmp_path), "--keep-runs", "1"]) == 0
    left = names(tmp_path, "kill_idle")
    latest = os.readlink(tmp_path / "kill_idle" / LATEST)
    assert left == sorted([failed.name, latest]) and old.name not in left
    assert "pruned 2 older run(s)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- the property

OUTCOMES = ("pass", "fail", "unknown", "interrupted", "running", "no-record")
run_spec = st.tuples(st.integers(0, 3), st.integers(1, 10_000), st.sampled_from(OUTCOMES), st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(run_spec, min_size=1, max_size=14, unique_by=lambda s: (s[0], s[1])),
       keep=st.integers(0, 4), older_h=st.one_of(st.none(), st.integers(0, 200)), include_failed=st.booleans(),
       latest_at=st.lists(st.integers(0, 13), max_size=4))
def test_gc_never_removes_a_protected_run_and_removes_every_other_past_the_newest_n(
        tmp_path_factory: pytest.TempPathFactory, specs: list[tuple[int, int, str, bool]], keep: int,
        older_h: int | None, include_failed: bool, latest_at: list[int]) -> None:
    root = tmp_path_factory.mktemp("runs")
    made: dict[Path, tuple[str, bool]] = {}
    for group_n, minutes, outcome, named in specs:
        group, name = f"scenario{group_n}", stamp(minutes)
        if outcome == "no-record":
            (root / group / name).mkdir(parents=True)
            path = root / group / name
        else:
            path = make_run(root, group, name, payload=10, status={"interrupted": "interrupted", "running": "running"}
                            .get(outcome, "complete"), verdict=outcome if outcome in ("pass", "fail", "unknown")
                            else None)
        made[path] = (outcome, named)
    paths = sorted(made)
    latest = {paths[i % len(paths)] for i in latest_at}
    for p in latest:
        (p.parent / LATEST).unlink(missing_ok=True)
        (p.parent / LATEST).symlink_to(p.name)
    latest = {p for p in latest if os.readlink(p.parent / LATEST) == p.name}
    write_json(root / "suite-summary.json", {"kind": "chaos-summary", "runs": [
        {"run_dir": str(p.relative_to(root))} for p, (_, named) in made.items() if named]})
    result = retention.plan(root, keep, older_than=None if older_h is None else timedelta(hours=older_h),
                            include_failed=include_failed, now=NOW)
    retention.remove(result)
    for path, (outcome, named) in made.items():
        siblings = sorted((p for p in made if p.parent == path.parent), key=lambda p: retention._order(p.name))
        rank = len(siblings) - 1 - siblings.index(path)  # 0: the newest of its folder
        protected = (path in latest or named or outcome in ("running", "no-record")
                     or (outcome != "pass" and not include_failed))
        young = older_h is not None and NOW - retention.stamp_time(path.name) < timedelta(hours=older_h)
        should_go = not protected and rank >= keep and not young
        assert path.is_dir() != should_go, (path, outcome, named, rank, keep, older_h, include_failed)
    assert (root / "suite-summary.json").is_file()

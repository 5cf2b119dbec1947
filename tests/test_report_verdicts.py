"""The report leads with the verdicts: a grid of scenario by engine/placement by seed, each cell text and a link
inside the report; then every run that did not pass, with its checks and reproduce command; machine and versions
once per machine; provenance after the results. Built from synthetic run directories (no Temporal)."""

from __future__ import annotations

import csv
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from cli import report as cli
from tests.test_reports import STAMP, write_chaos

MACHINE_B = {"cores": 4, "memory_gb": 15.6, "cpu": "Other CPU", "platform": "Linux-other", "python": "3.12.1",
             "temporalio": "1.36.0", "temporal_cli": "temporal version 1.9.9"}
SOAK_STAMP = "20261122T110000000000Z"


def _edit_run(run: Path, **fields) -> None:
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(record | fields))


def _seed_run(runs: Path, scenario: str, seed: int, verdict: str) -> Path:
    """A soak seed's run directory (the fields the report reads of it)."""
    run = runs / scenario / f"20261122T0900{seed:02d}000000Z"  # older than STAMP: never a newest run
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"schema": 2, "kind": "chaos", "name": scenario, "status": "complete",
                                              "seed": seed}))
    (run / "verdict.json").write_text(json.dumps({"schema": 2, "verdict": verdict, "checks": [],
                                                  "recovery": {"worst_s": 1.5 + seed}}))
    return run


def write_soak(runs: Path, scenario: str, verdicts: dict[int, str], machine: dict) -> None:
    """``chaos soak``'s own run directory and one run directory per seed, as RUN_DIRECTORY.md describes them."""
    rows = []
    for seed, verdict in verdicts.items():
        run = _seed_run(runs, scenario, seed, verdict)
        rows.append({"seed": seed, "verdict": verdict, "run_dir": str(run), "wall_s": 30.0, "checks": {},
                     "reproduce": f"python -m chaos run {scenario} --seed {seed}",
                     "non_pass": [{"check": "lost", "verdict": verdict, "summary": f"seed {seed}: 1 message lost"}]
                     if verdict != "pass" else [], "error": None})
    soak = runs / f"soak-{scenario}" / SOAK_STAMP
    soak.mkdir(parents=True)
    (soak / "run.json").write_text(json.dumps({
        "schema": 2, "kind": "soak", "name": scenario, "status": "complete", "seed": min(verdicts),
        "seeds": list(verdicts), "reproduce": f"python -m chaos soak {scenario} --seeds 1-{len(verdicts)}",
        "machine": machine, "backend": {"name": "temporal", "workers": "process"}}))
    (soak / "soak.json").write_text(json.dumps({"schema": 2, "scenario": scenario, "status": "complete",
                                                "seeds": list(verdicts), "done": len(rows), "runs": rows}))
    (runs / f"soak-{scenario}" / "latest").symlink_to(SOAK_STAMP)


class Page(HTMLParser):
    """What a reader of report.html meets, in order: headings, grid chips, links, ids."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.order: list[tuple[str, str]] = []  # (tag, text) of each heading and each table's class, in order
        self.ids: set[str] = set()
        self.chips: list[dict] = []  # each grid chip: href, class, text
        self.grid_cells: list[list[dict]] = []  # each grid <td>: its chips and dashes
        self.links: list[str] = []  # every href
        self._open: list[dict] = []
        self._in_grid = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "table":
            self._in_grid = "grid" in (a.get("class") or "")
            self.order.append(("table", a.get("class") or ""))
        if tag == "td" and self._in_grid:
            self.grid_cells.append([])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        if tag in ("h1", "h2", "h3") or (tag == "a" and "chip" in (a.get("class") or "")) or (
                tag == "span" and self._in_grid):
            self._open.append({"tag": tag, "attrs": a, "text": ""})

    def handle_data(self, data):
        for o in self._open:
            o["text"] += data

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_grid = False
        if self._open and self._open[-1]["tag"] == tag:
            o = self._open.pop()
            if tag in ("h1", "h2", "h3"):
                self.order.append((tag, o["text"].strip()))
            else:
                chip = {"href": o["attrs"].get("href"), "class": o["attrs"].get("class", ""), "text": o["text"]}
                if tag == "a":
                    self.chips.append(chip)
                if self.grid_cells:
                    self.grid_cells[-1].append(chip)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """Two runs roots (two machines): on the first a passing run, a failing one, an interrupted (unknown) one, a run
    on the checkpoint engine and a soak with a failing seed; on the second a passing run."""
    root = tmp_path_factory.mktemp("verdicts")
    a, b = root / "machine-a", root / "machine-b"
    write_chaos(a, "kill_mid_turn", clients=())
    write_chaos(a, "model_outage", failing=("effects",), fault="model_outage", clients=())
    write_chaos(a, "kill_idle", complete=False, link=False, clients=())
    write_chaos(a, "kill_mid_turn@checkpoint", clients=())
    _edit_run(a / "kill_mid_turn@checkpoint" / STAMP, backend={"name": "checkpoint", "workers": "process"})
    for name in ("kill_mid_turn", "model_outage", "kill_idle"):
        _edit_run(a / name / STAMP, backend={"name": "temporal", "workers": "process"})
    machine_a = json.loads((a / "kill_mid_turn" / STAMP / "run.json").read_text())["machine"]
    write_soak(a, "kill_idle", {1: "pass", 2: "fail", 3: "pass"}, machine_a)
    write_chaos(b, "partition_model", clients=())
    _edit_run(b / "partition_model" / STAMP, machine=MACHINE_B, backend={"name": "temporal", "workers": "docker"})
    out = root / "out"
    assert cli.main(["--runs", str(a), str(b), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    return {"root": root, "a": a, "b": b, "out": out, "html": html, "page": Page(html),
            "md": (out / "report.md").read_text(), "machine_a": machine_a}


def test_the_verdict_grid_comes_first_and_provenance_after_the_results(report) -> None:
    order = report["page"].order
    assert order[0][0] == "h1" and order[1] == ("h2", "Verdicts")
    assert order[2] == ("table", "grid"), "the grid is the report's first table"
    headings = [text for tag, text in order if tag == "h2"]
    assert headings.index("Failures and unknowns") == 1
    assert headings.index("Provenance") > headings.index("Chaos runs") > headings.index("Failures and unknowns")
    md = report["md"]
    assert md.index("## Verdicts") < md.index("| Scenario |") < md.index("## Failures") < md.index("## Provenance")


def test_every_grid_cell_has_text_and_a_link_that_resolves_inside_the_report(report) -> None:
    page = report["page"]
    assert page.grid_cells, "the grid has cells"
    for cell in page.grid_cells:
        assert cell, "an empty cell says so"
        for chip in cell:
            if chip["href"] is None:  # a scenario not run on that engine: a dash, with its words on hover
                assert chip["text"] == "—"
                continue
            words = chip["text"].split()
            assert words[-1] in ("pass", "FAIL", "unknown", "error"), chip  # text, never colour alone
            assert words[-1].lower() in chip["class"]
            assert chip["href"].startswith("#") and chip["href"][1:] in page.ids, chip
    texts = sorted(c["text"] for c in page.chips)
    # every run: the single runs (seed 7), the soak's three seeds, the interrupted run as unknown
    assert texts.count("seed 7: pass") == 3 and texts.count("seed 7: FAIL") == 1
    assert texts.count("seed 7: unknown") == 1
    assert sorted(t for t in texts if not t.startswith("seed")) == ["1 pass", "2 FAIL", "3 pass"]
    # the columns: engine and placement, and the machine, since the runs come from two
    assert "checkpoint · process · machine A" in report["html"] and "temporal · docker · machine B" in report["html"]


def _failure_entry(html: str, heading: str) -> str:
    start = html.index(f">{heading}</h3>")  # the entry's heading (a chip's title holds the same words)
    return html[start:html.index("<h", start + len(heading))]


def test_a_failing_run_is_among_the_failures_with_its_checks_reproduce_command_and_files(report) -> None:
    html, page = report["html"], report["page"]
    failing = next(c for c in page.chips if c["text"] == "seed 7: FAIL")
    entry = html[html.index(f'id="{failing["href"][1:]}"'):]
    entry = entry[:entry.index("<h", 10)]
    assert "model_outage on temporal · process · machine A, seed 7: FAIL" in entry
    assert "effects ok" in entry and "fail" in entry  # the check that failed, with its summary
    assert "<pre>python -m chaos run model_outage --seed 7</pre>" in entry  # as the run recorded it
    assert "<code>.venv/bin/python -m chaos run model_outage --seed 7</code>" in entry  # and as it runs
    hrefs = [unquote(h) for h in re.findall(r'href="([^"]+)"', entry)]
    files = [h for h in hrefs if not h.startswith("#")]
    assert files, "the entry links to the run's files"
    for h in files:  # relative to the report's folder, to the run directory it read: nothing else
        target = (report["out"] / h).resolve()
        assert target.exists() and target.is_relative_to((report["a"] / "model_outage" / STAMP).resolve()), h
    assert any(h.startswith("#") and h[1:] in page.ids for h in hrefs), "and to its details"
    # the soak's failing seed, and the interrupted run (unknown, never rounded up)
    seed = _failure_entry(html, "kill_idle on temporal · process · machine A, seed 2: FAIL (a soak seed)")
    assert "seed 2: 1 message lost" in seed and "python -m chaos run kill_idle --seed 2" in seed
    unknown = _failure_entry(html, "kill_idle on temporal · process · machine A, seed 7: unknown")
    assert "the run was never checked" in unknown
    assert "## Failures and unknowns" in report["md"] and "python -m chaos run model_outage --seed 7" in report["md"]


def test_every_link_in_the_report_resolves_inside_it_or_to_a_run_it_read(report) -> None:
    page = report["page"]
    roots = [report["a"].resolve(), report["b"].resolve()]
    for href in page.links:
        if href.startswith("#"):
            assert href[1:] in page.ids, href
            continue
        target = (report["out"] / unquote(href)).resolve()
        assert target.exists(), href
        assert target.is_relative_to(report["out"].resolve()) or any(target.is_relative_to(r) for r in roots), href


def test_machine_and_versions_are_stated_once_per_machine(report) -> None:
    html = report["html"]
    m = report["machine_a"]
    for text in (f"{m['cores']} cores, {m['memory_gb']} GB RAM, {m['cpu']}", f"Python {m['python']}",
                 "4 cores, 15.6 GB RAM, Other CPU, Linux-other", "Python 3.12.1, temporalio 1.36.0"):
        assert html.count(text) == 1, text
    assert report["md"].count("Python 3.12.1, temporalio 1.36.0") == 1


def test_the_verdicts_are_also_a_latex_table_and_a_csv(report) -> None:
    rows = {r["Scenario"]: r for r in csv.DictReader((report["out"] / "verdicts.csv").open(encoding="utf-8"))}
    assert rows["model_outage"]["temporal · process · machine A"] == "seed 7: FAIL"
    assert rows["kill_idle (soak)"]["temporal · process · machine A"] == "2 pass, 1 FAIL (seed 2)"
    assert rows["kill_mid_turn"]["checkpoint · process · machine A"] == "seed 7: pass"
    tex = (report["out"] / "verdicts.tex").read_text()
    assert r"temporal $\cdot$ process $\cdot$ machine A" in tex and r"\toprule" in tex
    preview = (report["out"] / "preview.tex").read_text()
    assert preview.index(r"\input{verdicts.tex}") < preview.index(r"\input{table1.tex}")


def test_a_soak_seed_links_to_its_row_and_its_row_to_its_run_directory(report) -> None:
    html, page = report["html"], report["page"]
    passing = next(c for c in page.chips if c["text"] == "1 pass")
    row = html[html.index(f'<tr id="{passing["href"][1:]}"'):]
    row = row[:row.index("</tr>")]
    href = unquote(re.search(r'<a href="([^"#][^"]*)"', row).group(1))
    assert (report["out"] / href).resolve() == (report["a"] / "kill_idle" / "20261122T090001000000Z").resolve()


def test_a_scenarios_newest_run_that_is_a_soak_seed_is_shown_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_soak(runs, "kill_idle", {1: "pass", 2: "pass"}, {"cores": 2})
    newest = runs / "kill_idle" / "20261122T090002000000Z"
    write_chaos(tmp_path / "scratch", "kill_idle", clients=(), link=False)  # a full run's files, copied as seed 2's
    for f in ("run.json", "verdict.json", "operations.jsonl"):
        os.replace(tmp_path / "scratch" / "kill_idle" / STAMP / f, newest / f)
    (runs / "kill_idle" / "latest").symlink_to(newest.name)
    assert cli.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    page = Page((tmp_path / "out" / "report.html").read_text())
    assert sorted(c["text"] for c in page.chips) == ["1 pass", "2 pass"]


def test_a_run_name_with_a_lone_surrogate_costs_nothing_but_is_shown_escaped(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    """A run.json ``name`` of "\\udc80" (JSON can carry a lone surrogate), and a scenario folder whose name is not
    UTF-8 (Python reads its byte 0x80 as the same surrogate): every run keeps its row in the grid and in Table 1,
    the name shown escaped, and the report links to the folder by its real bytes."""
    runs = tmp_path / "runs"
    for name in ("kill_mid_turn", "model_outage", "bad_name", "bad\udc80folder"):
        write_chaos(runs, name, clients=())
    record = json.loads((runs / "bad_name" / STAMP / "run.json").read_text())
    (runs / "bad_name" / STAMP / "run.json").write_text(json.dumps({**record, "name": "bad\udc80name"}))
    assert '"bad\\udc80name"' in (runs / "bad_name" / STAMP / "run.json").read_text()  # as JSON carries it
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "not rendered" not in err and "Traceback" not in err, err
    md = (out / "report.md").read_text(encoding="utf-8")
    shown = ["bad\\\\udc80folder", "bad\\\\udc80name", "kill_mid_turn", "model_outage"]  # a backslash doubled
    grid = md.split("## Verdicts", 1)[1].split("##", 1)[0]
    assert "not rendered" not in grid and [line.split(" | ")[0].lstrip("| ") for line in grid.splitlines()
                                           if line.startswith("| ") and "seed 7" in line] == shown, grid
    table1 = md.split("## Table 1", 1)[1].split("\n## ", 1)[0]
    assert "not rendered" not in table1 and "4 scenario(s): 4 pass" in table1, table1
    for name in ("verdicts.csv", "table1.csv"):
        rows = list(csv.DictReader((out / name).open(encoding="utf-8")))
        assert sorted(r["Scenario"] for r in rows) == ["bad\\udc80folder", "bad\\udc80name", "kill_mid_turn",
                                                       "model_outage"], (name, rows)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'href="../runs/bad%80folder/' in page  # the folder's own bytes, percent-encoded


def _target_run(runs: Path, scenario: str, stamp: str, target: str, *, failing=(), complete=True,
                verdict: dict | None = None) -> Path:
    """A chaos run of a bring-your-own target (run.json ``backend.name`` "target", ``target.name``), started at its
    stamp; ``verdict``: fields added to its verdict.json."""
    write_chaos(runs, scenario, stamp=stamp, failing=failing, complete=complete, link=False, clients=())
    run = runs / scenario / stamp
    _edit_run(run, backend={"name": "target", "workers": "process"}, target={"name": target},
              started=f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}Z")
    if verdict:
        (run / "verdict.json").write_text(json.dumps(json.loads((run / "verdict.json").read_text()) | verdict))
    return run


def _verdicts_part(md: str) -> str:
    return md.split("## Verdicts", 1)[1].split("\n## ", 1)[0]


def test_every_targets_newest_run_is_shown_and_every_run_left_out_is_counted(tmp_path: Path) -> None:
    """Two targets ran the same scenario into one folder: each target's newest run has its cell in the grid and its
    row in Table 1; the runs not shown (older ones, one of them failing, a newer one that did not complete, a
    malformed one) are counted in one line, the failing one by its path, and the header's count adds up."""
    runs = tmp_path / "runs"
    old_fail = _target_run(runs, "kill_mid_turn", "20261120T100000Z", "calc-agent", failing=("effects",))
    _target_run(runs, "kill_mid_turn", "20261121T100000Z", "calc-agent")
    calc = _target_run(runs, "kill_mid_turn", "20261122T100000Z", "calc-agent")
    notes = _target_run(runs, "kill_mid_turn", "20261122T110000Z", "notes-agent", failing=("lost",))
    _target_run(runs, "kill_mid_turn", "20261122T120000Z", "notes-agent", complete=False)  # interrupted, newer
    (runs / "kill_mid_turn" / "latest").symlink_to(notes.name)  # the last to complete: one target's run only
    bad = runs / "kill_mid_turn" / "20261119T100000Z"
    bad.mkdir()
    (bad / "run.json").write_text("[1]")
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out)]) == 1  # written without the malformed run
    page = Page((out / "report.html").read_text())
    assert sorted(c["text"] for c in page.chips) == ["seed 7: FAIL", "seed 7: pass"]
    assert {page.chips[0]["href"], page.chips[1]["href"]} == {"#run-kill_mid_turn-20261122t100000z",
                                                              "#failed-kill_mid_turn-20261122t110000z"}
    md = (out / "report.md").read_text()
    part = _verdicts_part(md)
    assert "| Scenario | target calc-agent · process | target notes-agent · process |" in part
    assert "6 run(s) found: 2 shown (1 pass, 1 FAIL), 4 not shown." in part
    assert (f"2 older runs of the same scenario and target are not shown, 1 of them failed: `{old_fail}`; 1 newer "
            f"run of the same scenario and target that did not complete is not shown, its verdict unknown; 1 "
            f"malformed run is left out: `{bad}`: [every run not shown](#not-shown)") in part
    not_shown = md.split("### Chaos runs not shown", 1)[1].split("\n## ", 1)[0]
    assert not_shown.count(str(runs / "kill_mid_turn")) == 4 and "| FAIL |" in not_shown
    rows = {r["Scenario"]: r["Run"] for r in csv.DictReader((out / "table1.csv").open(encoding="utf-8"))}
    assert rows == {"kill_mid_turn (calc-agent)": str(calc), "kill_mid_turn (notes-agent)": str(notes)}
    assert "### kill_mid_turn (calc-agent)" in md and "*Checks of kill_mid_turn (notes-agent).*" in md


def test_a_run_of_one_target_alone_is_shown_as_before(tmp_path: Path) -> None:
    """Nothing left out: the header is the count of runs shown, with no line about runs not shown."""
    runs = tmp_path / "runs"
    write_chaos(runs, "kill_mid_turn", clients=())
    assert cli.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "1 run(s): 1 pass." in _verdicts_part(md) and "not shown" not in md


def test_diagnoses_and_safety_and_liveness_are_shown_escaped_and_bounded(tmp_path: Path) -> None:
    """verdict.json's diagnoses: each run in the grid that has some lists them (the first ten, then how many more),
    run data escaped; its safety and liveness verdicts beside its verdict. A run without them shows nothing new."""
    runs = tmp_path / "runs"
    lines = [{"line": "The tool's effect is keyed by attempt <script>alert(1)</script>: key it by workflow id.",
              "about": "effects", "fix": "idempotency key", "setting": {"key": "workflow_id"}, "measured_s": 1.5}]
    lines += [{"line": f"Lint {n}: `send_email` states no retry policy.", "about": "lint"} for n in range(11)]
    _target_run(runs, "kill_mid_turn", "20261122T100000Z", "calc-agent", failing=("effects",),
                verdict={"diagnoses": lines, "safety": "fail", "liveness": "pass"})
    _target_run(runs, "kill_mid_turn", "20261122T110000Z", "notes-agent")
    write_soak(runs, "kill_idle", {1: "pass"}, {"cores": 2})
    seed = runs / "kill_idle" / "20261122T090001000000Z"
    verdict = json.loads((seed / "verdict.json").read_text())
    (seed / "verdict.json").write_text(json.dumps(verdict | {"diagnoses": [{"line": "Seed one's diagnosis.",
                                                                            "about": "recovery"}]}))
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    page = Page(html)
    assert sorted(c["text"] for c in page.chips) == ["1 pass", "seed 7: FAIL (safety FAIL, liveness pass)",
                                                     "seed 7: pass"]
    diagnoses = html.split(">Diagnoses: cause and fix</h3>", 1)[1].split("<h2", 1)[0]
    assert "<li>effects: The tool's effect is keyed by attempt &lt;script&gt;alert(1)&lt;/script&gt;" in diagnoses
    assert "<script>" not in html
    assert "<li>lint: Lint 0: <code>send_email</code> states no retry policy.</li>" in diagnoses
    assert diagnoses.count("<li>lint: Lint") == 9 and "<li>+2 more (in its verdict.json)</li>" in diagnoses
    assert "<li>recovery: Seed one's diagnosis.</li>" in diagnoses
    assert "notes-agent" not in diagnoses  # no diagnoses: no entry
    failure = html.split('id="failed-kill_mid_turn-20261122t100000z"', 1)[1].split("<h", 1)[0]
    assert "safety FAIL, liveness pass" in failure
    ids = page.ids
    assert all(h[1:] in ids for h in page.links if h.startswith("#"))


def test_a_diagnosis_line_that_says_what_it_is_about_is_not_prefixed_twice() -> None:
    from reports.verdicts import _about_line

    assert _about_line({"about": "recovery", "line": "recovery: the kill waited 60.0 s"}) == \
        "recovery: the kill waited 60.0 s"
    assert _about_line({"about": "lint", "line": "x" * 2000}) == "lint: " + "x" * 1200

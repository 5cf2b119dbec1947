"""Output stays well-formed whatever a run directory holds (issue 28, cases 8 and 9).

A received run directory's scenario name, checker summaries, errors and reproduce commands may hold terminal
escapes, NUL, bidi overrides, HTML and Markdown: ``chaos summary``'s JUnit XML still parses and shows them as
visible escapes, the terminal gets no raw control character, and report.md no raw HTML.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos import ci, suite
from cli import chaos as cli
from chaos.runner import Outcome
from chaos.soak import summary
from harness.printable import printable
from harness.rundir import RunDir
from harness.verdict import CheckResult
from cli import report as reports_cli
from reports.document import markdown_inline
from reports.tables import markdown_escape
from tests.test_reports import STAMP, write_chaos

#: everything the issue found reaching the terminal, the XML and report.md raw; "=cmd|" starts a CSV formula
HOSTILE = ("=cmd|' /C calc'!A0 \x1b[31mred\x1b]0;title\x07 nul\x00 bell\x07 \u202eevil\u2066 \x9b31m "
           "<script>alert(1)</script> \"><img src=x onerror=alert(1)> ]]> a|b\nsecond line [x](javascript:alert(1))")
SUMMARY = "lost \x1b[2J\x00 <script>alert(2)</script> \"><img src=x onerror=alert(2)> ]]> | \u202ecba\nnext"
#: what no terminal line may hold: C0 controls but newline and tab, DEL and C1, bidi controls
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _hostile_run(root: Path) -> Path:
    """A complete chaos run directory whose name, checker summaries, error and reproduce are all hostile."""
    run = RunDir.create(root / "kill_idle")
    run.begin("chaos", HOSTILE, seed=1, reproduce=f"python -m chaos run {HOSTILE}")
    checks = [CheckResult("lost", "fail", SUMMARY), CheckResult("effects\x1b[1m", "unknown", HOSTILE)]
    run.write_json("verdict.json", {"verdict": "fail", "checks": [c.as_dict() for c in checks]})
    run.finish("complete", 3.0)
    return run.path


def _assert_terminal_safe(text: str) -> None:
    assert not RAW.findall(text), f"raw control or bidi characters reached the terminal: {RAW.findall(text)}"


def test_summary_writes_junit_that_parses_and_prints_no_raw_control_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _hostile_run(tmp_path / "runs")
    junit, merged = tmp_path / "chaos-junit.xml", tmp_path / "chaos-summary.json"
    assert cli.main(["summary", str(tmp_path / "runs"), "--summary", str(merged), "--junit", str(junit)]) == 1
    [case] = ET.parse(junit).getroot().iter("testcase")  # well-formed: before, \x1b and \x00 made it not
    assert case.get("name") == printable(f"{HOSTILE} seed 1", keep="\n\t")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "fail"
    assert printable(SUMMARY, keep="\n\t") in failure.text and printable(SUMMARY, keep="\n\t") in failure.get("message")
    assert f"reproduce: python -m chaos run {printable(HOSTILE, keep=chr(10) + chr(9))}" in failure.text
    # The summary JSON keeps the data as it was (JSON escapes every control character itself).
    assert json.loads(merged.read_text())["runs"][0]["scenario"] == HOSTILE
    captured = capsys.readouterr()
    _assert_terminal_safe(captured.out + captured.err)
    assert "\\x1b[31mred" in captured.out and "\\u202eevil" in captured.out and "\\x00" in captured.out


#: any text at all, surrogates included (json.loads of "\ud800" gives one)
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT, ANY_TEXT, ANY_TEXT, st.sampled_from(["fail", "unknown"]))
def test_junit_parses_and_shows_whatever_the_names_and_summaries_hold(
        name: str, check_summary: str, reproduce: str, verdict: str) -> None:
    row = {**ci.planned_row(name, 3, "complete"), "verdict": verdict, "checkers": {"lost": verdict},
           "non_pass": [{"check": "lost", "verdict": verdict, "summary": check_summary}], "reproduce": reproduce}
    root = ET.fromstring(ci.junit_xml([row], name, 1.0, Path(".")))
    [case] = root.iter("testcase")
    assert case.get("name") == printable(f"{name} seed 3", keep="\n\t")
    assert case.get("classname") == printable(f"chaos.{name}", keep="\n\t")
    failure = case.find("failure")
    assert failure.get("type") == verdict
    assert f"lost: {verdict}: {printable(check_summary, keep=chr(10) + chr(9))}" in failure.text
    assert f"reproduce: {printable(reproduce or '(unknown)', keep=chr(10) + chr(9))}" in failure.text


@given(ANY_TEXT)
def test_printable_leaves_no_unsafe_character_and_changes_nothing_safe(text: str) -> None:
    shown = printable(text)
    assert not RAW.findall(shown) and not re.search("[\ud800-\udfff\ufffe\uffff\n\t]", shown)
    shown.encode("utf-8")  # no surrogate left: a terminal or a file can take it
    if not re.search("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]",
                     text):
        assert shown == text


#: text rich in what Markdown and HTML read
MARKUP_TEXT = st.text(st.sampled_from(list("[]()!<>|`*\\\"&:\n x")) | st.characters(codec=None), max_size=40)


@given(MARKUP_TEXT)
def test_markdown_escape_leaves_no_html_link_or_line_break(text: str) -> None:
    shown = markdown_escape(text)
    assert "<" not in shown and ">" not in shown and "\n" not in shown
    unescaped = re.sub(r"\\.", "", shown)  # what is left once every backslash escape is taken out
    assert "](" not in unescaped and "][" not in unescaped and not unescaped.startswith("[")
    assert "|" not in unescaped and "`" not in unescaped and "*" not in unescaped


@given(MARKUP_TEXT)
def test_report_paragraphs_keep_code_and_bold_and_carry_no_other_html(text: str) -> None:
    shown = markdown_inline(f"run `{text}`: **{text}** {text}")
    assert "<" not in re.sub(r"</?code>", "", shown) and "\n" not in shown
    assert not RAW.findall(shown)


def test_the_suite_and_soak_tables_print_run_data_escaped() -> None:
    checks = [CheckResult("lost", "fail", SUMMARY)]
    outcome = Outcome(HOSTILE, 1, "fail", Path("runs/x"), 3.0, f"python -m chaos run {HOSTILE}", checks)
    text = summary(HOSTILE, [1], [outcome], 3.0, Path("runs/soak-x"))
    _assert_terminal_safe(text)
    assert "\\x1b[2J\\x00" in text and "\\u202ecba" in text
    table = suite.table([{"scenario": HOSTILE, "verdict": "fail\x1b[0m", "faults": "1/1"}])
    _assert_terminal_safe(table)
    rows = table.split("\n\n")[0]  # the legend follows after a blank line
    assert len(rows.splitlines()) == 3  # the newline in the name does not start a row of its own


def test_report_md_carries_no_raw_html_and_report_html_still_escapes(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    write_chaos(runs, "kill_idle", clients=())  # no client operations: nothing to plot, quick
    run = runs / "kill_idle" / STAMP
    record = json.loads((run / "run.json").read_text())
    record["name"] = record["scenario"]["name"] = HOSTILE
    record["reproduce"] = f"python -m chaos run `{HOSTILE}`"
    (run / "run.json").write_text(json.dumps(record))
    verdict = json.loads((run / "verdict.json").read_text())
    verdict["checks"][0]["summary"] = SUMMARY
    verdict["checks"][1]["summary"] = HOSTILE
    (run / "verdict.json").write_text(json.dumps(verdict))
    out = tmp_path / "out"

    assert reports_cli.main(["--runs", str(runs), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "<script" not in md and "<img" not in md and not re.search(r"(?<!\\)\]\(javascript:", md)
    assert not re.findall("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", md)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md and "\\x1b[31mred" in md  # shown, not dropped
    assert "a\\|b" in md  # a table cell holding | stays one cell
    page = (out / "report.html").read_text()
    assert "<script" not in page and "<img src=x" not in page and "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert not re.findall("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", page)
    [row] = csv.DictReader((out / "table1.csv").open())
    assert row["Scenario"].startswith("'=cmd|")  # a spreadsheet shows it, never runs it
    captured = capsys.readouterr()
    _assert_terminal_safe(captured.out + captured.err)


# -- the pytest plugin (plugins/pytest-dah): its own printable, the harness's rules ------------------------------

#: strings the plugin may be handed from a run directory, with each kind of character the rules escape
PLUGIN_HOSTILE = [HOSTILE, SUMMARY, "\x1b]8;;http://evil\x07link\x1b]8;;\x07", "\u202e\u2066\u2067\u2068\u2069\u061c",
                  "\u200e\u200f\u2028\u2029\x85\x9b\x7f", "lone \udc80 \ud800 surrogates", "\ufffe\uffff",
                  "tab\tnewline\nreturn\r", "plain ascii, a \\ backslash", "caf\u00e9 \u4e2d\u6587 \U0001f600"]


def test_the_plugins_printable_agrees_with_the_harness_on_every_character() -> None:
    from tests.test_pytest_plugin import plugin_runs

    plugin = plugin_runs().printable
    every = "".join(map(chr, range(0x110000)))
    assert plugin(every) == printable(every)
    assert plugin(every, keep="\n\t") == printable(every, keep="\n\t")
    for text in PLUGIN_HOSTILE:
        for keep in ("", "\n\t", "\t\n"):
            assert plugin(text, keep=keep) == printable(text, keep=keep), (text, keep)


def test_the_plugin_shows_run_data_escaped_in_its_failure_message_properties_and_summary(tmp_path: Path) -> None:
    """A pytest session with the plugin reads a run directory whose names, summaries and reproduce command are
    hostile (through the real ``chaos summary``): the failure message, the terminal summary and the JUnit properties
    show them escaped."""
    out = tmp_path / "runs"
    _hostile_run(out)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_hostile.py").write_text(f"""
from pathlib import Path
from pytest_dah.runs import ChaosResult, read_runs

def test_reads_a_hostile_run(chaos):
    out, harness = Path({str(out)!r}), chaos._harness()
    result = ChaosResult(command=["chaos"], cwd=Path.cwd(), exit_code=1, out=out, python=str(harness.python))
    result.runs, result.problem = read_runs(harness, out)
    chaos._record(result, True)
    result.assert_passed()
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAH_", "PYTEST_"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "plugins" / "pytest-dah" / "src")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_dah.plugin", "-p", "no:cacheprovider",
                           "--rootdir", str(project), f"--dah-python={sys.executable}",
                           f"--junitxml={project / 'junit.xml'}", "test_hostile.py"],
                          cwd=project, env=env, capture_output=True, text=True, errors="surrogateescape", timeout=300)
    shown = done.stdout + done.stderr
    assert done.returncode == 1 and "1 failed" in done.stdout, shown[-4000:]
    _assert_terminal_safe(shown)
    assert "chaos fail: " in shown and "\\x1b[31mred" in shown and "\\u202eevil" in shown, shown[-4000:]
    assert f"lost: fail: {printable(SUMMARY)}" in shown  # the failure message
    assert "chaos run(s) from 1 call(s): 1 fail" in shown and printable(HOSTILE)[:40] in shown  # the summary
    props = {p.get("name"): p.get("value") for p in ET.parse(project / "junit.xml").iter("property")}
    for name in ("chaos_run", "chaos_reproduce"):
        assert not RAW.findall(props[name]), (name, props[name])
    assert props["chaos_reproduce"].endswith(f"python -I -m chaos run {printable(HOSTILE)}"), props

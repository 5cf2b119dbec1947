"""Tables and lines a person reads explain themselves (issue 32): a legend under the tables whose columns need one,
no verdict said twice, the scenario list aligned, and piped input to ``dah demo`` shown as the session it was."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.suite import COLUMNS, LEGEND, scenario_list, table
from harness.printable import table as format_table
from harness.verdict import NOT_APPLICABLE, CheckResult
from migration_fuzz.fuzz import LEGEND as FUZZ_LEGEND, TABLE_COLUMNS

ROOT = Path(__file__).resolve().parent.parent


def test_the_verdict_table_has_a_legend_for_every_column_that_needs_one() -> None:
    text = table([{"scenario": "kill_idle", "faults": "1/2", "checked": "7/10", "verdict": "pass"}])
    rows, legend = text.split("\n\n")
    assert len(rows.splitlines()) == 3
    explained = " ".join(name for name, _ in LEGEND)
    for column, _ in COLUMNS:  # every column but the obvious ones is in the legend (by name or its family *_rec_s)
        if column not in ("scenario", "verdict"):
            assert column in explained or column.endswith("_rec_s"), column
    assert "checked       P/N: P of the N checks reached pass or fail" in legend
    assert all(name in " ".join(n for n, _ in FUZZ_LEGEND) for name, _ in TABLE_COLUMNS
               if name not in ("family", "iters", "mean s"))


def test_a_legend_follows_the_table_markdown_too() -> None:
    text = format_table([("a", 3), ("b", 3)], [[1, 2]], markdown=True, legend=[("b", "what b is")])
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | 2 |", "", "  b  what b is"]


def test_a_check_line_says_its_verdict_once() -> None:
    na = CheckResult("drain", NOT_APPLICABLE, "not applicable: no worker was drained in this run")
    assert na.shown() == "not_applicable: no worker was drained in this run"
    assert CheckResult("lost", "fail", "2 lost").shown() == "fail: 2 lost"


def test_the_scenario_list_is_aligned_past_its_longest_name() -> None:
    lines = scenario_list()
    starts = {len(line) - len(line.split("  ", 1)[1].lstrip()) for line in lines}
    longest = max(len(line.split()[0]) for line in lines)
    assert longest > 30 and starts == {longest + 2}, starts


def test_piped_input_to_the_demo_is_echoed_after_its_prompt(tmp_path: Path) -> None:
    """``printf 'hi\\n' | dah demo``: the transcript reads ``you> hi`` then ``agent> ...``, never ``you> agent>``."""
    done = subprocess.run([str(Path(sys.executable).parent / "dah"), "demo", "--no-ui", "--state-dir", str(tmp_path)],
                          input="hi\n", capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\nyou> hi\nagent> " in done.stdout and "you> agent>" not in done.stdout, done.stdout[-2000:]
    assert not re.search(r"^you> *$", done.stdout, re.M)  # no prompt left hanging (at the end of input)


def test_a_cell_wider_than_its_column_widens_the_column_and_every_row_stays_aligned() -> None:
    from harness.printable import table

    out = table([("scenario", 10), ("lost", 4), ("dup", 3, ">")], [["a", "0+1 bad", 1], ["b", 0, 22]]).splitlines()
    header, _, first, second = out
    assert header.index("dup") == first.index("  1") and second.rstrip().endswith("22")
    assert [len(x) for x in (header, first, second)] == [len(header)] * 3, out

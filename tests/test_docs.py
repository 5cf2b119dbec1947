"""The README and docs/ point at things that exist: files, anchors, make targets, subcommands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
MAKE = re.compile(r"\bmake((?:\s+[a-z][a-z0-9-]*)+)")
PYTHON_M = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*) ([a-z][\w-]*(?:\|[a-z][\w-]*)*)")
#: a console script ([project.scripts]) and a subcommand: ``dah-chaos check``, ``.venv/bin/dah run``
SCRIPT = re.compile(r"(?<![\w-])(dah(?:-chaos|-bench|-fuzz|-report)?) ([a-z][\w-]*(?:\|[a-z][\w-]*)*)")
#: bare ``python -m TOOL`` where a page shows a command: the system Python has none of the dependencies
BARE_TOOL = re.compile(r"(?<![/\w])python3? -m (chaos|benchmarks|migration_fuzz|reports|testbed)\b")


def code(text: str) -> list[str]:
    """The fenced blocks and inline code spans of a Markdown text: where commands are written."""
    blocks = FENCE.findall(text)
    return blocks + CODE_SPAN.findall(FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_relative_link_points_to_an_existing_file(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {rel(path)}")
    assert not broken, f"{rel(doc)}: " + "; ".join(broken)


def test_every_make_target_named_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
    missing = set()
    for doc in DOCS:
        for snippet in code(doc.read_text()):
            for m in MAKE.finditer(snippet):
                missing |= {f"{rel(doc)}: make {t}" for t in m.group(1).split() if t not in targets}
    assert not missing, sorted(missing)


def test_every_python_m_subcommand_named_exists() -> None:
    from harness.commands import SCRIPTS

    package = {script: pkg for pkg, script in SCRIPTS.items()}
    named: dict[str, set[tuple[str, str]]] = {}
    for doc in DOCS:
        for snippet in code(doc.read_text()):
            for m in PYTHON_M.finditer(snippet):
                for sub in m.group(2).split("|"):
                    named.setdefault(m.group(1), set()).add((sub, rel(doc)))
            for m in SCRIPT.finditer(snippet):
                for sub in m.group(2).split("|"):
                    named.setdefault(package[m.group(1)], set()).add((sub, rel(doc)))
    assert "chaos" in named and "testbed" in named  # the extraction works
    missing = []
    for module, subs in sorted(named.items()):
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                                cwd=ROOT, timeout=60)
        assert result.returncode == 0, f"python -m {module} --help: exit {result.returncode}: {result.stderr[-500:]}"
        for sub, where in sorted(subs):
            if not re.search(rf"(^\s+{re.escape(sub)}\s|[{{,]{re.escape(sub)}[,}}])", result.stdout, re.M):
                missing.append(f"{where}: python -m {module} {sub}")
    assert not missing, missing


# -- the quick commands, run as printed ----------------------------------------------------------------------------

#: what marks a fenced block whose every command the tests run (an HTML comment: the rendered page does not show it)
QUICK_MARK = "<!-- quick: tests/test_docs_commands.py runs these as printed -->"
QUICK_BLOCK = re.compile(r"^" + re.escape(QUICK_MARK) + r"\n```(?:bash|sh)\n(.*?)^```", re.M | re.S)
#: the run the docs re-check (``chaos check runs/kill_mid_turn/latest``): what step 1 of the README's tour leaves
SAVED_RUN = "kill_mid_turn"


def quick_commands() -> list[tuple[str, str]]:
    """(document, command) for every line of every block marked quick (comment lines left out)."""
    found = []
    for doc in DOCS:
        for block in QUICK_BLOCK.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((rel(doc), line.strip()))
    return found


def test_the_quick_blocks_are_found() -> None:
    commands = [c for _, c in quick_commands()]
    assert ".venv/bin/dah-chaos list                       # the named scenarios, and their twins on the other " \
           "engines" in commands and any(c.startswith(f".venv/bin/dah-chaos check runs/{SAVED_RUN}/latest")
                                         for c in commands), commands
    marked = sum(doc.read_text().count(QUICK_MARK) for doc in DOCS)
    assert marked == sum(1 for doc in DOCS for _ in QUICK_BLOCK.finditer(doc.read_text())), \
        f"a {QUICK_MARK} line must sit right above a ```bash fence"



#: every page a user reads commands from
PAGES = [*DOCS, *(ROOT / name for name in ("RUN_DIRECTORY.md", "MANUAL_TESTS.md", "SECURITY.md")),
         ROOT / "benchmarks" / "README.md", *sorted((ROOT / "examples").glob("*/README.md"))]
#: where a page names the ``python -m`` form on purpose: what each script is the same as, and why not to use it
ON_PURPOSE = ("the same as its `python -m` form", "`dah-fuzz` (`python -m migration_fuzz`)",
              "puts the working directory on Python's import path")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_shows_a_tool_as_a_bare_python_m(page: Path) -> None:
    """A bare ``python -m chaos ...`` fails as printed (the system Python has no temporalio): code shows the console
    script as it runs from the checkout (``.venv/bin/dah-chaos``), prose names it (``dah-chaos check``)."""
    bare = [f"{rel(page)}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if BARE_TOOL.search(line) and "-m pytest" not in line and not any(p in line for p in ON_PURPOSE)]
    assert not bare, bare

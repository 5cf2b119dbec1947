"""The figures issue 43 is judged on, for any tree: ``python tests/layout_report.py [TREE ...]``.

Standard library only, reading the files (it imports nothing of the tree), so one run measures an old checkout and
a new one side by side. Per tree:

* lines of code outside tests/ (Python, blank lines and comments left out);
* engine name lists: a literal tuple, list, set or dict holding two or more engine names;
* places outside the Temporal engine's folder that compare a value with ``"temporal"``;
* functions over 80 lines, and files over 600 lines;
* files that build a command-line parser (``add_argument``), and where they are;
* docs/chaos.md's length.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ENGINE_NAMES = {"temporal", "checkpoint", "dbos", "dbos-sqlite", "dbos-postgres", "restate", "plain"}
SKIP = ("tests/", "runs/", "examples/", ".venv", "build/", "node_modules", ".dah/")
TEMPORAL_HOME = ("testbed/engines/temporal/", "testbed/engines/temporal.py")


def code_lines(text: str) -> int:
    """Lines holding code (not blank, not only a comment); docstrings count as code."""
    lines = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                tokenize.DEDENT, tokenize.ENDMARKER):
                lines.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))
    return len(lines)


def _is_name_list(node: ast.AST) -> bool:
    """Two or more engine names among the values, or a dict keyed by engine names only (as tests/test_layout.py)."""
    values = node.values if isinstance(node, ast.Dict) else node.elts
    names = {n.value for n in values if isinstance(n, ast.Constant) and isinstance(n.value, str)} & ENGINE_NAMES
    keys = [n.value if isinstance(n, ast.Constant) else None for n in getattr(node, "keys", [])]
    return len(names) >= 2 or (len(keys) >= 2 and set(keys) <= ENGINE_NAMES)


def measure(tree: Path) -> dict:
    files = sorted(p for p in tree.rglob("*.py") if not any(s in p.relative_to(tree).as_posix() for s in SKIP))
    out = {"loc": 0, "name_lists": [], "temporal_compares": [], "long_functions": [], "long_files": [],
           "parsers": []}
    for path in files:
        rel = path.relative_to(tree).as_posix()
        text = path.read_text(errors="replace")
        out["loc"] += code_lines(text)
        n_lines = len(text.splitlines())
        if n_lines > 600:
            out["long_files"].append(f"{rel} ({n_lines})")
        try:
            module = ast.parse(text)
        except SyntaxError:
            continue
        if "add_argument(" in text:
            out["parsers"].append(rel)
        for node in ast.walk(module):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and _is_name_list(node):
                out["name_lists"].append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Compare) and not rel.startswith(TEMPORAL_HOME):
                operands = [node.left, *node.comparators]
                if any(isinstance(o, ast.Constant) and o.value == "temporal" for o in operands):
                    out["temporal_compares"].append(f"{rel}:{node.lineno}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    out["long_functions"].append(f"{rel}:{node.name} ({length})")
    chaos_md = tree / "docs" / "chaos.md"
    out["chaos_md_lines"] = len(chaos_md.read_text().splitlines()) if chaos_md.exists() else None
    return out


def main(argv: list[str]) -> int:
    trees = [Path(a) for a in argv] or [Path(__file__).resolve().parent.parent]
    results = {t: measure(t) for t in trees}
    rows = [("lines of code (not tests)", "loc"), ("engine name lists", "name_lists"),
            ("compares with \"temporal\" outside its engine", "temporal_compares"),
            ("functions over 80 lines", "long_functions"), ("files over 600 lines", "long_files"),
            ("files building a parser", "parsers"), ("docs/chaos.md lines", "chaos_md_lines")]
    width = max(len(label) for label, _ in rows)
    print(f"{'':<{width}}  " + "  ".join(f"{str(t):>24}" for t in trees))
    for label, key in rows:
        cells = [r[key] if not isinstance(r[key], list) else len(r[key]) for r in results.values()]
        print(f"{label:<{width}}  " + "  ".join(f"{str(c):>24}" for c in cells))
    for t, r in results.items():
        print(f"\n{t}:")
        for key in ("name_lists", "temporal_compares", "long_functions", "long_files", "parsers"):
            print(f"  {key}: {', '.join(r[key]) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

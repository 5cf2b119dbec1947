"""Hostile ``run_ptc`` programs: every attack found on the interpreter, kept as a corpus.

Each entry is a program an attacker (or a confused model) could send, with
what the hardened interpreter must do with it: finish (``ok``), or refuse it
with a model-visible ``PtcError`` of a given kind. ``tests/test_ptc_hardening.py``
runs the corpus under the time and memory budget; ``python -m benchmarks.ptc_hostile``
measures each program (time, memory, outcome) against any copy of the
interpreter, which is how the before/after table of the hardening was made.

The tools the corpus calls are ``echo(text=...)`` (returns its text) and
``write_file(path=..., content=...)``, which serialises its arguments the way
the workflow does (``json.dumps(..., sort_keys=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: the shared-structure preamble: three lists, each 10,000 elements, that reach 10^8 and 10^12 elements
_SHARED = "a=[0]*10000; b=[a]*10000; c=[b]*10000; e=a[:]; f=[e]*10000; d=[f]*10000\n"
_SHARED_T = "t=(0,)*10000; u=(t,)*10000; v=(u,)*10000\n"


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    expect: str  # "ok" or the PtcError kind: "limit", "runtime", "disallowed", "syntax", "tool"
    note: str = ""


HOSTILE: list[Hostile] = [
    Hostile("round_huge_ndigits", "round(5, -10**8)", "limit", "the builtin computed 10**(10**8) before any check"),
    Hostile("round_big_ndigits", "round(5, -10**7)", "limit"),
    Hostile("round_float_huge_ndigits", "round(1.5, 10**9)", "limit"),
    Hostile("shared_eq", _SHARED + "c==d", "limit", "one == walks 10^12 elements through shared lists"),
    Hostile("shared_ne", _SHARED + "c!=d", "limit"),
    Hostile("shared_lt", _SHARED + "c<d", "limit"),
    Hostile("shared_in", _SHARED + "c in [d]", "limit"),
    Hostile("shared_in_list", _SHARED + "b in [f, f, f]", "limit"),
    Hostile("shared_count", _SHARED + "[d, d].count(c)", "limit"),
    Hostile("shared_index", _SHARED + "[d, c].index(c)", "limit"),
    Hostile("shared_sorted", _SHARED + "sorted([c, d])", "limit"),
    Hostile("shared_min", _SHARED + "min(c, d)", "limit"),
    Hostile("shared_max", _SHARED + "max([c, d])", "limit"),
    Hostile("shared_sort_method", _SHARED + "x = [c, d]\nx.sort()", "limit"),
    Hostile("shared_tuple_hash_set", _SHARED_T + "{v}", "limit", "a tuple's hash is not cached: 10^12 element hashes"),
    Hostile("shared_tuple_hash_dict", _SHARED_T + "x = {}\nx[v] = 1", "limit"),
    Hostile("shared_tuple_hash_in", _SHARED_T + "v in {}", "limit"),
    Hostile("shared_tuple_keyerror", _SHARED_T + "x = {}\nx[u]", "limit"),
    Hostile("print_sep", "b=[[0]*10000]*10000\nprint(1, 2, sep=b)", "runtime",
            "sep was rendered outside the size estimate; now, as in Python, it must be a string"),
    Hostile("print_end", "b=[[0]*10000]*10000\nprint(1, end=b)", "runtime"),
    Hostile("print_sep_deeper", "b=[[[0]*10000]*10000]*10000\nprint(1, 2, sep=b)", "runtime", "ran out of memory"),
    Hostile("print_sep_long", "s='x'*900000\nprint(*[1]*5000, sep=s)", "limit", "a long sep counted in the estimate"),
    Hostile("str_shared", "b=[[0]*10000]*10000\nstr(b)", "limit"),
    Hostile("fstring_shared", "b=[[0]*10000]*10000\nf'{b!r}'", "limit"),
    Hostile("join_shared", "b=['x'*1000]*10000\n','.join(b)", "limit"),
    Hostile("tool_args_shared", "b=[[0]*10000]*10000\nawait write_file(path='x', content=b)", "limit",
            "json.dumps of the arguments took 5.5 s and 574 MB"),
    Hostile("tool_args_set", "await write_file(path='x', content={'a', 'b'})", "disallowed",
            "a set cannot be sent to a tool (not JSON)"),
    Hostile("float_in_range", "0.5 in range(10**18)", "limit", "a non-int needle scans the whole range"),
    Hostile("index_repr", _SHARED_T + "[1].index(v)", "runtime", "the ValueError text was the needle's whole repr"),
    Hostile("float_error_text", "float('x' * 900000)", "runtime", "the error text quotes the whole string"),
    Hostile("alloc_dicts", "l = []\nfor i in range(1000):\n    l.append(dict(zip(range(10000), range(10000))))",
            "limit", "memory: many 10,000-entry dicts"),
    Hostile("alloc_lists", "l = []\nfor i in range(1000):\n    l.append([i] * 10000)", "limit",
            "memory: many 10,000-element lists"),
    Hostile("alloc_sets", "l = []\nr = list(range(10000))\nfor i in range(1000):\n    l.append(set(r))", "limit",
            "memory: many 10,000-element sets"),
    Hostile("alloc_strings", "l = []\nfor i in range(500):\n    l.append('x' * 999 + str(i))\nlen(l)", "ok"),
    Hostile("deep_nesting_compare",
            "a = []\nb = []\nfor i in range(1000):\n    a = [a]\n    b = [b]\nfor i in range(1000):\n"
            "    a = [a]\n    b = [b]\na == b", "limit"),
    Hostile("cycle_compare", "a = [1]\na.append(a)\nb = [1]\nb.append(b)\na == b", "runtime"),
    Hostile("cycle_str", "a = [1]\na.append(a)\nstr(a)", "runtime", "a value that contains itself is not rendered"),
    Hostile("set_str_branch",
            "s = str({'alpha', 'beta', 'gamma', 'delta', 'eps'})\n"
            "if s[2] == 'a':\n    await echo(text='A')\nelse:\n    await echo(text='B')\ns", "ok",
            "str() of a set followed the hash seed: another worker took the other branch"),
    Hostile("builtin_str", "str(range) + str(min) + str(echo) + str(print)", "ok",
            "rendered with a memory address"),
    Hostile("set_result", "{'alpha', 'beta', 'gamma', 'delta'}", "ok"),
    Hostile("mixed_set_str", "str({1, 'a', 2.5, None, (1, 'b')})", "ok"),
    Hostile("split_many", "len(('a ' * 500000).split())", "limit"),
]

#: programs whose every observable (tool calls, printed text, result) must not depend on the hash seed
DETERMINISM = [h for h in HOSTILE if h.name in ("set_str_branch", "builtin_str", "set_result", "mixed_set_str")]

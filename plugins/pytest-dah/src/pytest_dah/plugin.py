"""pytest-dah: chaos runs of the durable-agent-harness as pytest tests (the ``pytest11`` entry point ``dah``).

    @pytest.mark.chaos("kill_mid_turn", seeds="1-3", target="chaos-target.toml")   # a test per seed
    def test_survives_kills(chaos_result): ...

    def test_soak(chaos):                       # or call the fixture: run, suite, soak
        result = chaos.run("crash_after_effect", seed=2)
        assert result.run.checks ...

A run whose verdict is not ``pass`` (``fail``, ``unknown``, an error, a run that never ended) fails the test,
its message naming each checker that did not pass, its summary, the run directory and the command that
reproduces it; the test's JUnit properties (``--junitxml``) carry the verdict and the run directories. The
harness runs in its own interpreter (``runs.py``): this plugin imports nothing of it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

import pytest

from pytest_dah.runs import (ENV_HOME, ENV_PYTHON, ChaosResult, Harness, HarnessNotFound, fresh_directory,
                             printable, run_chaos)

#: the options, each also an ini setting of the same name (without the dashes, ``-`` as ``_``)
_OPTIONS = [
    ("--dah-home", "DIR", f"the durable-agent-harness clone to run (its .venv/bin/python; default ${ENV_HOME})"),
    ("--dah-python", "PATH", f"the harness's interpreter, instead of --dah-home (default ${ENV_PYTHON})"),
    ("--chaos-target", "FILE", "the target file of the agent under test, for chaos tests that name none "
                               "(default: the harness's reference agent)"),
    ("--chaos-seeds", "SEEDS", "the seeds of chaos tests that name none, e.g. 1-5 or 1,4,9 (default 1)"),
    ("--chaos-runs-dir", "DIR", "where run directories go: DIR/<test>/<UTC stamp>/... (default: runs/ in the "
                                "rootdir)"),
    ("--chaos-timeout", "SECONDS", "stop a chaos command after this long (its runs end terminated, the test "
                                   "fails; default: no limit)"),
]
_RESULT = pytest.StashKey[List[ChaosResult]]()
#: every call of the session, and whether it judged its result (``check=False``: handed to the test only)
_SESSION = pytest.StashKey[List[Tuple[ChaosResult, bool]]]()
#: ``target=`` naming the harness's own agent, whatever --chaos-target says
REFERENCE = "reference"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dah", "chaos runs of the durable-agent-harness (pytest-dah)")
    for flag, metavar, text in _OPTIONS:
        group.addoption(flag, metavar=metavar, default=None, help=text)
        parser.addini(_ini_name(flag), text)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos(*scenarios, seeds=None, target=None, soak=False, suite=False, args=()): run these "
                   "chaos scenarios (one test per seed; soak=True: one soak over the seeds; suite=True: the whole "
                   "suite) and fail the test unless every run passes")


def _ini_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _setting(config: pytest.Config, flag: str) -> "tuple[Optional[str], Path, str]":
    """An option's value, where a relative path in it is relative to, and where it came from."""
    value = config.getoption(_ini_name(flag))
    if value:
        return str(value), Path(config.invocation_params.dir), flag
    value = config.getini(_ini_name(flag))
    base = config.inipath.parent if config.inipath else config.rootpath
    return (str(value) if value else None), Path(base), f"{_ini_name(flag)} (ini)"


def parse_seeds(text: Union[str, int, Sequence[int]]) -> List[int]:
    """``"1-3,7"`` -> [1, 2, 3, 7]; a ValueError naming what is wrong."""
    if isinstance(text, int):
        return [text]
    if not isinstance(text, str):
        return [int(s) for s in text]
    seeds: List[int] = []
    for part in text.replace(" ", "").split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise ValueError(f"seeds {text!r}: write seeds and ranges, e.g. 1-5 or 1,4,9")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def _arguments(args: Union[str, Sequence[str]]) -> List[str]:
    """More options for the harness's command: a list, or one string split as a shell would."""
    return shlex.split(args) if isinstance(args, str) else [str(a) for a in args]


class Chaos:
    """The ``chaos`` fixture: run a scenario, the suite or a soak through the harness, for one test."""

    def __init__(self, request: pytest.FixtureRequest, *, for_marker: bool = False) -> None:
        self._node = request.node
        self._config = request.config
        self._for_marker = for_marker  # its results are judged before the test's body (pytest_runtest_call)

    # -- what a test calls --------------------------------------------------------------------------------

    def run(self, *scenarios: str, seed: Optional[int] = None, seeds: Union[str, Sequence[int], None] = None,
            target: Union[str, Path, None] = None, args: Union[str, Sequence[str]] = (),
            check: bool = True) -> ChaosResult:
        """``python -m chaos run SCENARIO... --seed N`` for each seed (``seed``, else ``seeds``, else
        --chaos-seeds); fails the test unless every run passed (``check=False``: returns the result only)."""
        if not scenarios:
            raise ValueError("chaos.run: name a scenario (python -m chaos list shows them), or call chaos.suite()")
        chosen = [seed] if seed is not None else self.seeds(seeds)
        common = [*self._target_args(target), *_arguments(args)]
        return self._go([["run", *scenarios, "--seed", str(s), *common] for s in chosen], check)

    def suite(self, seeds: Union[str, Sequence[int], None] = None, target: Union[str, Path, None] = None,
              args: Union[str, Sequence[str]] = (), check: bool = True) -> ChaosResult:
        """``python -m chaos suite --seeds ...``: every named scenario on each seed."""
        spec = ",".join(map(str, self.seeds(seeds)))
        return self._go([["suite", "--seeds", spec, *self._target_args(target), *_arguments(args)]], check)

    def soak(self, scenario: str, seeds: Union[str, Sequence[int], None] = None,
             target: Union[str, Path, None] = None, args: Union[str, Sequence[str]] = (),
             check: bool = True) -> ChaosResult:
        """``python -m chaos soak SCENARIO --seeds ...``: one scenario over many seeds."""
        spec = ",".join(map(str, self.seeds(seeds)))
        return self._go([["soak", scenario, "--seeds", spec, *self._target_args(target), *_arguments(args)]], check)

    # -- settings -------------------------------------------------------------------------------------------

    def seeds(self, given: Union[str, Sequence[int], None] = None) -> List[int]:
        if given is not None:
            return parse_seeds(given)
        value, _, where = _setting(self._config, "--chaos-seeds")
        try:
            return parse_seeds(value or "1")
        except ValueError as exc:
            raise pytest.UsageError(f"{where}: {exc}") from None

    def target(self, given: Union[str, Path, None] = None) -> Optional[Path]:
        """The target file: ``given`` (relative to the rootdir), else --chaos-target; None, or ``given`` as
        ``"reference"``: the harness's reference agent."""
        if given == REFERENCE:
            return None
        if given is not None:
            path = Path(given)
            return path if path.is_absolute() else Path(self._config.rootpath) / path
        value, base, _ = _setting(self._config, "--chaos-target")
        return (base / value).absolute() if value else None

    def _target_args(self, given: Union[str, Path, None]) -> List[str]:
        target = self.target(given)
        if target is not None and not target.is_file():
            pytest.fail(printable(f"pytest-dah: target file {target}: not found"), pytrace=False)
        return ["--target", str(target)] if target is not None else []

    def _harness(self) -> Harness:
        python, python_base, python_from = _setting(self._config, "--dah-python")
        home, home_base, home_from = _setting(self._config, "--dah-home")
        if python and "/" in python:  # a path, not a command name: relative to where it was given
            python = str(python_base / Path(python).expanduser())
        try:
            return Harness.locate(python, str(home_base / Path(home).expanduser()) if home else None,
                                  python_from=python_from, home_from=home_from)
        except HarnessNotFound as exc:
            pytest.fail(printable(str(exc)), pytrace=False)
            raise  # pytest.fail raised already

    def _runs_dir(self) -> Path:
        value, base, _ = _setting(self._config, "--chaos-runs-dir")
        return (base / value).absolute() if value else Path(self._config.rootpath) / "runs"

    def _timeout(self) -> Optional[float]:
        value, _, where = _setting(self._config, "--chaos-timeout")
        try:
            return float(value) if value else None
        except ValueError:
            raise pytest.UsageError(f"{where} {value!r}: give seconds, e.g. 600") from None

    # -- running ----------------------------------------------------------------------------------------------

    def _go(self, commands: List[List[str]], check: bool) -> ChaosResult:
        harness = self._harness()
        module = getattr(self._node, "module", None)
        name = f"{module.__name__.rpartition('.')[2]}.{self._node.name}" if module else self._node.name
        out = fresh_directory(self._runs_dir(), name)
        result = run_chaos(harness, [[*c, "--out", str(out)] for c in commands], out, timeout_s=self._timeout())
        self._record(result, check or self._for_marker)
        if check and not result.passed:
            pytest.fail(result.describe(), pytrace=False)
        return result

    def _record(self, result: ChaosResult, judged: bool) -> None:
        """The result as the test's properties (JUnit ``<property>``, ``printable``), and for the session's summary
        line."""
        props = self._node.user_properties
        props += [("chaos_verdict", result.verdict), ("chaos_out", printable(result.out))]
        for r in result.runs:
            props.append(("chaos_run", printable(f"{r.scenario} seed {r.seed}: {r.verdict} ({r.status}) "
                                                 f"{r.run_dir or '-'}")))
            if not (r.passed or r.skipped) and r.reproduce:
                props.append(("chaos_reproduce", printable(result.runnable(r.reproduce))))
        self._config.stash.setdefault(_SESSION, []).append((result, judged))


@pytest.fixture
def chaos(request: pytest.FixtureRequest) -> Chaos:
    """Run chaos scenarios, the suite or a soak through the harness: ``chaos.run(...)``, ``chaos.suite(...)``,
    ``chaos.soak(...)``, each returning a ``ChaosResult`` (and failing the test unless it passed)."""
    return Chaos(request)


@pytest.fixture
def chaos_seed() -> Optional[int]:
    """The seed of a ``@pytest.mark.chaos`` test (its tests are parametrized over the seeds); None elsewhere."""
    return None


@pytest.fixture(autouse=True)
def _chaos_marker(request: pytest.FixtureRequest, chaos_seed: Optional[int]) -> None:
    """A ``@pytest.mark.chaos`` test's runs, before its body (which ``chaos_result`` hands them to)."""
    marker = request.node.get_closest_marker("chaos")
    if marker is None:
        return
    kw = dict(marker.kwargs)
    unknown = set(kw) - {"seeds", "target", "soak", "suite", "args"}
    if unknown:
        raise pytest.UsageError(f"{request.node.nodeid}: @pytest.mark.chaos has no {', '.join(sorted(unknown))}")
    runner = Chaos(request, for_marker=True)
    common = {"target": kw.get("target"), "args": kw.get("args", ()), "check": False}
    if kw.get("suite"):
        result = runner.suite(seeds=kw.get("seeds"), **common)
    elif kw.get("soak"):
        if len(marker.args) != 1:
            raise pytest.UsageError(f"{request.node.nodeid}: @pytest.mark.chaos(soak=True) takes one scenario")
        result = runner.soak(marker.args[0], seeds=kw.get("seeds"), **common)
    else:
        result = runner.run(*marker.args, seed=chaos_seed, **common)
    request.node.stash[_RESULT] = [result]


@pytest.fixture
def chaos_result(request: pytest.FixtureRequest, _chaos_marker: None) -> ChaosResult:
    """The ``ChaosResult`` of this test's ``@pytest.mark.chaos`` runs (the test reaches its body only if they
    passed)."""
    results = request.node.stash.get(_RESULT, None)
    if not results:
        raise pytest.UsageError(f"{request.node.nodeid}: chaos_result needs a @pytest.mark.chaos(...) marker")
    return results[0]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``@pytest.mark.chaos`` test of named scenarios: one test per seed (``[seed3]``)."""
    marker = metafunc.definition.get_closest_marker("chaos")
    if marker is None or marker.kwargs.get("soak") or marker.kwargs.get("suite") or "chaos_seed" not in \
            metafunc.fixturenames:
        return
    if not marker.args:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.chaos needs a scenario name "
                                "(or suite=True)")
    given = marker.kwargs.get("seeds")
    value, _, where = _setting(metafunc.config, "--chaos-seeds")
    try:
        seeds = parse_seeds(given if given is not None else (value or "1"))
    except ValueError as exc:
        raise pytest.UsageError(f"{metafunc.definition.nodeid if given is not None else where}: {exc}") from None
    metafunc.parametrize("chaos_seed", seeds, ids=[f"seed{s}" for s in seeds])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A ``@pytest.mark.chaos`` test whose runs did not all pass fails here, before its body runs."""
    for result in item.stash.get(_RESULT, None) or []:
        if not result.passed:
            pytest.fail(result.describe(), pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line per chaos run of the session: its verdict and run directory."""
    calls = config.stash.get(_SESSION, None) or []
    if not calls:
        return
    counts: dict = {}
    for res, _ in calls:
        for r in res.runs:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tally = printable(", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no runs read")
    unjudged = sum(1 for _, judged in calls if not judged)
    terminalreporter.write_sep("-", "chaos (pytest-dah)")
    terminalreporter.write_line(f"{sum(counts.values())} chaos run(s) from {len(calls)} call(s): {tally}"
                                + (f"; {unjudged} call(s) with check=False: the test judged the result"
                                   if unjudged else ""))
    for res, judged in calls:
        for r in res.runs:
            note = "" if judged else " (check=False)"
            terminalreporter.write_line(printable(f"  {r.scenario} seed {r.seed}: {r.verdict}{note}  "
                                                  f"{r.run_dir or res.out}"))

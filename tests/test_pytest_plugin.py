"""The pytest plugin (plugins/pytest-dah), as a user has it: installed into a virtual environment of its own with
nothing but pytest, run from a copy of the example agent's project outside this tree, against the real harness.

A passing scenario passes the test; the same scenario on the example agent with a planted bug fails it, the
message naming the checkers that caught it and the command that reproduces the run, and the JUnit file carries
both verdicts. Run where pytest runs (only ``--dah-python`` given), the harness never imports a folder of the
user's project named like one of its packages.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import venv
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from harness.commands import tool

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "plugins" / "pytest-dah"
EXAMPLE = ROOT / "examples" / "third_party_agent"


def plugin_runs() -> ModuleType:
    """The plugin's ``pytest_dah.runs`` (standard library only) from its source in this tree: the harness's own
    environment does not install the plugin."""
    spec = importlib.util.spec_from_file_location("pytest_dah_runs_from_source",
                                                  PLUGIN / "src" / "pytest_dah" / "runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _plant(project: Path, marker: Path) -> None:
    """Folders of a user's project named like the harness's packages, each noting in ``marker`` if imported."""
    for package in ("chaos", "agent", "harness", "testbed"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('{package}\\n')\n")
    (project / "chaos" / "__main__.py").write_text(f"open({str(marker)!r}, 'a').write('chaos.__main__\\n')\n")


def test_a_chaos_folder_where_pytest_runs_is_not_the_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only --dah-python: the harness runs where pytest runs, a project with a chaos/ of its own.
    runs = plugin_runs()
    project, marker = tmp_path / "project", tmp_path / "imported.txt"
    _plant(project, marker)
    monkeypatch.chdir(project)
    monkeypatch.delenv("DAH_HOME", raising=False)
    monkeypatch.delenv("DAH_PYTHON", raising=False)
    harness = runs.Harness.locate(python=sys.executable)
    assert harness.cwd() == project
    out = project / "runs" / "call"
    out.mkdir(parents=True)
    result = runs.run_chaos(harness, [["run", "no_such_scenario", "--out", str(out)]], out, stdout=io.StringIO(),
                            stderr=io.StringIO())
    assert not marker.exists(), f"the harness imported the project's own folders: {marker.read_text()}"
    said = "\n".join(result.stderr_tail)
    assert result.exit_code == 2 and "unknown scenario 'no_such_scenario'" in said, (result.exit_code, said)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_chaos_run_where_pytest_runs_imports_none_of_the_projects_folders(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness's own processes (workers, the fork server, the reaper) run there too: none imports them either.
    runs = plugin_runs()
    project, marker = tmp_path / "project", tmp_path / "imported.txt"
    _plant(project, marker)
    monkeypatch.chdir(project)
    monkeypatch.delenv("DAH_HOME", raising=False)
    harness = runs.Harness.locate(python=sys.executable)
    out = project / "runs" / "call"
    out.mkdir(parents=True)
    result = runs.run_chaos(harness, [["run", "kill_idle", "--seed", "1", "--out", str(out)]], out,
                            stdout=io.StringIO(), stderr=io.StringIO())
    assert not marker.exists(), f"a process of the run imported the project's own folders: {marker.read_text()}"
    assert result.passed, result.describe()


def test_the_plugin_imports_only_the_standard_library_and_pytest() -> None:
    # It runs in the user's environment, with the user's pins: nothing of the harness may come with it.
    found = set()
    for path in (PLUGIN / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.add((node.module or "").split(".")[0])
    assert found - set(sys.stdlib_module_names) == {"pytest", "pytest_dah"}, found


@pytest.fixture(scope="module")
def users_pytest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with only pytest and the plugin (from the package index and a copy of
    plugins/pytest-dah, so the build leaves nothing in this tree), as a user's test environment."""
    base = tmp_path_factory.mktemp("users-venv")
    source = shutil.copytree(PLUGIN, base / "pytest-dah", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    env = base / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    out = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "pytest", str(source)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = subprocess.run([str(env / "bin" / "python"), "-c", "import temporalio"], capture_output=True)
    assert probe.returncode != 0  # the harness's dependencies stayed out
    return env / "bin" / "pytest"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The example agent's project, copied out of this tree (its target files, tests and pytest.ini)."""
    return shutil.copytree(EXAMPLE, tmp_path / "calc-agent", ignore=shutil.ignore_patterns(".venv", "runs",
                                                                                          "__pycache__"))


def users_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAH_", "PYTEST_", "PYTHON"))
           and k != "VIRTUAL_ENV"}
    return {**env, **extra}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_the_harness_a_chaos_test_errors_in_one_line_saying_what_to_set(users_pytest: Path,
                                                                               project: Path) -> None:
    out = subprocess.run([str(users_pytest), "-p", "no:cacheprovider", "-k", "writing_them", "-rE"], cwd=project,
                         env=users_environment(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "pytest-dah: where is the harness? Set DAH_HOME" in out.stdout, out.stdout[-3000:]
    assert "1 error" in out.stdout and not (project / "runs").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_from_a_users_project_a_passing_run_passes_and_a_planted_bug_fails_with_its_reproduce_command(
        users_pytest: Path, project: Path) -> None:
    # Two pytest sessions at once, as two CI jobs would: the passing test, and the planted bug's.
    env = users_environment(DAH_HOME=str(ROOT), DAH_PYTHON=sys.executable)
    sessions = {}
    for name, selected in (("pass", "writing_them"), ("fail", "fails_this_test")):
        log = (project / f"{name}.log").open("w")
        sessions[name] = (subprocess.Popen([str(users_pytest), "-p", "no:cacheprovider", "-m", "", "-k", selected,
                                            f"--junitxml={project / name}.xml"], cwd=project, env=env, stdout=log,
                                           stderr=subprocess.STDOUT), log)
    try:
        for proc, _ in sessions.values():
            proc.wait(timeout=540)
    finally:  # a session still running (the timeout): stopped as Ctrl-C stops it, its runs end interrupted
        for proc, log in sessions.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
            log.close()
    said = {name: (project / f"{name}.log").read_text() for name in sessions}
    assert sessions["pass"][0].returncode == 0 and "1 passed" in said["pass"], said["pass"][-6000:]
    # 1: the test ran and failed (not a usage error, 4, nor an internal one, 3)
    assert sessions["fail"][0].returncode == 1 and "1 failed" in said["fail"], said["fail"][-6000:]
    # The planted bug's message: the checkers that caught it, with their summaries, and a reproduce command that
    # runs as printed (the harness's interpreter, in the harness, the copied target file).
    out = said["fail"]
    assert "chaos fail: crash_after_effect seed 1 fail" in out, out[-6000:]
    assert "effects: fail: " in out and "applied more than once" in out, out[-6000:]
    reproduce = next(line.split("reproduce: ", 1)[1] for line in out.splitlines() if "reproduce: " in line)
    assert reproduce == (f"cd {ROOT} && {tool('chaos', cwd=ROOT)} run crash_after_effect --seed 1 "
                         f"--target {project}/chaos-target-planted-bug.toml"), reproduce
    # The JUnit files: a passing testcase and a failing one, each with its verdict and run directory.
    passing = next(ET.parse(project / "pass.xml").iter("testcase"))
    failing = next(ET.parse(project / "fail.xml").iter("testcase"))
    assert passing.get("name") == "test_notes_land_once_when_workers_crash_after_writing_them[seed1]"
    props = {name: {p.get("name"): p.get("value") for p in case.iter("property")}
             for name, case in (("pass", passing), ("fail", failing))}
    assert passing.find("failure") is None and props["pass"]["chaos_verdict"] == "pass", props
    assert failing.find("failure") is not None and props["fail"]["chaos_verdict"] == "fail", props
    assert "reproduce: cd " in failing.find("failure").text and props["fail"]["chaos_reproduce"] == reproduce
    # Each run directory is the run's own, under the project's runs/, and its verdict.json says what the test did.
    for verdict, run in (("pass", props["pass"]["chaos_run"]), ("fail", props["fail"]["chaos_run"])):
        run_dir = Path(run.rsplit(" ", 1)[1])
        assert run_dir.is_relative_to(project / "runs") and (run_dir / "verdict.json").is_file(), run
        assert json.loads((run_dir / "verdict.json").read_text())["verdict"] == verdict, run


def test_the_ci_example_runs_the_agents_own_tests_with_only_pytest_and_the_plugin() -> None:
    import yaml

    job = yaml.safe_load((ROOT / "examples" / "ci" / "github-actions.yml").read_text())["jobs"]["pytest-plugin"]
    steps = "\n".join(str(step.get("run", "")) for step in job["steps"])
    assert 'pip" install pytest ./plugins/pytest-dah' in steps and "cp -r examples/third_party_agent" in steps
    assert "-m planted_bug" in steps and 'test "$status" -eq 1' in steps  # the planted bug must fail its test
    assert any(step.get("env", {}).get("DAH_HOME") == "${{ github.workspace }}" for step in job["steps"])

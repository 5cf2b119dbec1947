"""Strict configuration: a mistake in a target file, an agent config file or a ``DAH_*`` variable is one line
naming where, the field, the value and what is allowed, exit 2, no traceback, never a silent coercion; and a
worker is started by its own ready line, or fails at once with its log's path and last lines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.env_options import EnvOptionError, check_environment, option
from testbed.engines.byo.engine import OwnAgentOnTemporal
from chaos.scenarios import SCENARIOS
from testbed.engines.byo.target import load_target
from harness.faults import NO_FAULTS
from harness.rundir import RunDir
from harness.commands import tool
from testbed.stack import Endpoints
from testbed.worker_process import WorkerProcess, WorkerStartError
from tests.events import HANG_S

WORKER = 'worker = ["{python}", "-m", "x.worker", "--address", "{address}", "--task-queue", "{task_queue}"]\n'
GOOD = WORKER + 'name = "x"\ndriver = "x.driver:make_driver"\nworkflow = "x.app:Flow"\n'


def run(*args: str, env: dict[str, str] | None = None, timeout: float = HANG_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def assert_one_line_usage_error(out: subprocess.CompletedProcess[str], expected: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert expected in out.stderr, out.stderr


@pytest.mark.parametrize("text, expected", [
    (GOOD + 'checkers = "lost"\n', "'checkers' must be a non-empty list of checker names, each one of lost, "
                                   "late, replies, context, temporal_history"),
    (GOOD + 'checkers = ["lost", "effectz"]\n', "'checkers[1]' must be 'lost', 'late', 'replies', 'context', "
                                                 "'temporal_history'"),
    (GOOD + 'env = "FOO=1"\n', "'env' must be a table of NAME = \"value\" lines ([env] section), each value a "
                               "string, got 'FOO=1'"),
    (GOOD + '[env]\nFOO = 1\n', "'env.FOO' must be a valid string, got 1"),
    (GOOD + 'ready_line = ["x"]\n', "'ready_line' must be a non-empty string (what a worker prints once it polls; "
                                    "unset: the server lists it polling), got ['x']"),
    (GOOD.replace('name = "x"', "name = 5"), "'name' must be a non-empty string, got 5"),
    (GOOD + 'checker = ["lost"]\n', "unknown field 'checker'; allowed fields: name, python, worker"),
    (GOOD + 'ready_timeout_s = "5"\n', "'ready_timeout_s' must be a finite number of seconds > 0, got '5'"),
], ids=["checkers-a-string", "unknown-checker", "env-a-string", "env-value-a-number", "ready-line-a-list",
        "name-a-number", "unknown-field", "timeout-a-string"])
def test_a_bad_target_file_is_one_line_and_exit_2(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "target.toml"
    path.write_text(text)
    out = run("chaos", "run", "kill_mid_turn", "--target", str(path), "--out", str(tmp_path / "runs"))
    assert_one_line_usage_error(out, f"{tool('chaos')} run: target file {path}: {expected}")
    assert not (tmp_path / "runs").exists()  # refused before anything started


def test_target_values_are_never_coerced_and_secrets_stay_out_of_the_record(tmp_path: Path) -> None:
    path = tmp_path / "target.toml"
    path.write_text(GOOD + 'ready_timeout_s = 5\n[env]\nMODE = "fast"\nMY_API_KEY = "sk-do-not-print-1234"\n')
    t = load_target(path)
    assert (t.ready_timeout_s, t.env) == (5.0, {"MODE": "fast", "MY_API_KEY": "sk-do-not-print-1234"})
    assert t.as_dict()["env"] == {"MODE": "fast", "MY_API_KEY": "(redacted)"}
    path.write_text(GOOD + '[env]\nMY_API_KEY = 12345678\n')
    with pytest.raises(ValueError, match=r"'env.MY_API_KEY' must be a valid string, got \(hidden\)$"):
        load_target(path)


@pytest.mark.parametrize("text, expected", [
    ('max_steps_per_turn: "5"\n', "'max_steps_per_turn' must be a positive integer, got '5'"),
    ("local_model: 'yes'\n", "'local_model' must be true or false (model calls as local activities), got 'yes'"),
    ("tools: [calculator, rm]\n", "'tools' names unknown tool(s) rm; use a set"),
    ("modle: scripted\n", "unknown key 'modle'; allowed keys: model, tools"),
], ids=["int-as-string", "bool-as-string", "unknown-tool", "unknown-key"])
def test_a_bad_agent_config_file_is_one_line_and_exit_2(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    out = run("testbed", "run", "--config", str(path), "hello")
    assert_one_line_usage_error(out, f"dah run: error: {path}: {expected}")


@pytest.mark.parametrize("variable, value, expected", [
    ("DAH_FORKSERVER", "no", "'DAH_FORKSERVER' must be 0 or 1, got 'no'"),
    ("DAH_STALE_CHECK", "false", "'DAH_STALE_CHECK' must be 0 or 1, got 'false'"),
    ("DAH_TEMPORAL_BIN", "/no/such/temporal", "'DAH_TEMPORAL_BIN' must be the path of an executable file"),
    ("DAH_CRASH_AT", "after_effect,sometime", "'DAH_CRASH_AT' has unknown name(s) sometime; allowed, "
                                              "comma-separated: after_model_call, after_effect"),
    ("DOCKER_HOST", "/var/run/docker.sock", "'DOCKER_HOST' must be a URL starting with one of unix://"),
])
def test_a_bad_environment_variable_is_refused_naming_it(variable: str, value: str, expected: str) -> None:
    with pytest.raises(EnvOptionError) as exc:
        check_environment({variable: value})
    assert str(exc.value) == f"environment: {expected}" or str(exc.value).startswith(f"environment: {expected}")
    with pytest.raises(EnvOptionError):
        option(variable, {variable: value})
    assert option(variable, {variable: ""}) == option(variable, {})  # empty is unset


def test_every_command_line_refuses_a_bad_variable_before_starting(tmp_path: Path) -> None:
    env = {"DAH_FORKSERVER": "off"}
    assert_one_line_usage_error(run("testbed", "worker", "--state-dir", str(tmp_path), env=env),
                                "dah worker: error: environment: 'DAH_FORKSERVER' must be 0 or 1, got 'off'")
    assert_one_line_usage_error(run("chaos", "list", env=env),
                                f"{tool('chaos')}: environment: 'DAH_FORKSERVER' must be 0 or 1, got 'off'")


def test_good_variables_are_read() -> None:
    assert check_environment({"DAH_FORKSERVER": "0", "DAH_CRASH_AT": "after_effect", "DOCKER_HOST": "tcp://h:2375"})
    assert option("DAH_STALE_CHECK", {}) == "1" and option("DAH_STALE_CHECK", {"DAH_STALE_CHECK": "0"}) == "0"


# -- starting workers ------------------------------------------------------------------------------------------

def worker(tmp_path: Path, code: str, ready_line: str, start_timeout_s: float = 20.0) -> WorkerProcess:
    return WorkerProcess(("{python}", "-c", code), {}, identity_prefix="w", ready_line=ready_line,
                         log_dir=tmp_path / "logs", start_timeout_s=start_timeout_s)


def test_a_worker_is_started_by_the_ready_line_its_target_declares(tmp_path: Path) -> None:
    path = tmp_path / "target.toml"
    path.write_text(GOOD + 'ready_line = "CALC-UP"\nready_timeout_s = 3\n')
    t = load_target(path)
    says = "import time; print('READY? not yet', flush=True); time.sleep(0.3); print('CALC-UP on q', flush=True); "
    # The chaos backend hands the target's line and timeout to every worker it makes.
    made = OwnAgentOnTemporal(target=t)._process("w1", Endpoints("127.0.0.1:1", "default", "http://m/v1"), "q",
                                                 NO_FAULTS, RunDir(tmp_path), SCENARIOS["kill_mid_turn"])
    assert (made.ready_line, made.start_timeout_s) == ("CALC-UP", 3.0)
    w = worker(tmp_path, says + "time.sleep(60)", t.ready_line, HANG_S)  # the line decides, however slow the start
    try:
        w.start()
        assert w.alive and "CALC-UP on q" in w.output()
    finally:
        w.kill()
    # The default line is not the target's: a worker printing only READY has not started.
    w = worker(tmp_path, "import time; print('READY', flush=True); time.sleep(60)", t.ready_line, t.ready_timeout_s)
    with pytest.raises(WorkerStartError, match=r"did not print 'CALC-UP' within 3 s \(log .*w-1\.log\):\nREADY$"):
        w.start()
    assert not w.alive


def test_a_worker_that_crashes_at_start_fails_at_once_with_its_log(tmp_path: Path) -> None:
    code = ("import sys\nfor i in range(30): print(f'import step {i}')\n"
            "print('my_agent: cannot load settings.toml', file=sys.stderr)\nsys.exit(3)")
    w = worker(tmp_path, code, "READY", start_timeout_s=3600)
    started = time.monotonic()
    with pytest.raises(WorkerStartError) as exc:
        w.start()
    assert time.monotonic() - started < HANG_S, "a crashed worker must not wait out its start timeout (1 h)"
    first, *tail = str(exc.value).splitlines()
    assert first == f"worker w-1 exited with 3 before printing 'READY' (log {tmp_path / 'logs' / 'w-1.log'}):"
    assert tail[-1] == "my_agent: cannot load settings.toml" and len(tail) == 12 and tail[0] == "import step 19"


def test_chaos_run_with_a_target_whose_worker_crashes_names_its_log(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text("import sys\nprint('crash-worker: no licence key', file=sys.stderr)\n"
                                       "sys.exit(4)\n")
    path = tmp_path / "target.toml"
    path.write_text(GOOD.replace('"-m", "x.worker"', '"crash.py"') + 'ready_line = "UP"\nready_timeout_s = 3600\n')
    (tmp_path / "x").mkdir()  # a driver that fits the driver API: the target loads, its worker is what fails
    (tmp_path / "x" / "__init__.py").write_text("")
    (tmp_path / "x" / "driver.py").write_text("def make_driver(*, client, history, task_queue, workload, seed):\n"
                                              "    raise NotImplementedError\n")
    started = time.monotonic()
    out = run("chaos", "run", "kill_mid_turn", "--target", str(path), "--out", str(tmp_path / "runs"))
    assert time.monotonic() - started < HANG_S, "a crashed worker must not wait out its ready timeout (1 h)"
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "WorkerStartError: worker w1-1 exited with 4 before printing 'UP' (log " in out.stdout
    assert "logs/w1-1.log" in out.stdout and "| crash-worker: no licence key" in out.stderr, out.stderr  # the log tail: progress


def test_dah_worker_that_cannot_start_says_why_in_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    out = run("testbed", "worker", "--state-dir", str(blocked / "state"), "--address", "127.0.0.1:1")
    assert_one_line_usage_error(out, f"dah worker: error: cannot start the worker: {blocked / 'state'}")
    assert "give a writable --state-dir" in out.stderr and "Temporal" not in out.stderr


def test_strict_replay_declarations_reach_the_replayer_and_run_json(tmp_path: Path) -> None:
    """``strict_replay`` / ``strict_replay_ignore`` in a target file reach what replay runs (``replay_target``)
    and what run.json records; a string where a boolean belongs is one line."""
    from chaos.replay_target import replay_target
    from testbed.engines.byo.target import load_target

    path = tmp_path / "t.toml"
    base = ('name = "t"\nworker = ["w", "{address}", "{task_queue}"]\ndriver = "d:make"\nworkflow = "m:W"\n')
    path.write_text(base + 'strict_replay = false\nstrict_replay_ignore = ["$.messages[*].timestamp"]\n')
    target = load_target(path)
    replay = replay_target(tmp_path, {"workflow": "m:W"}, target)
    assert not isinstance(replay, str)
    assert replay.strict_replay is False and replay.strict_replay_ignore == ("$.messages[*].timestamp",)
    assert target.as_dict()["strict_replay"] is False
    assert "strict_replay" not in load_target(_write(tmp_path / "u.toml", base)).as_dict()  # default: as before
    path.write_text(base + 'strict_replay = "no"\n')
    with pytest.raises(ValueError) as exc:
        load_target(path)
    assert "strict_replay" in str(exc.value) and "\n" not in str(exc.value), exc.value


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path

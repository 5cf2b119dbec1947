"""The command line as a user runs it: real subprocesses, real servers, and
nothing left running afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from testbed.engines.temporal.connection import TemporalConnection
from testbed.stack import Stack
from testbed.walkthroughs import WALKTHROUGHS
from testbed.worker_process import reference_worker
from tests.conftest import temporal_server_pids
from tests.events import HANG_S, running, wait_for

ROOT = Path(__file__).resolve().parent.parent


def dah(*args: str, stdin: str | None = None, timeout: float = 120, cwd: Path = ROOT,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})


def _descendants_gone(before: set[int]) -> None:
    assert temporal_server_pids() <= before, "a temporal server was left running"


def test_run_prints_the_answer_the_workflow_id_and_the_history(tmp_path: Path) -> None:
    before = temporal_server_pids()
    out = dah("run", "What is 25 * 4?", "--state-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^answer: +25 \* 4 = 100$", out.stdout, re.M)
    workflow_id = re.search(r"^workflow id: +(run-\w+)$", out.stdout, re.M).group(1)
    activity_lines = [line for line in out.stdout.splitlines() if re.search(r"[├└]─ #\d+", line)]
    kinds = ["calculator" if "calculator(" in line else "plan" if "plan_next_action" in line else line
             for line in activity_lines]
    assert kinds == ["plan", "calculator", "plan"]
    assert workflow_id in out.stdout.split("answer:")[1]
    _descendants_gone(before)


def test_demo_answers_and_exits_cleanly_on_quit(tmp_path: Path) -> None:
    before = temporal_server_pids()
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "demo", "--state-dir", str(tmp_path)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    try:
        # Watch the process tree while it runs, to check afterwards that all of it is gone.
        while not children:
            children = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        out, err = proc.communicate("What is 25 * 4?\n/walkthrough terminal\nquit\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "agent> 25 * 4 = 100" in out
    assert re.search(r"Web UI: +http://127\.0\.0\.1:\d+", out)
    assert "calculator({\"expression\": \"25 * 4\"})" in out
    assert "checks: reply, history shape, subagents, workspace files, effect ledger: all as expected" in out
    assert "stopped." in out
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    _descendants_gone(before)


@pytest.mark.slow
def test_run_all_scenarios_from_the_command_line(tmp_path: Path) -> None:
    out = dah("run", "--walkthrough", "all", "--state-dir", str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("all as expected ✓") == len(WALKTHROUGHS)
    assert "✗" not in out.stdout


def test_chat_against_a_separate_worker_process(stack: Stack, tmp_path: Path) -> None:
    task_queue = f"chat-{uuid.uuid4().hex[:8]}"
    with reference_worker(stack.server.address, task_queue, stack.model_server.url, state_dir=tmp_path):
        out = dah("chat", "--address", stack.server.address, "--task-queue", task_queue,
                  stdin="What is 6 * 7?\nwrite hi to a.txt\n/status\nquit\n")
    assert out.returncode == 0, out.stderr
    assert "agent> 6 * 7 = 42" in out.stdout
    assert "agent> wrote 2 bytes to a.txt" in out.stdout
    assert "'turns': 2" in out.stdout
    assert "conversation ended after 2 turns" in out.stdout


@pytest.mark.parametrize("command", ["demo", "run", "worker", "chat", "server", "walkthroughs", "model-server"])
def test_every_command_has_help(command: str) -> None:
    out = dah(command, "--help", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["run", "hi", "--model", "scripted:nope"], "no scripted scenario 'nope'"),
    (["run", "hi", "--tools", "calculator,rm"], "unknown tool(s) rm"),
    (["run", "hi", "--model-latency", "gaussian:1"], "--model-latency: bad latency spec 'gaussian:1'"),
    (["run", "hi", "--fault", "explode"], "--fault"),
    (["run", "hi", "--max-steps", "0"], "--max-steps 0: must be greater than 0"),
    (["run", "--walkthrough", "nope"], "unknown walkthrough nope"),
    (["run", "hi", "--model", "openai/gpt-4o-mini"], "needs OPENAI_API_KEY"),
    (["worker", "--address", "127.0.0.1:1", "--bug", "rm"], "--bug rm: not a tool"),
])
def test_bad_input_is_refused_with_a_message_naming_it(tmp_path: Path, args: list[str], message: str) -> None:
    env = {"OPENAI_API_KEY": ""}  # set but empty counts as missing
    out = dah(*args, "--state-dir", str(tmp_path), env=env, cwd=tmp_path, timeout=60) if args[0] == "run" else \
        dah(*args, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr


def test_worker_reports_an_unreachable_server(tmp_path: Path) -> None:
    out = dah("worker", "--address", "127.0.0.1:1", "--state-dir", str(tmp_path), timeout=120)
    assert out.returncode == 2
    assert "cannot reach Temporal at 127.0.0.1:1" in out.stderr


def test_configuration_dumps_redact_secrets() -> None:
    conn = TemporalConnection(address="x.tmprl.cloud:7233", api_key="sk-very-secret", tls_key_path="/k.pem")
    dumped = f"{conn!r} {conn.redacted()}"
    assert "sk-very-secret" not in dumped and "/k.pem" not in dumped
    assert conn.redacted()["api_key"] == "<redacted>" and conn.redacted()["tls"] is True


@pytest.mark.slow
def test_ctrl_c_in_the_demo_stops_everything_it_started(tmp_path: Path) -> None:
    import signal

    out_path = tmp_path / "demo.out"
    with open(out_path, "w") as out:
        # SIG_DFL: a test run started as a background job inherits SIGINT ignored, as would the demo.
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "demo", "--state-dir", str(tmp_path)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # what it prints, as it prints it
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # its commands, printed as it starts reading lines (from a pipe it prompts nothing: no "you>" until a line)
        wait_for(lambda: "quit              stop everything and exit" in out_path.read_text(),
                 "the demo's list of commands", proc=proc, log=out_path)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the demo should have started a temporal server"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=HANG_S) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "everything this command started has been stopped" in out_path.read_text()
    # stopped: a process killed a moment ago may not have been reaped yet; the server would have served on
    wait_for(lambda: not [p for p in children if running(p)], "the end of the demo's Temporal server", limit_s=60)


def test_a_hung_clean_up_after_ctrl_c_is_cut_short_by_the_watchdog(tmp_path: Path) -> None:
    import signal

    script = tmp_path / "hang.py"
    script.write_text(
        "import asyncio, subprocess, time\n"
        "import testbed.processes as processes\n"
        "processes.INTERRUPT_GRACE_S = 1.0\n"
        "async def stubborn():\n"
        "    child = subprocess.Popen(['sleep', '300'])\n"
        "    print('child', child.pid, flush=True)\n"
        "    try:\n"
        "        await asyncio.sleep(100)\n"
        "    except asyncio.CancelledError:\n"
        "        time.sleep(100)  # a clean-up that never finishes\n"
        "asyncio.run(processes.with_interrupt_watchdog(stubborn()))\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        child = psutil.Process(int(proc.stdout.readline().split()[1]))
        proc.send_signal(signal.SIGINT)
        out = proc.stdout.read()  # to its end: the command and its child (which shares the pipe) have exited
        assert proc.wait(timeout=HANG_S) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "thread stacks follow" in out and "everything this command started has been stopped" in out
    # killed by the watchdog: a child SIGKILLed a moment ago may not have been reaped yet, but its 300 s never ran out
    wait_for(lambda: not running(child), f"the end of the child sleep {child.pid} the watchdog killed", limit_s=60)


async def test_the_sticky_timeout_reaches_the_worker_and_a_bad_one_is_refused(stack: Stack, tmp_path: Path) -> None:
    from agent.worker import WorkerSettings, build_worker
    from harness.recording import EffectLedger

    settings = WorkerSettings.in_state_dir(tmp_path, task_queue=f"sticky-{uuid.uuid4().hex[:6]}", sticky_timeout_s=1.5)
    worker = build_worker(stack.client, settings, EffectLedger(tmp_path / "ledger.sqlite3"))
    assert worker.config()["sticky_queue_schedule_to_start_timeout"].total_seconds() == 1.5
    with pytest.raises(ValueError, match="--sticky-timeout 0"):
        WorkerSettings(sticky_timeout_s=0)
    out = subprocess.run([sys.executable, "-m", "testbed", "worker", "--sticky-timeout", "-1"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--sticky-timeout -1.0: must be more than 0 seconds" in out.stderr

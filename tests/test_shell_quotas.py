"""The shell environment's quotas and failure classification: the workspace's size and file count (measured
before the commit, watched while the command runs, checked before the copy), the sandbox's bounded /tmp,
bubblewrap found outside the command's PATH, and every failure of the bash tool classified."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
from pathlib import Path

import pytest

import agent.envs.sandbox as sandbox
import agent.envs.shell as shell
from agent.envs.base import EnvConfigError, EnvContext
from agent.envs.registry import get_env, parse_env_config
from agent.errors import ToolExecutionError, ToolRetryableError, ToolValidationError
from agent.tools import ToolContext, run_tool
from harness.recording import EffectLedger, ExecutionIdentity
from tests.events import HANG_S, wait_for, wait_for_async

HAVE_BWRAP, WHY_NO_BWRAP = sandbox.bwrap_available()
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason=f"no bubblewrap isolation here: {WHY_NO_BWRAP}")


class _Env:
    """A shell environment and its bash tool, called the way the env_tool activity calls it."""

    def __init__(self, tmp_path: Path, env_id: str = "q", **options: object) -> None:
        self.ledger = EffectLedger(tmp_path / "ledger.sqlite3")
        self.ctx = EnvContext(root=tmp_path / "envs", ledger=self.ledger)
        self.env = get_env(parse_env_config({"name": "shell_local", **options}), self.ctx, env_id)
        self.calls = 0

    async def bash(self, command: object, *, call: str | None = None) -> str:
        self.calls += 1
        ident = ExecutionIdentity("wf", "run", call or f"act-{self.calls}", 1, "test-worker")
        ctx = ToolContext(workspace=self.env.directory, ledger=self.ledger, ident=ident)
        return await run_tool(self.env.get_tools()[0], {"command": command}, ctx)

    def head(self) -> dict:
        return json.loads((self.env.directory / "HEAD.json").read_text())

    def files(self) -> list[str]:
        root = self.env.workspace.resolve()
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    def gens(self) -> list[str]:
        return sorted(p.name for p in (self.env.directory / "gens").iterdir())


def test_the_quota_settings_are_checked() -> None:
    for name in ("max_workspace_mb", "max_workspace_files", "tmp_mb"):
        with pytest.raises(EnvConfigError, match=f"env.{name}: must be greater than 0, got 0"):
            parse_env_config({"name": "shell_local", name: 0})
    with pytest.raises(EnvConfigError, match="env.tmp_mb: must be an integer"):
        parse_env_config({"name": "shell_local", "tmp_mb": "64M"})


@needs_bwrap
async def test_a_command_that_leaves_the_workspace_over_its_byte_quota_is_undone(tmp_path: Path) -> None:
    e = _Env(tmp_path, max_workspace_mb=5)
    await e.env.build()
    assert "[exit code 0]" in await e.bash("echo kept > keep.txt")
    before = (e.head(), e.files())
    # 10 MiB in five files of 2 MiB (each under the per-file limit, which is now the quota: 5 MiB)
    out = await e.bash("for i in 1 2 3 4 5; do head -c 2M /dev/zero > f$i; done; echo wrote", call="big")
    assert "quota exceeded" in out and "more than 5 MiB" in out, out
    assert "the command's changes were discarded and the workspace is as it was before the command" in out
    assert e.files() == ["keep.txt"] and e.gens() == [before[0]["gen"]]
    assert e.head()["gen"] == before[0]["gen"] and e.head()["usage"] == before[0]["usage"]
    # The outcome is recorded under the call's key: a retry gets it back, the command does not run again.
    assert await e.bash("for i in 1 2 3 4 5; do head -c 2M /dev/zero > f$i; done; echo wrote", call="big") == out
    assert e.ledger.summary().duplicated_effects == 0
    # Under the quota: a file with two more names counts once (cp -a keeps hard links), a set-uid bit is cleared.
    out = await e.bash("head -c 3M /dev/zero > a && ln a b && ln a c && touch s && chmod u+s,g+s s && echo ok")
    assert "quota exceeded" not in out and "[exit code 0]" in out, out
    assert e.files() == ["a", "b", "c", "keep.txt", "s"]
    assert not e.env.workspace.resolve().joinpath("s").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert e.head()["usage"]["bytes"] >= 3 * 1024 * 1024
    assert "[exit code 0]" in await e.bash("rm a b c && echo the workspace still works")


@needs_bwrap
async def test_a_command_that_leaves_too_many_files_is_undone_and_the_quota_itself_is_allowed(
        tmp_path: Path) -> None:
    e = _Env(tmp_path, max_workspace_files=50)
    await e.env.build()
    out = await e.bash("mkdir d && touch d/{1..100} && ls d | wc -l")
    assert "quota exceeded (" in out and "more than 50 files" in out, out
    assert e.files() == [] and e.head()["usage"] == {"files": 0, "bytes": 0, "over": None}
    out = await e.bash("mkdir d && touch d/{1..49}")  # 50 entries: the directory and 49 files
    assert "quota" not in out and e.head()["usage"]["files"] == 50 and len(e.files()) == 50, out


def test_the_tmp_of_a_sandbox_not_entered_yet_is_not_this_machines() -> None:
    """Until bwrap's child has moved into the sandbox's root, its /tmp is this machine's, which holds many more
    files than a workspace quota: counting it killed a command that made 50 files under a 50-file quota on a busy
    machine ("/tmp went over 50 files")."""
    import subprocess

    for _ in range(60):  # this machine's /tmp holds files of its own: the count would not be 0
        (Path("/tmp") / f"dah-test-{os.getpid()}-{_}").touch()
    parent = subprocess.Popen(["/bin/bash", "-c", "sleep 30 & wait"])  # a child with this machine's root
    try:
        wait_for(lambda: Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split(),
                 "the sleep child of bash", proc=parent)
        assert sandbox.sandbox_tmp_usage(parent.pid) is None
    finally:
        parent.kill()
        parent.wait()
        for _ in range(60):
            (Path("/tmp") / f"dah-test-{os.getpid()}-{_}").unlink()


@needs_bwrap
async def test_a_command_going_over_the_quota_is_killed_while_it_runs(tmp_path: Path) -> None:
    e = _Env(tmp_path, max_workspace_mb=5, timeout_s=600)  # a time limit no busy machine reaches: the quota kills
    await e.env.build()
    out = await e.bash("for i in $(seq 10); do head -c 1M /dev/zero > f$i; done; echo written; sleep 600")
    assert "written" in out and "s: the workspace went over its quota (more than 5 MiB)]" in out, out
    assert "the command's changes were discarded" in out and e.files() == []


@needs_bwrap
async def test_a_workspace_already_over_its_quota_is_not_copied(tmp_path: Path) -> None:
    e = _Env(tmp_path)
    await e.env.build()
    await e.bash("touch f{1..30}")
    lowered = _Env(tmp_path, max_workspace_files=10)  # the same environment, its quota lowered
    with pytest.raises(ToolExecutionError) as err:
        await lowered.bash("rm f*; touch marker", call="lowered-1")
    assert "the command was not run: the workspace is already over its quota (more than 10 files" in str(err.value)
    assert "env.max_workspace_files" in str(err.value) and str(tmp_path) not in str(err.value)
    assert len(lowered.files()) == 30 and "marker" not in lowered.files()
    # An older version's HEAD.json has no usage: the workspace is counted (stopping at the quota), same refusal.
    head = e.head()
    del head["usage"]
    (e.env.directory / "HEAD.json").write_text(json.dumps(head))
    with pytest.raises(ToolExecutionError, match="already over its quota \\(more than 10 files"):
        await lowered.bash("true", call="lowered-2")
    assert "[exit code 0]" in await e.bash("rm f{1..25}")  # the default quota: counted again, then recorded
    assert e.head()["usage"]["files"] == 5 and "[exit code 0]" in await lowered.bash("true", call="lowered-3")


@needs_bwrap
async def test_tmp_is_bounded_in_size_and_files_and_dev_is_read_only(tmp_path: Path) -> None:
    e = _Env(tmp_path, tmp_mb=4, max_workspace_files=200, timeout_s=600)  # the file count kills, not the clock
    await e.env.build()
    out = await e.bash("head -c 8M /dev/zero > /tmp/big; echo rc=$?; du -k /tmp/big | cut -f1; "
                       "touch /dev/shm/x /dev/x")
    assert "No space left on device" in out and "rc=1" in out, out
    assert 0 < int(out.split("rc=1\n")[1].split("\n")[0]) <= 4096, out  # what fitted: at most 4 MiB
    assert "touch: cannot touch '/dev/shm/x'" in out and "touch: cannot touch '/dev/x'" in out, out
    out = await e.bash("cd /tmp && seq 100000 | xargs touch; sleep 600")
    assert "/tmp went over 200 files" in out, out  # stopped by the monitor, not by the end of the sleep


@needs_bwrap
async def test_bwrap_outside_the_commands_path_is_run_by_its_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "opt-bin"
    elsewhere.mkdir()
    (elsewhere / "bwrap").symlink_to(sandbox.bwrap_executable())
    monkeypatch.setenv("PATH", str(elsewhere))  # the worker's PATH: no /usr/bin
    real_env = sandbox._scrubbed_env
    # The command's own PATH has no bwrap either (it had /usr/bin: a bare 'bwrap' was found there by luck).
    monkeypatch.setattr(sandbox, "_scrubbed_env", lambda workdir: {**real_env(workdir), "PATH": "/nonexistent"})
    sandbox.bwrap_available.cache_clear()
    try:
        assert sandbox.bwrap_available() == (True, f"bubblewrap at {elsewhere / 'bwrap'}")
        e = _Env(tmp_path)
        await e.env.build()
        out = await e.bash("echo hello from the sandbox; echo $PATH")
        assert "hello from the sandbox\n/usr/local/bin:/usr/bin:/bin\n[exit code 0]" in out, out
        assert sandbox.bwrap_command("true", tmp_path, None)[0] == str(elsewhere / "bwrap")
    finally:
        monkeypatch.undo()
        sandbox.bwrap_available.cache_clear()


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
@pytest.mark.parametrize("error, expected", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), ToolExecutionError),
    (PermissionError(errno.EACCES, "Permission denied"), ToolExecutionError),
    (BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"), ToolRetryableError),
])
async def test_a_sandbox_that_cannot_start_is_a_classified_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str, error: OSError, expected: type) -> None:
    if isolation == "bwrap" and not HAVE_BWRAP:
        pytest.skip(f"no bubblewrap isolation here: {WHY_NO_BWRAP}")
    e = _Env(tmp_path, isolation=isolation)
    await e.env.build()
    real = sandbox.asyncio.create_subprocess_exec

    async def failing(program: str, *args: str, **kwargs: object):
        if program != shell.shutil.which("cp", path=sandbox._SAFE_PATH):  # the copy works; the sandbox not
            error.filename = program
            raise error
        return await real(program, *args, **kwargs)

    monkeypatch.setattr(sandbox.asyncio, "create_subprocess_exec", failing)
    with pytest.raises(expected) as err:
        await e.bash("touch never")
    what = "the bubblewrap sandbox" if isolation == "bwrap" else "bash"
    assert str(err.value) == f"bash: the command was not run: {what} could not be started ({error.strerror})"
    assert e.files() == [] and e.gens() == ["g000000"]  # nothing left behind


@needs_bwrap
async def test_a_missing_bwrap_is_a_classified_error_without_host_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = _Env(tmp_path)
    await e.env.build()
    monkeypatch.setattr(sandbox, "_bwrap_exe", str(tmp_path / "gone" / "bwrap"))  # removed after the check
    with pytest.raises(ToolExecutionError, match="the bubblewrap sandbox could not be started "
                                                 "\\(No such file or directory\\)") as err:
        await e.bash("true")
    assert str(tmp_path) not in str(err.value)


async def test_bad_arguments_are_validation_errors(tmp_path: Path) -> None:
    e = _Env(tmp_path, isolation="none")
    await e.env.build()
    for command, message in ((["ls"], "must be a string, got list"), (None, "must be a string, got NoneType"),
                             ("  ", "command is empty"), ("echo a\x00b", "contains NUL"),
                             ("echo \ud800", "not valid text")):
        with pytest.raises(ToolValidationError, match=message):
            await e.bash(command)
    assert e.ledger.summary().effects_applied == 0


async def test_a_failed_copy_is_a_classified_error_without_host_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = _Env(tmp_path, isolation="none")
    await e.env.build()
    await e.bash("echo one > a.txt")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    monkeypatch.setattr(shell, "_SAFE_PATH", str(fake))
    for message, expected in (("No space left on device", "the host has no space left to copy the workspace"),
                              ("Input/output error", "the workspace could not be copied")):
        (fake / "cp").write_text("#!/bin/sh\n"
                                 "for last; do :; done\n"  # the destination, a host path
                                 f"mkdir -p \"$last\"; echo \"cp: error writing '$last/a.txt': {message}\" >&2\n"
                                 "exit 1\n")
        (fake / "cp").chmod(0o755)
        with pytest.raises(ToolExecutionError) as err:
            await e.bash("echo two >> a.txt")
        assert expected in str(err.value) and f"/workspace/a.txt': {message}" in str(err.value), err.value
        assert str(tmp_path) not in str(err.value)
        assert e.gens() == ["g000001"] and (e.env.workspace / "a.txt").read_text() == "one\n"


@pytest.mark.skipif(not sandbox.running_as_root(),
                    reason="not root: commands run as this user, not as a uid per environment")
async def test_an_environment_of_the_same_id_elsewhere_does_not_kill_the_others_commands(tmp_path: Path) -> None:
    # Found in CI: every test here names its environment "q"; the uid came from the id alone, so the end of one
    # test's command (which kills what its uid left running) killed another test's command on another worker.
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    victim, other = _Env(tmp_path / "one", isolation="none"), _Env(tmp_path / "two", isolation="none")
    for e in (victim, other):
        await e.env.build()
    assert victim.env.sandbox_uid != other.env.sandbox_uid
    running = asyncio.create_task(victim.bash("touch started; until [ -e go ]; do sleep 0.05; done; echo survived"))
    gens = victim.env.directory / "gens"

    async def started() -> Path | None:
        return next((g for g in gens.iterdir() if (g / "started").exists()), None)

    gen = await wait_for_async(started, "the command to start")
    await other.bash("true")  # ends by killing what its own uid left running
    (gen / "go").touch()
    out = await asyncio.wait_for(running, HANG_S)
    assert "survived\n[exit code 0]" in out, out


async def test_the_record_gives_the_workflow_the_commands_time_limit(tmp_path: Path) -> None:
    e = _Env(tmp_path, isolation="none", timeout_s=45)
    record = await e.env.build()
    assert record.data["tool_timeout_s"] == 45
    state = await e.env.get_state()
    assert "the workspace may hold at most 10000 files and 512 MiB" in state
    assert os.path.isabs(record.data["workspace"])


def test_counting_repairs_what_the_next_copy_needs_without_following_links(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "running_as_root", lambda: False)  # as a user, cp cannot read a mode-000 file
    gen = tmp_path / "gen"
    (gen / "locked").mkdir(parents=True)
    (gen / "locked" / "secret").write_text("x")
    (gen / "setuid").write_text("x")
    victim = tmp_path / "victim"
    victim.write_text("outside")
    (gen / "link").symlink_to(victim)
    os.chmod(gen / "locked" / "secret", 0)
    os.chmod(gen / "locked", 0o500)
    os.chmod(gen / "setuid", 0o4755)
    os.chmod(victim, 0o600)
    usage = shell.measure(gen, 10, 1 << 20, repair=True)
    assert (usage.files, usage.over) == (4, None)
    assert stat.S_IMODE((gen / "locked").stat().st_mode) == 0o700  # searchable and emptiable again
    assert stat.S_IMODE((gen / "locked" / "secret").stat().st_mode) == 0o400
    assert stat.S_IMODE((gen / "setuid").stat().st_mode) == 0o755
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert shell.measure(gen, 3, 1 << 20).over == "more than 3 files"
    assert shell.measure(gen, 10, 100).over == "more than 0 MiB"

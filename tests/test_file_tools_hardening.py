"""The file tools under attack: planted symlinks, a directory swapped for a symlink mid-call, and odd input.

Nothing may be written, read or listed outside the workspace, and no input may raise an unclassified
exception (one is retried forever) or show a host path to the model.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agent import tools
from agent.errors import ToolError, ToolExecutionError, ToolRetryableError, ToolValidationError
from agent.tools import TOOLS, ToolContext, validate_arguments
from harness.recording import EffectLedger, ExecutionIdentity
from tests.test_tools import claimed_then_crashed

SECRET = "the outside secret"


def race(tools: ModuleType, tmp: Path, writes: int = 4000, hold_link_s: float = 0.00001, hold_dir_s: float = 0.00001
         ) -> dict[str, Any]:
    """Call the file tools ``writes`` times on paths under ``ws/sub`` while a thread keeps swapping ``sub`` for a
    symlink to ``outside`` (rename it away, link in, unlink, rename back). ``tools`` is ``agent.tools`` or a copy
    of an older version. Returns what got outside and how the calls ended."""
    ws, outside = tmp / "ws", tmp / "outside"
    (ws / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    ledger = EffectLedger(tmp / "ledger.sqlite3")
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        i = 0
        while not stop.is_set():
            i += 1
            away = ws / f".away-{i}"
            try:
                os.rename(ws / "sub", away)
            except FileNotFoundError:
                os.makedirs(ws / "sub", exist_ok=True)
                continue
            except OSError:
                continue
            try:
                os.symlink(outside, ws / "sub")  # fails if a writer re-created sub in the gap
                swaps += 1
            except OSError:
                pass
            time.sleep(hold_link_s)
            try:
                os.unlink(ws / "sub")
            except OSError:
                pass
            try:
                os.rename(away, ws / "sub")
            except OSError:
                pass
            time.sleep(hold_dir_s)  # the real directory stays a moment too: checks pass, and a swap lands after

    outcomes: Counter[str] = Counter()
    leaked_reads = leaked_listings = 0
    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        for i in range(writes):
            calls: list[tuple[str, dict[str, Any]]] = [("write_file", {"path": f"sub/f{i}.txt", "content": str(i)})]
            if i % 4 == 0:
                calls += [("append_file", {"path": "sub/log.txt", "content": f"{i}\n"}),
                          ("read_file", {"path": "sub/secret.txt"}),
                          ("list_files", {"path": "sub"})]
            for name, args in calls:
                ctx = tools.ToolContext(ws, ledger, ExecutionIdentity("wf-race", "run-1", f"{i}-{name}", 1, "w"))
                try:
                    out = tools.TOOLS[name].run(args, ctx)
                    outcomes[f"{name} ok"] += 1
                    leaked_reads += name == "read_file" and SECRET in out
                    leaked_listings += name == "list_files" and "secret" in out
                except ToolError as exc:
                    outcomes[f"{name} {type(exc).__name__}"] += 1
                except Exception as exc:  # what the activity would retry forever
                    outcomes[f"{name} UNCLASSIFIED {type(exc).__name__}"] += 1
    finally:
        stop.set()
        thread.join()
        ledger.close()
    outside_files = sorted(str(Path(d, f).relative_to(outside)) for d, _, fs in os.walk(outside) for f in fs)
    written = [f for f in outside_files if f != "secret.txt"]
    return {
        "files_outside": len(written),
        "temp_files_outside": sum(1 for f in written if f.endswith(".tmp")),
        "secret_intact": (outside / "secret.txt").read_text() == SECRET,
        "leaked_reads": leaked_reads,
        "leaked_listings": leaked_listings,
        "swaps": swaps,
        "outcomes": dict(sorted(outcomes.items())),
    }


# -- the tests ----------------------------------------------------------------------------------------------------

FILE_TOOLS = ["write_file", "append_file", "read_file", "list_files"]


@pytest.fixture
def ctx(tmp_path: Path):
    ws = tmp_path / "sandbox" / "wf-1"
    ws.mkdir(parents=True)
    ledger = EffectLedger(tmp_path / "ledger.sqlite3")
    yield ToolContext(ws, ledger, ExecutionIdentity("wf-1", "run-1", "7", 1, "test-worker"))
    ledger.close()


_calls = iter(range(10**9))


def run(name: str, ctx: ToolContext, **args: object) -> str:
    """One tool call as an activity makes it, with an activity id of its own (so the ledger never answers a
    later call from an earlier one's record)."""
    validate_arguments(TOOLS[name], args)
    ident = ExecutionIdentity(ctx.ident.workflow_id, ctx.ident.run_id, f"c{next(_calls)}", ctx.ident.attempt,
                              ctx.ident.worker)
    return TOOLS[name].run(args, ToolContext(ctx.workspace, ctx.ledger, ident))


def call(name: str, ctx: ToolContext, **args: object) -> ToolError:
    """The classified error a call raises (anything else fails the test)."""
    with pytest.raises(ToolError) as info:
        run(name, ctx, **args)
    return info.value


def assert_no_host_path(exc: BaseException, ctx: ToolContext) -> None:
    text = str(exc)
    for host in {str(ctx.workspace), os.path.realpath(ctx.workspace), str(ctx.workspace.parent.parent)}:
        assert host not in text, text
    # The OSError (whose text has the host path) is not chained to it, so no traceback shows it either.
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__), repr(exc.__context__)


def outside_dir(ctx: ToolContext) -> Path:
    outside = ctx.workspace.parent.parent / "outside"
    outside.mkdir(exist_ok=True)
    return outside


# -- 2: a directory swapped for a symlink while the tools work -------------------------------------------------


@pytest.mark.parametrize("hold_link_s,hold_dir_s", [(0.00001, 0.00001), (0.0001, 0.002)],
                         ids=["fast-swaps", "directory-mostly-there"])
def test_a_directory_swapped_for_a_symlink_never_lets_a_call_outside(tmp_path: Path, hold_link_s: float,
                                                                     hold_dir_s: float) -> None:
    start = time.perf_counter()
    result = race(tools, tmp_path, writes=4000, hold_link_s=hold_link_s, hold_dir_s=hold_dir_s)
    print(f"\nrace ({time.perf_counter() - start:.1f} s): {result}")
    assert (result["files_outside"], result["temp_files_outside"]) == (0, 0), result
    assert (result["leaked_reads"], result["leaked_listings"]) == (0, 0), result
    assert result["secret_intact"], result
    assert not [k for k in result["outcomes"] if "UNCLASSIFIED" in k], result
    # The race was real: the directory was swapped, and calls went through between the swaps.
    assert result["swaps"] > 50 and result["outcomes"].get("write_file ok", 0) > 10, result


# -- 1: symlinks planted in the workspace ------------------------------------------------------------------


def test_a_planted_temp_file_symlink_does_not_overwrite_the_victim(ctx: ToolContext) -> None:
    victim = outside_dir(ctx) / "victim"
    victim.write_text("precious")
    for attempt in (1, 2, 3):
        os.symlink(victim, ctx.workspace / f".f.{attempt}.tmp")
    assert run("write_file", ctx, path="f", content="pwned") == "wrote 5 bytes to f"
    assert victim.read_text() == "precious"
    assert (ctx.workspace / "f").read_text() == "pwned" and not (ctx.workspace / "f").is_symlink()
    assert not os.path.lexists(ctx.workspace / ".f.1.tmp")  # removed with unlinkat, never followed
    assert sorted(p.name for p in outside_dir(ctx).iterdir()) == ["victim"]


def test_a_stale_temp_entry_that_cannot_be_removed_is_passed_over(ctx: ToolContext) -> None:
    (ctx.workspace / ".f.1.tmp").mkdir()  # a directory: unlinkat fails on it
    (ctx.workspace / ".f.1.tmp" / "keep").write_text("k")
    assert run("write_file", ctx, path="f", content="new") == "wrote 3 bytes to f"
    assert (ctx.workspace / "f").read_text() == "new"
    assert (ctx.workspace / ".f.1.tmp" / "keep").read_text() == "k"
    assert [p.name for p in ctx.workspace.iterdir() if p.name.endswith(".tmp") and p.is_file()] == []


@pytest.mark.parametrize("name", FILE_TOOLS)
def test_symlinks_are_not_followed_even_inside_the_workspace(ctx: ToolContext, name: str) -> None:
    outside = outside_dir(ctx)
    (outside / "secret.txt").write_text("secret")
    (ctx.workspace / "real").mkdir()
    (ctx.workspace / "real" / "a.txt").write_text("inside")
    os.symlink(outside, ctx.workspace / "out")
    os.symlink(ctx.workspace / "real", ctx.workspace / "in")
    os.symlink(outside / "secret.txt", ctx.workspace / "secret.txt")
    os.symlink("real/a.txt", ctx.workspace / "a-link.txt")
    args = {"content": "x"} if name in ("write_file", "append_file") else {}
    paths = ["out", "in"] if name == "list_files" else ["out/secret.txt", "in/a.txt", "secret.txt", "a-link.txt"]
    for path in paths:
        exc = call(name, ctx, path=path, **args)
        assert isinstance(exc, ToolValidationError) and "symlink" in str(exc) and "not followed" in str(exc), exc
        assert_no_host_path(exc, ctx)
    assert (outside / "secret.txt").read_text() == "secret" and sorted(os.listdir(outside)) == ["secret.txt"]
    assert (ctx.workspace / "real" / "a.txt").read_text() == "inside"


def test_list_files_neither_lists_nor_enters_symlinks(ctx: ToolContext) -> None:
    outside = outside_dir(ctx)
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, ctx.workspace / "out")
    os.symlink(outside / "secret.txt", ctx.workspace / "s.txt")
    run("write_file", ctx, path="d/a.txt", content="a")
    (ctx.workspace / ".hidden").write_text("h")
    (ctx.workspace / ".cache").mkdir()
    (ctx.workspace / ".cache" / "c.txt").write_text("c")  # a file in a hidden directory is listed, as before
    assert run("list_files", ctx) == ".cache/c.txt\nd/a.txt"
    assert run("list_files", ctx, path="d") == "d/a.txt"
    assert run("list_files", ctx, path="missing/dir") == "(no files)"


# -- 3: bad input is classified, and no message shows a host path ---------------------------------------------


@pytest.mark.parametrize("name", FILE_TOOLS)
@pytest.mark.parametrize("path", ["a" * 5000, "d/" + "b" * 300, "a.txt/b", "a.txt/b/c", "\ud800.txt", "x\udcff",
                                  "", "   ", "a\x00b", "/etc/passwd", "../x", "d/../../x", "..", "a\nb", "a\x7fb"])
def test_bad_paths_are_validation_errors(ctx: ToolContext, name: str, path: str) -> None:
    (ctx.workspace / "a.txt").write_text("x")
    args = {"content": "x"} if name in ("write_file", "append_file") else {}
    if name == "list_files" and path == "":
        assert run(name, ctx, path=path) == "a.txt"  # no path: the whole workspace
        return
    start = time.perf_counter()
    exc = call(name, ctx, path=path, **args)
    assert isinstance(exc, ToolValidationError), exc
    assert_no_host_path(exc, ctx)
    assert time.perf_counter() - start < 30  # refused up front; the bound only catches a hang, not a busy machine
    assert "\ud800" not in str(exc) and "\udcff" not in str(exc)  # escaped: the message is encodable text
    str(exc).encode("utf-8")
    assert sorted(os.listdir(ctx.workspace)) == ["a.txt"] and (ctx.workspace / "a.txt").read_text() == "x"


def test_the_messages_say_what_to_repair(ctx: ToolContext) -> None:
    (ctx.workspace / "a.txt").write_text("x")
    assert "'a.txt' is a file, not a directory" in str(call("write_file", ctx, path="a.txt/b", content="x"))
    assert "5000 bytes long; the limit is 1024" in str(call("write_file", ctx, path="a" * 5000, content="x"))
    assert "the limit is 255" in str(call("read_file", ctx, path="b" * 300))
    assert "lone surrogate" in str(call("write_file", ctx, path="s.txt", content="ok \ud800"))
    assert "lone surrogate" in str(call("append_file", ctx, path="s.txt", content="\udfff"))
    assert "is the workspace directory" in str(call("write_file", ctx, path=".", content="x"))
    (ctx.workspace / "d").mkdir()
    assert "is the workspace directory" in str(call("write_file", ctx, path=".", content="x"))
    assert "is a directory" in str(call("append_file", ctx, path="d", content="x"))
    assert "is a directory" in str(call("read_file", ctx, path="d"))
    assert "is a file, not a directory" in str(call("list_files", ctx, path="a.txt"))
    assert "does not exist" in str(call("read_file", ctx, path="d/nope.txt"))
    assert "does not exist" in str(call("read_file", ctx, path="nope/nope.txt"))


@pytest.mark.parametrize("content", ["\ud800", "a\udc80b", "\udfff" * 3])
@pytest.mark.parametrize("name", ["write_file", "append_file"])
def test_content_that_is_not_text_is_a_validation_error(ctx: ToolContext, name: str, content: str) -> None:
    exc = call(name, ctx, path="s.txt", content=content)
    assert isinstance(exc, ToolValidationError) and "position" in str(exc)
    assert not (ctx.workspace / "s.txt").exists()
    assert ctx.ledger.effects("wf-1") == []  # refused before the effect was claimed


def test_a_fifo_is_refused_without_blocking(ctx: ToolContext) -> None:
    os.mkfifo(ctx.workspace / "pipe")
    start = time.perf_counter()
    for name, args in [("read_file", {}), ("append_file", {"content": "x"}), ("write_file", {"content": "x"})]:
        if name == "write_file":
            assert run(name, ctx, path="pipe", **args) == "wrote 1 bytes to pipe"  # replaced by a regular file
            continue
        exc = call(name, ctx, path="pipe", **args)
        assert isinstance(exc, ToolValidationError) and "not a regular file" in str(exc), exc
    assert time.perf_counter() - start < 30  # opening the FIFO would block for ever: there is no writer
    assert stat.S_ISREG(os.lstat(ctx.workspace / "pipe").st_mode)


def _raise(code: int):
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), "/host/secret/path/sandbox/wf-1/a.txt")
    return fail


@pytest.mark.parametrize("code,expected", [
    (errno.ENOSPC, ToolExecutionError), (errno.EDQUOT, ToolExecutionError), (errno.EFBIG, ToolExecutionError),
    (errno.EROFS, ToolExecutionError), (errno.EACCES, ToolExecutionError), (errno.EPERM, ToolExecutionError),
    (errno.EIO, ToolRetryableError), (errno.EMFILE, ToolRetryableError), (errno.ENOMEM, ToolRetryableError),
])
@pytest.mark.parametrize("where", ["fsync", "mkdir", "replace", "open"])
def test_os_errors_are_classified(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch, code: int,
                                  expected: type, where: str) -> None:
    real_open = os.open

    def open_failing_for_files(path, flags, *args, **kwargs):  # the workspace and its directories still open
        if flags & os.O_DIRECTORY:
            return real_open(path, flags, *args, **kwargs)
        _raise(code)()

    monkeypatch.setattr(tools.os, where, open_failing_for_files if where == "open" else _raise(code))
    for name in ["write_file"] if where == "replace" else ["write_file", "append_file"]:
        exc = call(name, ctx, path="new/a.txt", content="x")
        monkeypatch.undo()
        assert type(exc) is expected, (name, exc)
        assert os.strerror(code) in str(exc) and "/host/secret" not in str(exc), exc
        assert_no_host_path(exc, ctx)
        leftovers = [p for p in ctx.workspace.rglob("*") if p.name.endswith(".tmp")]
        assert leftovers == [], leftovers  # a failed write removes its temp file
        monkeypatch.setattr(tools.os, where, open_failing_for_files if where == "open" else _raise(code))


@pytest.mark.parametrize("code,expected", [(errno.EIO, ToolRetryableError), (errno.EACCES, ToolExecutionError),
                                           (errno.ENAMETOOLONG, ToolValidationError)])
def test_read_errors_are_classified(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch, code: int,
                                    expected: type) -> None:
    run("write_file", ctx, path="a.txt", content="x")
    monkeypatch.setattr(tools.os, "read", _raise(code))
    exc = call("read_file", ctx, path="a.txt")
    assert type(exc) is expected and "/host/secret" not in str(exc), exc


def test_a_path_through_a_symlinked_directory_is_refused(ctx: ToolContext) -> None:
    run("write_file", ctx, path="notes/./a.txt", content="x")
    assert run("read_file", ctx, path="notes/./a.txt") == run("read_file", ctx, path="notes/a.txt")
    (ctx.workspace / "real").mkdir()
    (ctx.workspace / "real" / "a.txt").write_text("x")
    os.symlink("real", ctx.workspace / "in")
    with pytest.raises(ToolValidationError, match="symlink"):
        run("read_file", ctx, path="in/a.txt")
    with pytest.raises(ToolValidationError, match="symlink"):
        run("write_file", ctx, path="in/a.txt", content="y")


def test_limits_and_round_trips_are_kept(ctx: ToolContext) -> None:
    big = "x" * (tools.MAX_FILE_BYTES + 1)
    assert isinstance(call("write_file", ctx, path="big.txt", content=big), ToolValidationError)
    (ctx.workspace / "big.txt").write_text(big)
    assert "the limit is" in str(call("read_file", ctx, path="big.txt"))
    for i in range(tools.MAX_LISTED_FILES + 5):
        (ctx.workspace / f"f{i:04d}.txt").write_text("")
    listing = run("list_files", ctx).splitlines()
    assert len(listing) == tools.MAX_LISTED_FILES + 1 and listing[-1] == "... and 6 more"
    assert run("append_file", ctx, path="n/l.txt", content="1\n") == "appended 2 bytes to n/l.txt"
    assert run("append_file", ctx, path="n/l.txt", content="2\n") == "appended 2 bytes to n/l.txt"
    assert run("read_file", ctx, path="n//l.txt") == "1\n2\n"
    assert run("write_file", ctx, path="é/ü.txt", content="ß") == "wrote 2 bytes to é/ü.txt"
    assert run("read_file", ctx, path="é/ü.txt") == "ß"


def test_a_retried_append_is_recovered_through_the_safe_reader(ctx: ToolContext) -> None:
    retry = claimed_then_crashed(ctx, "append_file", "l.txt", "line\n")
    TOOLS["append_file"].run({"path": "l.txt", "content": "line\n"}, retry)
    assert (ctx.workspace / "l.txt").read_text() == "line\n"  # not appended twice


# -- fuzz: no input escapes classification --------------------------------------------------------------------

_PIECES = ["a", "b.txt", ".", "..", "", "/", "//", " ", "é", "\ud800", "\udc80", "\x00", "\n", "x" * 130, "a.txt", "dir",
           "link", "fifo", "~", "\\", "*", "-"]


@pytest.fixture(scope="module")
def fuzz_ctx(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("fuzz")
    ws = base / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    (ws / "dir").mkdir()
    os.mkfifo(ws / "fifo")
    (base / "outside").mkdir()
    os.symlink(base / "outside", ws / "link")
    ledger = EffectLedger(base / "ledger.sqlite3")
    yield ToolContext(ws, ledger, ExecutionIdentity("wf-fuzz", "run-1", "1", 1, "w"))
    ledger.close()


def fuzz_one(ctx: ToolContext, name: str, path: str, content: str) -> None:
    """One call with arbitrary input: answered, or refused with a classified error that shows no host path;
    either way with encodable text, and nothing made outside the workspace."""
    args: dict[str, Any] = {"path": path}
    if name in ("write_file", "append_file"):
        args["content"] = content
    try:
        out = run(name, ctx, **args)
    except ToolError as exc:
        assert_no_host_path(exc, ctx)
        str(exc).encode("utf-8")
    else:
        assert isinstance(out, str)
        out.encode("utf-8")
    assert list((ctx.workspace.parent / "outside").iterdir()) == []
    assert sorted(os.listdir(ctx.workspace.parent)) == ["ledger.sqlite3", "ledger.sqlite3-shm", "ledger.sqlite3-wal",
                                                         "outside", "ws"]


@pytest.mark.parametrize("name", FILE_TOOLS)
def test_every_pair_of_odd_pieces_is_answered_or_classified(fuzz_ctx: ToolContext, name: str) -> None:
    for i, first in enumerate(_PIECES):
        for j, second in enumerate(_PIECES):
            fuzz_one(fuzz_ctx, name, f"{first}/{second}" if (i + j) % 2 else first + second, second)


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # a dev dependency: without it only this test is skipped

    @pytest.mark.skip(reason="hypothesis is not installed")
    def test_fuzz_every_input_is_answered_or_classified() -> None:
        pass

else:
    _any_char = st.characters(exclude_categories=[])  # lone surrogates and control characters too
    _paths = st.one_of(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), st.text(_any_char, max_size=40),
                       st.text(_any_char, max_size=300).map(lambda s: s * 20))
    _contents = st.one_of(st.text(_any_char, max_size=200),
                          st.sampled_from(["", "\ud800", "ok\udfff", "\x00", "x" * (tools.MAX_FILE_BYTES + 1)]))

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(name=st.sampled_from(FILE_TOOLS), path=_paths, content=_contents)
    def test_fuzz_every_input_is_answered_or_classified(fuzz_ctx: ToolContext, name: str, path: str,
                                                        content: str) -> None:
        fuzz_one(fuzz_ctx, name, path, content)

"""Files a run directory names, read without leaving it.

A run directory is data that may come from anyone (copied from another machine, a CI artefact), so every file the
harness reads because a run's data names it is read here, relative to a root:

* the root is a directory the user named (or one the harness made), resolved once: ``runs/X/latest`` works;
* the path below it is relative, with no ``..``: an absolute path, or one that climbs, is refused;
* every component below the root is opened relative to its parent with ``O_NOFOLLOW``: a symlink anywhere below
  the root is refused, never followed (as the agent's file tools do in a workspace);
* only a regular file is opened for reading (checked before the open and again on the open descriptor, which is
  opened ``O_NONBLOCK`` so that a FIFO swapped in meanwhile cannot block), and only up to a bound: a larger file
  is refused, naming the file and the bound (a worker log reads only its last ``LOG_TAIL`` bytes instead).

A refusal is ``RefusedPath``, whose message begins ``refused:`` and says which file and why; a file that is not
there is ``FileNotFoundError``. Writes into a run directory go through ``harness.durable_files.write_atomic``
(an exclusive, no-follow temporary file, then a rename). A file is removed because data names it only by
``remove_written``: by the same rules, and only if it is still the very file that was written (its ``FileId``).

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sqlite3
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import quote

MiB = 2**20
#: a JSON document of a run (run.json, verdict.json, conversations.json, an event history, a summary, ...)
JSON_LIMIT = 256 * MiB
#: the operation log, read as a stream (a single line of 1 GB still reads)
OPERATIONS_LIMIT = 4096 * MiB
#: a worker log: only its last this many bytes are read
LOG_TAIL = 64 * MiB
#: a file an agent wrote in its workspace
WORKSPACE_FILE_LIMIT = 16 * MiB
#: the external effects service's log (``effects_service.jsonl``), read as a stream
EFFECTS_LOG_LIMIT = 1024 * MiB

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink"))


class RefusedPath(ValueError):
    """A file named by run data that is not read: outside the run directory, through a symlink, not a regular
    file, or over its size bound. The message begins ``refused:`` and names the file and why."""


def relative_parts(path: str | os.PathLike[str], what: str = "path") -> list[str]:
    """The components of ``path``, a path taken from run data that must stay below its root; RefusedPath if it is
    absolute, climbs (``..``), is empty or holds a NUL. ``what`` says where it came from, for the message."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "\x00" in text:
        raise RefusedPath(f"refused: {what} {text!r} is empty or not a path")
    if text.startswith("/"):
        raise RefusedPath(f"refused: {what} {text!r} is absolute; run data may name only files inside the run "
                          "directory")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise RefusedPath(f"refused: {what} {text!r} contains '..', which would leave the run directory")
    return parts


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


@contextlib.contextmanager
def _directory(root: Path, parts: list[str], shown: str) -> Iterator[int]:
    """An fd of ``root/parts...``: the root as given (followed), every part below it opened with O_NOFOLLOW."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        for n, name in enumerate(parts):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    mode = _lmode(fd, name)
                    where = "/".join(parts[:n + 1])
                    if mode is not None and stat.S_ISLNK(mode):
                        raise RefusedPath(f"refused: {shown}: {where} is a symlink, and symlinks inside a run "
                                          "directory are not followed") from None
                    raise FileNotFoundError(errno.ENOENT, f"{where} is not a directory", shown) from None
                raise
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def _lmode(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None


def _open_regular(dir_fd: int, name: str, shown: str) -> int:
    """An fd of the regular file ``name`` in ``dir_fd``; RefusedPath for anything else (never opened: a FIFO would
    block, a device could do anything); FileNotFoundError if there is nothing there."""
    mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        raise RefusedPath(f"refused: {shown} is {_kind(mode)}, not a regular file")
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink since the check
            raise RefusedPath(f"refused: {shown} is a symlink, and symlinks inside a run directory are not "
                              "followed") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise RefusedPath(f"refused: {shown} is {_kind(mode)}, not a regular file")
    return fd


def _open(root: Path, rel: str | os.PathLike[str]) -> tuple[int, str]:
    """(an fd of the regular file ``rel`` below ``root``, read-only; its path for messages), by this module's
    rules; the caller closes the fd."""
    parts = relative_parts(rel)
    shown = str(Path(root, *parts))
    if not parts:
        raise RefusedPath(f"refused: {shown} is the directory itself, not a file in it")
    with _directory(root, parts[:-1], shown) as parent:
        fd = _open_regular(parent, parts[-1], shown)
    sys.audit("harness.run_files.open", shown)  # the path os.open's own event cannot show (it is dir_fd-relative)
    return fd, shown


def _over(shown: str, size: int, limit: int) -> RefusedPath:
    return RefusedPath(f"refused: {shown} is {size} bytes, over the {limit}-byte bound for such a file")


def read_bytes(root: Path, rel: str | os.PathLike[str], limit: int) -> bytes:
    """The content of the regular file ``rel`` below ``root``; RefusedPath if it holds more than ``limit`` bytes."""
    fd, shown = _open(root, rel)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _over(shown, size, limit)
        chunks, got = [], 0
        while True:
            chunk = os.read(fd, min(limit + 1 - got, 8 * MiB))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            got += len(chunk)
            if got > limit:  # it grew while being read
                raise _over(shown, got, limit)
    finally:
        os.close(fd)


def read_text(root: Path, rel: str | os.PathLike[str], limit: int, errors: str = "strict") -> str:
    """``read_bytes`` decoded as UTF-8."""
    return read_bytes(root, rel, limit).decode("utf-8", errors)


def read_tail(root: Path, rel: str | os.PathLike[str], limit: int) -> tuple[bytes, int]:
    """The last ``limit`` bytes of the regular file ``rel`` below ``root`` (all of it if smaller), and the size it
    had (more than ``limit``: the beginning was not read)."""
    fd, _ = _open(root, rel)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            os.lseek(fd, size - limit, os.SEEK_SET)
        chunks, got = [], 0
        while got < limit:
            chunk = os.read(fd, min(limit - got, 8 * MiB))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


class _Bounded(io.RawIOBase):
    """A raw reader of an fd that refuses to read past ``limit`` bytes (the file may grow while it is read)."""

    def __init__(self, fd: int, shown: str, limit: int) -> None:
        self._fd, self._shown, self._limit, self._got = fd, shown, limit, 0

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = os.read(self._fd, min(len(buffer), self._limit + 1 - self._got))
        self._got += len(data)
        if self._got > self._limit:
            raise _over(self._shown, self._got, self._limit)
        buffer[:len(data)] = data
        return len(data)


@contextlib.contextmanager
def open_binary(root: Path, rel: str | os.PathLike[str], limit: int) -> Iterator[io.BufferedReader]:
    """The regular file ``rel`` below ``root`` as a byte stream (read line by line, never whole); RefusedPath if it
    is, or grows, larger than ``limit`` bytes."""
    fd, shown = _open(root, rel)
    raw = _Bounded(fd, shown, limit)  # owns the fd from here
    with io.BufferedReader(raw) as stream:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _over(shown, size, limit)
        yield stream


def entries(root: Path, rel: str | os.PathLike[str] = ".") -> dict[str, int]:
    """The directory ``rel`` below ``root``: each entry's name and mode, symlinks not followed (an entry that is a
    symlink has ``stat.S_ISLNK``; the directory itself may not be one). FileNotFoundError if there is none."""
    parts = relative_parts(rel)
    with _directory(root, parts, str(Path(root, *parts))) as fd:
        out = {}
        for name in os.listdir(fd):
            mode = _lmode(fd, name)
            if mode is not None:
                out[name] = mode
        return out


def sqlite_readonly(root: Path, rel: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to the SQLite database ``rel`` below ``root`` (rows by name). The database and its
    ``-wal``, ``-shm`` and ``-journal`` files must be regular files reached without a symlink (SQLite opens them by
    name and may write the ``-shm``); its schema is not trusted (no functions from views or triggers)."""
    parts = relative_parts(rel)
    shown = str(Path(root, *parts))
    os.close(_open(root, rel)[0])
    with _directory(root, parts[:-1], shown) as fd:
        for suffix in ("-wal", "-shm", "-journal"):
            mode = _lmode(fd, parts[-1] + suffix)
            if mode is not None and not stat.S_ISREG(mode):
                raise RefusedPath(f"refused: {shown}{suffix} is {_kind(mode)}, not a regular file")
    conn = sqlite3.connect(f"file:{quote(str(Path(root, *parts)))}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA trusted_schema=OFF")
    return conn


@dataclass(frozen=True)
class FileId:
    """Which file a name held when it was written: its device, inode and owner (``identify``). A file that has
    since been replaced, or one only named after the fact, has another."""

    dev: int
    ino: int
    uid: int


def identify(dir_fd: int, name: str) -> FileId:
    """The ``FileId`` of the entry ``name`` in the directory ``dir_fd``, not following a symlink."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return FileId(st.st_dev, st.st_ino, st.st_uid)


def remove_written(root: Path, rel: str | os.PathLike[str], written: FileId) -> str | None:
    """Remove the file ``rel`` below ``root`` (this module's rules: no ``..``, no symlink on the way) only if it
    is still the regular file that was written: the same device, inode and owner, by an lstat relative to its
    folder's descriptor, and owned by the effective uid. None when it was removed; else why it was left alone
    (gone, refused, replaced, not a regular file)."""
    try:
        parts = relative_parts(rel)
        shown = str(Path(root, *parts))
        if not parts:
            return f"{shown} is the folder itself"
        with _directory(root, parts[:-1], shown) as fd:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return f"{shown} is {_kind(st.st_mode)}, not a regular file"
            if FileId(st.st_dev, st.st_ino, st.st_uid) != written or st.st_uid != os.geteuid():
                return f"{shown} is not the file that was written there (another device, inode or owner)"
            os.unlink(parts[-1], dir_fd=fd)
    except FileNotFoundError:
        return f"{Path(root, rel)} is gone"
    except RefusedPath as exc:
        return str(exc)
    except OSError as exc:
        return f"{Path(root, rel)} cannot be removed ({exc.strerror})"
    return None


def below(*pieces: str | os.PathLike[str], what: str = "path") -> PurePosixPath:
    """The pieces (each a relative path from run data, checked as ``relative_parts`` does) joined into one path."""
    return PurePosixPath(*[p for piece in pieces for p in relative_parts(piece, what)])

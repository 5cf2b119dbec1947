"""Small durable-file and SQLite helpers shared by the environments, the stores, the checkpoint queue, the effect
ledger and the run directory."""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import time
from pathlib import Path

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path | str, data: bytes, *, fsync: bool = True, dir_fd: int | None = None) -> None:
    """Replace ``path`` with ``data``: a crash leaves the old content or the new, never a mix.

    The data goes to a fresh temporary file beside it, created exclusively and without following a symlink
    (``O_CREAT|O_EXCL|O_NOFOLLOW``, a name no one can plant in advance), then renamed over ``path``; a rename
    replaces a symlink at ``path`` rather than writing through it. The directory is the caller's. ``dir_fd``: a
    descriptor of that directory, and ``path`` a name in it (nothing on the way to it is looked up again)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    if dir_fd is not None:
        tmp, path = Path(tmp.name), Path(path.name)
    fd = os.open(tmp, _TEMP_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if fsync:
        if dir_fd is None:
            fsync_dir(path.parent)
        else:
            os.fsync(dir_fd)


def link_atomic(folder: Path, name: str, target: str) -> None:
    """Point the symlink ``folder/name`` at ``target``, atomically: the link is made under a fresh random name in
    ``folder`` (``symlink`` never follows or reuses anything already there), then renamed over ``name`` (which
    replaces a symlink there rather than following it). Relative to a descriptor of ``folder``, opened once."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        os.symlink(target, tmp, dir_fd=fd)
        try:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def connect_wal(path: Path) -> sqlite3.Connection:
    """A connection several processes can share: WAL, autocommit, a generous busy timeout, rows by name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA busy_timeout=30000")
    # Switching a new file to WAL can fail at once ("database is locked", no busy wait) while another process
    # opening it does the same: try again for as long as the busy timeout would have waited.
    deadline = time.monotonic() + 30.0
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return db
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                db.close()
                raise
            time.sleep(0.01)

"""Paths only the invoking user controls: the harness's private temporary directories, and the test of a file a
run directory names before anything in it is trusted (standard library only).

Another local user can make a directory in a shared ``/tmp`` first, or leave a file where a received run
directory points; whatever such a path holds must never be imported, executed or used as a cache.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def private_dir(path: Path) -> Path | None:
    """``path`` as a directory of this user's alone: made mode 0700 if missing, and then (or if it existed)
    checked without following links: a directory, owned by the effective uid, open to no one else. None if it
    is anything else (another user's, open to others, a symlink): the caller must not use it."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return path


def control_problem(path: Path) -> str | None:
    """Why ``path`` is not a file that only the invoking user could have written (None: it is one).

    It must resolve to a regular file owned by the effective uid and not writable by group or others; and every
    directory above it (after resolving links) must be owned by that uid or root and not writable by group or
    others, unless sticky (as ``/tmp``: others cannot rename or remove what they do not own). The same rule as
    OpenSSH's for ``authorized_keys``. Read the file at ``os.path.realpath(path)``: that is what was checked."""
    try:
        real = Path(os.path.realpath(path, strict=True))
        st = os.lstat(real)
    except OSError as exc:
        return f"cannot be read here ({exc.strerror})"
    euid = os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        return f"is not a regular file ({real})"
    if st.st_uid != euid:
        return f"is owned by uid {st.st_uid}, not by you (uid {euid})"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    for parent in real.parents:
        st = os.lstat(parent)
        if st.st_uid not in (euid, 0):
            return f"is in {parent}, owned by uid {st.st_uid} (neither you nor root)"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"is in {parent}, which others can write (mode {stat.S_IMODE(st.st_mode):o})"
    return None

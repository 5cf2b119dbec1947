"""Paths only the invoking user controls: the harness's private temporary directories, the test of a file a
run directory names before anything in it is trusted, and the folders a command writes its output into (standard
library only).

Another local user can make a directory in a shared ``/tmp`` first, or leave a file where a received run
directory points; whatever such a path holds must never be imported, executed or used as a cache, and no output
goes into a folder they could change (``own_folder``, ``own_subfolder``).
"""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path

#: how many symlinks resolving a folder the user named may pass through (the kernel's own bound)
_MAX_LINKS = 40


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


def user_temp_dir(name: str) -> Path | None:
    """``$TMPDIR/<name>-<euid>`` as a directory of this user's alone (``private_dir``); None if it cannot be one."""
    import tempfile

    return private_dir(Path(tempfile.gettempdir()) / f"{name}-{os.geteuid()}")


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
        if problem := _above_problem(parent, os.lstat(parent)):
            return problem
    return None


def _above_problem(folder: Path, st: os.stat_result) -> str | None:
    """Why the directory ``folder`` (``st``: its lstat) lets another user change what is below it (None: it
    does not): it must be owned by the effective uid or root, and not writable by group or others unless sticky
    (as ``/tmp``: others cannot rename or remove what they do not own)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"is in {folder}, owned by uid {st.st_uid} (neither you nor root)"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"is in {folder}, which others can write (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class UnsafeFolder(ValueError):
    """An output folder another local user could change: theirs, writable by others, below a folder of theirs,
    reached through their symlink, or a symlink below the folder the user named. ``str()`` is the one line a
    command prints before it exits 2: the folder, why, and what to do."""


def _refuse(shown: Path, why: str, todo: str) -> UnsafeFolder:
    return UnsafeFolder(f"refused: output folder {shown} {why}; {todo}")


def _own_problem(st: os.stat_result) -> tuple[str, str] | None:
    """(why, what to do) if the directory entry ``st`` (an lstat) is not a folder of the invoking user's alone."""
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink, and no folder below --out is reached through one", "remove the link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder", "remove it, or name another --out"
    if st.st_uid != euid:
        return (f"is owned by uid {st.st_uid}, not by you (uid {euid}), who could change what is written there",
                "use a folder of your own (a missing one is made for you)")
    if st.st_mode & 0o022:
        return (f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})",
                "use a folder of your own inside it" if st.st_mode & stat.S_ISVTX  # a shared one, as /tmp
                else "chmod go-w it, or use another folder")
    return None


def _resolve(path: Path) -> tuple[Path, list[str]]:
    """``path`` resolved as the kernel would, every step checked: (the deepest folder that exists, as a real
    path; the names still missing below it). Every folder passed through must pass ``_above_problem``, and every
    symlink followed must be owned by the effective uid or root (a link in a folder of its own lets another user
    point it anywhere, including at a folder of yours). UnsafeFolder otherwise."""
    current, todo, links = Path("/"), deque(Path(os.getcwd(), path).parts[1:]), 0
    if problem := _above_problem(current, os.lstat(current)):
        raise _refuse(path, problem, "use a folder elsewhere")
    while todo:
        name = todo.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent  # current is real, and its parents were passed through
            continue
        step = current / name
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return current, [name, *todo]
        except OSError as exc:
            raise _refuse(path, f"cannot be reached ({step}: {exc.strerror})", "name a folder you can reach") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (os.geteuid(), 0):
                raise _refuse(path, f"is reached through {step}, a symlink owned by uid {st.st_uid} (neither you "
                                    "nor root)", "name the folder itself, not the link")
            links += 1
            if links > _MAX_LINKS:
                raise _refuse(path, f"is reached through more than {_MAX_LINKS} symlinks", "name the folder itself")
            target = Path(os.readlink(step))
            if target.is_absolute():
                current = Path("/")
            todo.extendleft(reversed(target.parts[1:] if target.is_absolute() else target.parts))
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, f"is not a folder ({step} is not one)", "name a folder, or a path that does not exist")
        if todo and (problem := _above_problem(step, st)):
            raise _refuse(path, problem, "use a folder elsewhere")
        current = step
    return current, []


#: folders that passed ``own_folder`` in this process, by real path: (path, (device, inode)). The same folder is
#: judged again by itself only: the folders above it were yours or root's, which no other user can change. (In a
#: user namespace of its own, ``testbed.isolation``, root's folders no longer read as root's: a runs root is checked
#: before the process moves there.)
_passed: dict[str, tuple[Path, tuple[int, int]]] = {}


def own_folder(path: Path) -> Path:
    """``path``, a folder the user named for a command's output (``--out``), as a folder of the invoking user's
    alone; its real path. Missing folders are made (mode 0755: never writable by others, whatever the umask),
    each only inside a folder that passes the same test. Then, the rule OpenSSH holds ``authorized_keys`` to:
    the folder is owned by the effective uid and writable by no one else (no group or other write bit); every
    folder above it is owned by that uid or root and not writable by others unless sticky (``/tmp``); every
    symlink on the way is owned by that uid or root. Otherwise ``UnsafeFolder``, naming the folder, why, and
    what to do. Nothing is written before the test passes: another user who made the folder first (in ``/tmp``,
    say) cannot get a file of yours deleted, overwritten or written where they point."""
    path = Path(path)
    known = _passed.get(os.path.realpath(path))
    if known is not None:  # passed here before: the folders above it are yours or root's, not for others to change
        try:
            st = os.lstat(known[0])
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == known[1] and _own_problem(st) is None:
            return known[0]
    for _ in range(len(Path(os.getcwd(), path).parts) + _MAX_LINKS + 2):
        real, missing = _resolve(path)
        if not missing:
            st = os.lstat(real)
            problem = _own_problem(st)
            if problem:
                raise _refuse(path, *problem)
            _passed[str(real)] = (real, (st.st_dev, st.st_ino))
            return real
        if ".." in missing:
            raise _refuse(path, f"names a missing folder ({real / missing[0]}) followed by '..'",
                          "name the folder without '..'")
        if problem := _above_problem(real, os.lstat(real)):  # a folder is made only where no one else can meddle
            raise _refuse(path, problem, "use a folder elsewhere")
        try:
            os.mkdir(real / missing[0], 0o755)  # never follows a symlink: one there (or anything) is EEXIST
        except FileExistsError:
            pass  # made meanwhile, by anyone: the next pass judges it
        except OSError as exc:
            raise _refuse(path, f"cannot be made ({real / missing[0]}: {exc.strerror})", "name another folder") from None
    raise _refuse(path, "keeps changing while it is made", "try again")


def own_subfolder(folder: Path, name: str, *, create: bool = True) -> Path | None:
    """``folder/name``: a folder below ``folder`` (a path ``own_folder`` returned), each part of ``name``
    (``a`` or ``a/b``) made mode 0755 if missing, none of them reached through a symlink (one is refused, never
    followed, whoever owns it), each a folder of the invoking user's alone (``own_folder``'s rule); else
    ``UnsafeFolder``. ``create=False``: only checks what is there, and returns None if a part is missing."""
    path = Path(folder)
    for part in Path(name).parts:
        if part in ("", ".", "..", "/"):
            raise _refuse(Path(folder, name), "is not a plain name below --out", "name a folder below it")
        path = path / part
        if create:
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                pass
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if create:
                raise
            return None
        if problem := _own_problem(st):
            raise _refuse(path, *problem)
    return path

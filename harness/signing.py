"""Which run directories this user made: ``run.json`` signed with a key only this user can read.

Every time the harness writes a run's ``run.json`` it writes ``run.sig`` beside it: an HMAC-SHA256 of the file's
exact bytes, keyed by a per-user secret, the **run key** (``$XDG_CONFIG_HOME/durable-agent-harness/run-key``, by
default ``~/.config/durable-agent-harness/run-key``: 32 random bytes, mode 0600 in a 0700 folder, made on first
use). A signature that verifies means this user's harness wrote exactly this run.json, so what it records as
given on this user's command line (the target file) may be used again. Copying, extracting or editing a run
directory cannot make one: whoever crafted it does not hold the key, and ownership of the files proves nothing
(a copy is owned by whoever copied it).

What a signature does not say: that the other files of the run (the operation log, histories, ledgers) are as
written; they stay data, read by ``harness.run_files``' rules.

Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from harness.private import private_dir

log = logging.getLogger(__name__)

#: beside run.json: ``hmac-sha256 <hex>``
SIGNATURE = "run.sig"
KEY_NAME = "run-key"
_PREFIX = "hmac-sha256 "
_KEY_BYTES = 32
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class NoRunKey(Exception):
    """This user's run key cannot be made or read here; the message says where and why."""


def key_dir() -> Path:
    """Where the run key lives: ``$XDG_CONFIG_HOME/durable-agent-harness`` (default ``~/.config/...``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "durable-agent-harness"


#: keys read by this process, by path (read once: a check signs and verifies many times)
_keys: dict[Path, bytes] = {}


def run_key() -> bytes:
    """This user's run key, made on first use; ``NoRunKey`` if its folder or file is not this user's alone."""
    folder = key_dir()
    if folder / KEY_NAME in _keys:
        return _keys[folder / KEY_NAME]
    if not folder.parent.is_dir():
        with contextlib.suppress(OSError):
            folder.parent.mkdir(parents=True, exist_ok=True)
    if private_dir(folder) is None:
        raise NoRunKey(f"{folder} is not a folder of yours alone (it must be owned by you, mode 0700, not a link)")
    path = folder / KEY_NAME
    try:
        _keys[path] = _read_key(path)
        return _keys[path]
    except FileNotFoundError:
        pass
    # A new key, written whole under a name of its own, then linked into place: a second process making one at
    # the same moment either wins or reads the winner's.
    tmp = folder / f".{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_bytes(_KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        log.info("made this user's run key, %s", path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    _keys[path] = _read_key(path)
    return _keys[path]


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise NoRunKey(f"{path} cannot be read ({exc.strerror}; a link is never followed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise NoRunKey(f"{path} is not a file of yours alone (owned by you, mode 0600)")
        key = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != _KEY_BYTES:
        raise NoRunKey(f"{path} is not a run key ({len(key)} bytes, not {_KEY_BYTES}); remove it to make a new one")
    return key


def signature(data: bytes, key: bytes | None = None) -> str:
    """``run.sig``'s content for ``data`` (run.json's bytes); ``NoRunKey`` without a key."""
    return _PREFIX + hmac.new(key or run_key(), data, hashlib.sha256).hexdigest() + "\n"


def sign(run_json: Path, data: bytes) -> None:
    """Write ``run.sig`` beside ``run_json`` for its bytes ``data``, atomically; without a run key, remove any
    stale one and log why (the run is then not recognised as this user's: its target must be given again)."""
    from harness.durable_files import write_atomic

    sig = run_json.with_name(SIGNATURE)
    try:
        text = signature(data)
    except (NoRunKey, OSError) as exc:
        log.warning("run.json is not signed (%s): checking or rerunning this run will need --target", exc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sig)
        return
    write_atomic(sig, text.encode(), fsync=False)


def unsigned_reason(run_json: Path, data: bytes) -> str | None:
    """None if ``run.sig`` beside ``run_json`` is this user's signature of ``data`` (run.json's bytes as read);
    else why not, as a clause ("it carries no signature", ...)."""
    from harness import run_files

    try:
        sig = run_files.read_bytes(run_json.parent, SIGNATURE, 256).decode("ascii", "replace")
    except FileNotFoundError:
        return "it carries no signature (run.sig): it was not made by this harness as you"
    except (OSError, run_files.RefusedPath) as exc:
        return f"its signature cannot be read ({str(exc)[:200]})"
    try:
        expected = signature(data)
    except (NoRunKey, OSError) as exc:
        return f"your run key cannot be read ({exc})"
    if not hmac.compare_digest(sig.strip().encode(), expected.strip().encode()):
        return ("its signature is not yours: it was made by another user or machine, or run.json was changed "
                "since")
    return None

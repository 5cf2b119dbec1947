"""A PostgreSQL server this harness owns: a data dir it creates, a free TCP port, a unix-socket dir of its own
(in a short private temporary directory, as a socket's path may not exceed 107 bytes: ``harness.owner.owned_tempdir``,
removed when the server stops and, whatever ends this process, with it).

    with PostgresServer(state_dir / "postgres") as pg:      # initdb on first use, then postgres
        url = pg.url                     # postgresql://postgres@127.0.0.1:PORT/postgres?passfile=STATE/postgres.pgpass
        pg.kill(); pg.start()                               # a crash (every server process SIGKILLed), a restart

It has what ``testbed.engines.base.Engine.server`` asks of a server (``start``, ``kill``, ``pid``, ``port``,
``address``, ``ui_url`` None, context manager), so the ``restart_server`` nemesis restarts the database unchanged.
The binaries are PostgreSQL's (``$DAH_POSTGRES_BIN``, else the newest ``/usr/lib/postgresql/<n>/bin``, else
``PATH``). PostgreSQL refuses to run as root: under root, initdb and the server run as the ``postgres`` user
(``setpriv``, which execs, so the pid is the postmaster's), and every directory above the data dir must be
searchable by that user. Durability is PostgreSQL's defaults (fsync on, synchronous_commit on), untouched.

It admits only the harness: initdb sets a generated password for the superuser and ``scram-sha-256`` for every
connection (TCP and the unix socket), and the password lives only in ``password_file(data_dir)`` (a libpq password
file, mode 0600, beside the data dir), which the URL names by path (``passfile=``), so neither argv, logs nor
``run.json`` carry it. The server dies with the harness: its parent-death signal (SIGINT, PostgreSQL's fast
shutdown) is set after ``setpriv``'s change of user, which clears the one ``testbed.processes.spawn`` set; the
postmaster's helpers exit when it does.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from urllib.parse import quote

from harness.owner import owned_tempdir
from testbed.processes import ServerProcess, ensure_reaper, free_port, spawn

ENV_BIN = "DAH_POSTGRES_BIN"
USER = "postgres"  # the OS user the server runs as under root, and the database superuser
START_TIMEOUT_S = 30.0


class PostgresError(RuntimeError):
    """PostgreSQL is missing, or could not be set up or started (the message says which, and what to do)."""


def password_file(data_dir: Path) -> Path:
    """Where the superuser's password of the cluster in ``data_dir`` is kept (a libpq password file)."""
    data_dir = Path(data_dir).resolve()
    return data_dir.parent / f"{data_dir.name}.pgpass"


def database_url(host: str, port: int, passfile: Path, database: str = "postgres") -> str:
    """A URL libpq (psycopg, SQLAlchemy) connects with: the password is read from ``passfile``, never carried."""
    return f"postgresql://{USER}@{host}:{port}/{database}?passfile={quote(str(passfile), safe='/')}"


def _check_password_file(path: Path) -> None:
    """``PostgresError`` unless ``path`` is a private regular file of ours (libpq would ignore or misuse it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise PostgresError(f"cannot read the PostgreSQL password file {path} ({exc.strerror}); a data dir made "
                            "without one (an older harness, trust auth) must be deleted and made again") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
        raise PostgresError(f"the PostgreSQL password file {path} is not a private file of this user (owner "
                            f"{st.st_uid}, mode {oct(st.st_mode & 0o777)}); delete the data dir and the file")


def _write_password(path: Path) -> str:
    """A new password in a new libpq password file (0600, refused if the path exists)."""
    password = secrets.token_urlsafe(32)  # no ':' or backslash: nothing to escape in a password file
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"*:*:*:{USER}:{password}\n")
    return password


def find_bin(name: str) -> str:
    """The path of one of PostgreSQL's binaries; ``PostgresError`` naming it if it is not installed."""
    dirs = [os.environ[ENV_BIN]] if os.environ.get(ENV_BIN) else sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name) if
        Path(d).parent.name.isdigit() else 0, reverse=True)
    for d in dirs:
        if os.access(Path(d) / name, os.X_OK):
            return str(Path(d) / name)
    found = shutil.which(name)
    if found is None:
        raise PostgresError(f"PostgreSQL's {name} is not installed (looked in {', '.join(dirs) or 'no lib dir'} and "
                            f"PATH); install PostgreSQL (apt-get install postgresql) or set ${ENV_BIN} to its bin dir")
    return found


class PostgresServer(ServerProcess):
    """``data_dir`` (created by initdb if empty) served on a free port of 127.0.0.1; logs to ``log_dir``."""

    name = "postgres"
    error = PostgresError

    def __init__(self, data_dir: Path, log_dir: Path | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.socket_dir: Path | None = None  # made at the first start: short, as a socket's path must be (107 bytes)
        self.log_file = Path(log_dir or self.data_dir.parent).resolve() / "postgres.log"
        self.passfile = password_file(self.data_dir)
        self.host, self.port = host, port
        self.ui_url: str | None = None
        self.startup_timeout_s = START_TIMEOUT_S
        self._proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return database_url(self.host, self.port, self.passfile)

    def _as_user(self, pdeathsig: str = "KILL") -> list[str]:
        """The prefix that runs a PostgreSQL binary as ``postgres`` when we are root (nothing otherwise), with the
        parent-death signal ``pdeathsig`` set again after the switch (a change of user clears it)."""
        if os.geteuid() != 0:
            return []
        return ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", f"--pdeathsig={pdeathsig}", "--"]

    def prepare(self) -> None:
        """The port, the data dir (initdb on first use) and the socket dir, owned by the user the server runs as."""
        self.port = self.port or free_port(self.host)
        self._isready = find_bin("pg_isready")
        for d in (self.data_dir, self.log_file.parent):
            d.mkdir(parents=True, exist_ok=True)
        if self.socket_dir is None:
            ensure_reaper()  # removes the directory below if this process is SIGKILLed
            own = owned_tempdir("pg")
            self.socket_dir = own / "socket"
            self.socket_dir.mkdir(mode=0o700)  # only its owner reaches the socket
            if os.geteuid() == 0:
                os.chmod(own, 0o711)  # the server's account passes through, and lists nothing
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(USER)
            except KeyError:
                raise PostgresError(f"running as root, PostgreSQL needs the OS user {USER!r}, which does not exist; "
                                    "install PostgreSQL's package (it creates it) or run as another user") from None
            for d in (self.data_dir, self.socket_dir):
                os.chown(d, user.pw_uid, user.pw_gid)  # type: ignore[arg-type]
            os.chmod(self.data_dir, 0o700)
            self._check_searchable(user.pw_uid)
        if (self.data_dir / "PG_VERSION").exists():
            _check_password_file(self.passfile)  # fails early, naming the file, for a cluster made without one
            return
        self.passfile.unlink(missing_ok=True)  # a password of an earlier, failed initdb
        password = _write_password(self.passfile)
        assert self.socket_dir is not None
        pwfile = self.socket_dir / "initdb.pw"  # where the postgres account can read it, for initdb only
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        try:
            proc = spawn([*self._as_user(), find_bin("initdb"), "-D", str(self.data_dir), "-U", USER,
                          "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
            try:
                out, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out = f"no exit within 120 s; killed\n{proc.communicate()[0]}"
        finally:
            pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise PostgresError(f"initdb {self.data_dir} failed ({proc.returncode}): {out[-1500:]}")

    def _check_searchable(self, uid: int) -> None:
        for d in [*reversed(self.data_dir.parents)]:
            st = d.stat()
            if not (st.st_mode & 0o001 or (st.st_uid == uid and st.st_mode & 0o100)):
                raise PostgresError(f"the PostgreSQL server runs as {USER!r}, which cannot enter {d} (mode "
                                    f"{oct(st.st_mode & 0o777)}); put the state dir where it can (e.g. under /tmp "
                                    f"directly), or chmod o+x {d}")

    def argv(self) -> list[str]:
        return [*self._as_user(pdeathsig="INT"), find_bin("postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-k", str(self.socket_dir), "-c", f"listen_addresses={self.host}", "-c", "max_connections=200"]

    def log_path(self) -> Path:
        return self.log_file

    def ready(self) -> bool:
        """``pg_isready``: the server accepts connections."""
        return subprocess.run([self._isready, "-h", self.host, "-p", str(self.port), "-U", USER, "-q"],
                              capture_output=True).returncode == 0

    def awaited(self) -> str:
        return f"on {self.address}"

    def kill(self) -> None:
        """SIGKILL every server process (the postmaster's process group): a crash. Committed data survives."""
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
            self._ended()

    def stop(self, grace_s: float = 15.0) -> None:
        """A fast shutdown (SIGINT: PostgreSQL's own), a kill if it lingers."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir.parent, ignore_errors=True)
            self.socket_dir = None

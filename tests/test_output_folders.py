"""Output folders are ours or refused (issue 40, item 3).

A security probe found that ``dah-report --out DIR``, when another local user had made DIR first (its own help
suggests ``/tmp/report``), followed what they planted: through a forged ``.reports-manifest.json`` and symlinks,
root deleted a file the attacker named, overwrote a root-only 0600 file with JSON and wrote figures into a
root-only folder; and ``dah-chaos run --out`` followed a planted scenario-folder symlink into a 0700 folder.

Now a folder a command writes into, and each folder it makes below it, is the invoking user's alone (owned by the
effective uid, writable by no one else; the rule OpenSSH holds ``authorized_keys`` to), or the command says which
and why in one line and exits 2 before writing anything; below it no symlink is followed; and a report's manifest
removes only files this tool wrote (the same device, inode and owner). The other user is real: uid 65534 makes
its folder and plants its files through ``setpriv``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import harness
from harness.rundir import LATEST, RUN_JSON, RunDir
from cli import report as report_cli
from tests.test_reports import STAMP, write_bench

#: the checkout whose code is under test (what ``python -m ...`` runs from, in a subprocess)
ROOT = Path(harness.__file__).resolve().parent.parent
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root, to act as another local user (uid 65534, through setpriv)")


def as_nobody(script: str) -> None:
    """``script`` run by ``sh`` as uid 65534: what another local user does."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "sh", "-ec",
                    script], check=True, timeout=30)


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (and ``top``), not following links: kind, mode, owner, mtime and content."""
    out: dict[str, tuple] = {}
    if not os.path.lexists(top):
        return out
    paths = [top] + [Path(d, n) for d, dirs, files in os.walk(top) for n in dirs + files]
    for p in paths:
        s = os.lstat(p)
        if os.path.islink(p):
            what: object = ("link", os.readlink(p))
        elif p.is_dir():
            what = ("dir",)
        else:
            what = ("file", p.read_bytes())
        out[str(p.relative_to(top))] = (what, s.st_mode, s.st_uid, s.st_mtime_ns, s.st_size)
    return out


@pytest.fixture
def shared():
    """A folder like /tmp: root's, sticky, writable by everyone (pytest's own temp folders are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="dah-shared-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_root_only(path: Path) -> Path:
    """A root-only folder (0700) holding a root-only file (0600) and a subfolder: what must never be touched."""
    path.mkdir(mode=0o700)
    (path / "secret.txt").write_text("root's secret\n")
    os.chmod(path / "secret.txt", 0o600)
    (path / "inner").mkdir(mode=0o700)
    (path / "inner" / "keep.txt").write_text("kept\n")
    return path


@pytest.fixture
def root_only(shared: Path) -> Path:
    return make_root_only(shared / "root-only")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny runs folder whose report has one figure (the bench run's recovery section)."""
    runs = tmp_path_factory.mktemp("runs") / "runs"
    write_bench(runs / "bench" / STAMP, files=["recovery"])
    return runs


@pytest.fixture(scope="module")
def empty_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder with nothing in it: the fastest report there is."""
    runs = tmp_path_factory.mktemp("empty") / "runs"
    runs.mkdir()
    return runs


def report(runs: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m reports`` (dah-report), the real command, from the checkout under test."""
    return subprocess.run([sys.executable, "-m", "reports", "--runs", str(runs), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def command(*args: str) -> tuple[int | None, str]:
    """``python -m ARGS...``, the real command: its exit status and stderr. Refused, it exits at once; one that
    starts a cluster instead (the old code) is stopped after 90 s, by its process group (status None)."""
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=90)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its id
        _, err = proc.communicate()
        return None, err


def chaos_run(out: Path, scenario: str = "kill_idle") -> tuple[int | None, str]:
    """``dah-chaos run SCENARIO --out OUT``."""
    return command("chaos", "run", scenario, "--out", str(out))


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- another user made the folder first


def test_a_report_folder_another_user_made_first_is_refused_and_nothing_is_touched(runs, shared, root_only):
    """The probe's attack: uid 65534 makes the --out folder first, with a manifest naming a root-only file through
    a symlink, a symlink at the manifest's old temporary name to a root-only 0600 file, and ``figures`` a symlink
    to a root-only folder. Refused in one line, exit 2; their files and root's untouched, nothing written."""
    out = shared / "report"
    as_nobody(f"""
        mkdir {out}
        echo '["victim/secret.txt", "victim/inner/keep.txt"]' > {out}/.reports-manifest.json
        ln -s {root_only} {out}/victim
        ln -s {root_only}/secret.txt {out}/.reports-manifest.tmp
        ln -s {root_only}/inner {out}/figures
        echo theirs > {out}/attacker.txt
    """)
    theirs, roots = snapshot(out), snapshot(root_only)
    r = report(runs, out)
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(out) in line and f"uid {NOBODY}" in line and "use a folder of your own" in line
    assert snapshot(out) == theirs
    assert snapshot(root_only) == roots


def test_a_runs_root_another_user_made_first_is_refused_by_chaos_run_before_any_cluster(shared, root_only):
    """``dah-chaos run --out DIR``, DIR made by uid 65534 with a scenario-folder symlink into a root-only folder:
    one line, exit 2, at once (no cluster starts); nothing written in either."""
    out = shared / "runs"
    as_nobody(f"mkdir {out} && ln -s {root_only}/inner {out}/kill_idle")
    theirs, roots = snapshot(out), snapshot(root_only)
    code, err = chaos_run(out)
    assert code == 2, err
    line = one_line(err)
    assert str(out) in line and f"uid {NOBODY}" in line
    assert snapshot(out) == theirs
    assert snapshot(root_only) == roots


@pytest.mark.parametrize("args", [["chaos", "suite"], ["chaos", "soak", "kill_idle", "--seeds", "1"],
                                  ["chaos", "planted"], ["benchmarks", "--quick"], ["migration_fuzz"]],
                         ids=lambda a: " ".join(a[:2]))
def test_every_command_with_a_runs_root_refuses_another_users(shared, args):
    """dah-chaos suite, soak and planted, dah-bench, dah-fuzz: the same line, exit 2, nothing written."""
    out = shared / "runs"
    as_nobody(f"mkdir {out}")
    code, err = command(*args, "--out", str(out))
    assert code == 2, err
    line = one_line(err)
    assert str(out) in line and f"uid {NOBODY}" in line
    assert os.listdir(out) == []


def test_run_directories_are_never_made_in_another_users_runs_root(shared, root_only):
    """What the runner, the soak, the benchmarks and the fuzzer call: ``RunDir.create`` refuses the root."""
    out = shared / "runs"
    as_nobody(f"mkdir {out}")
    with pytest.raises(ValueError, match=f"owned by uid {NOBODY}"):
        RunDir.create(out / "kill_idle")
    assert os.listdir(out) == []


# ---------------------------------------------------------------- a folder others can write


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=lambda m: f"{m:o}")
def test_a_report_folder_others_can_write_is_refused(empty_runs, tmp_path, mode):
    out = tmp_path / "report"
    out.mkdir()
    os.chmod(out, mode)
    r = report(empty_runs, out)
    assert r.returncode == 2, r.stderr
    line = one_line(r.stderr)
    assert str(out) in line and f"writable by others (mode {mode:o})" in line and "chmod go-w" in line
    assert os.listdir(out) == []


def test_a_runs_root_others_can_write_is_refused(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    os.chmod(out, 0o777)
    with pytest.raises(ValueError, match="writable by others"):
        RunDir.create(out / "kill_idle")
    assert os.listdir(out) == []


def test_folders_that_are_ours_keep_working_and_missing_ones_are_made_safe(empty_runs, tmp_path):
    """A 0755 folder of ours is used as before; missing ones (and every one made below) are made 0755."""
    old = os.umask(0o002)  # a user-private-group umask must not make them group-writable
    try:
        mine = tmp_path / "mine"
        mine.mkdir(mode=0o755)
        assert report(empty_runs, mine).returncode == 0
        assert (mine / "report.md").is_file()
        made = tmp_path / "a" / "b" / "runs"
        run = RunDir.create(made / "kill_idle")
        for folder in (tmp_path / "a", tmp_path / "a" / "b", made, made / "kill_idle", run.path):
            st = os.lstat(folder)
            assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, (folder, oct(st.st_mode))
    finally:
        os.umask(old)


# ---------------------------------------------------------------- symlinks planted in our own folder


def test_a_symlink_at_the_scenario_folder_is_not_followed(tmp_path, root_only):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "kill_idle").symlink_to(root_only / "inner")
    before = snapshot(root_only)
    with pytest.raises(ValueError, match="symlink"):
        RunDir.create(out / "kill_idle")
    assert snapshot(root_only) == before


def test_chaos_run_refuses_a_symlinked_scenario_folder_before_any_cluster(tmp_path, root_only):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "kill_idle").symlink_to(root_only / "inner")
    before = snapshot(root_only)
    code, err = chaos_run(out)
    assert code == 2, err
    assert "kill_idle" in one_line(err) and "symlink" in err
    assert snapshot(root_only) == before
    assert sorted(os.listdir(out)) == ["kill_idle"]


def test_a_symlink_at_latests_temporary_name_is_not_followed(tmp_path, root_only):
    out = tmp_path / "runs"
    (out / "kill_idle").mkdir(parents=True)
    (out / "kill_idle" / f".{LATEST}.{os.getpid()}.tmp").symlink_to(root_only / "secret.txt")
    before = snapshot(root_only)
    run = RunDir.create(out / "kill_idle")
    with run.recording("chaos", "kill_idle"):
        pass
    assert os.readlink(out / "kill_idle" / LATEST) == run.path.name
    assert (out / "kill_idle" / LATEST / RUN_JSON).is_file()
    assert snapshot(root_only) == before


def test_symlinks_at_report_file_names_are_replaced_never_written_through(empty_runs, tmp_path, root_only):
    out = tmp_path / "report"
    out.mkdir()
    for name, target in (("report.md", "secret.txt"), ("report.html", "inner/keep.txt"),
                         (".reports-manifest.json", "secret.txt"), (".reports-manifest.tmp", "secret.txt")):
        (out / name).symlink_to(root_only / target)
    before = snapshot(root_only)
    r = report(empty_runs, out)
    assert r.returncode == 0, r.stderr
    assert snapshot(root_only) == before
    for name in ("report.md", "report.html", ".reports-manifest.json"):
        assert not (out / name).is_symlink() and (out / name).is_file()


def test_a_symlinked_figures_folder_is_refused(runs, tmp_path, root_only):
    out = tmp_path / "report"
    out.mkdir()
    (out / "figures").symlink_to(root_only / "inner")
    before = snapshot(root_only)
    r = report(runs, out)
    assert r.returncode == 2, r.stderr
    assert "figures" in one_line(r.stderr) and "symlink" in r.stderr
    assert snapshot(root_only) == before
    assert sorted(os.listdir(out)) == ["figures"]


# ---------------------------------------------------------------- the manifest removes only what we wrote


def test_a_forged_manifest_removes_nothing_this_tool_did_not_write(empty_runs, tmp_path, root_only):
    """Names in our own folder's manifest (an older version's list, or entries with another file's inode, or a
    path through a symlink) are not enough to get a file removed."""
    out = tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    (out / "mine.txt").write_text("not the report's")
    (out / "figures" / "keep.png").write_bytes(b"mine too")
    (out / "through").symlink_to(root_only)
    other = os.lstat(out / "figures" / "keep.png")
    (out / ".reports-manifest.json").write_text(json.dumps(
        {"schema": 2, "written": [{"name": "figures/keep.png", "dev": other.st_dev, "ino": other.st_ino + 1,
                                   "uid": other.st_uid},
                                  {"name": "through/secret.txt", "dev": other.st_dev, "ino": 1, "uid": 0}]}))
    before, roots = snapshot(out), snapshot(root_only)
    assert report(empty_runs, out).returncode == 0
    assert snapshot(root_only) == roots
    assert (out / "figures" / "keep.png").read_bytes() == b"mine too"
    (out / ".reports-manifest.json").write_text(json.dumps(["mine.txt", "figures/keep.png", "through/secret.txt"]))
    assert report(empty_runs, out).returncode == 0
    assert (out / "mine.txt").read_text() == "not the report's"
    assert (out / "figures" / "keep.png").read_bytes() == b"mine too"
    assert snapshot(root_only) == roots
    assert before.keys() <= snapshot(out).keys()


def test_the_manifest_records_each_file_written_and_a_rebuild_removes_only_those(runs, empty_runs, tmp_path):
    out = tmp_path / "report"
    assert report(runs, out).returncode == 0
    manifest = json.loads((out / ".reports-manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["written"]}
    figure = os.lstat(out / "figures" / "recovery.png")
    assert entries["figures/recovery.png"] == {"name": "figures/recovery.png", "dev": figure.st_dev,
                                               "ino": figure.st_ino, "uid": os.geteuid()}
    (out / "recovery.csv.new").write_text("replaced by hand: another inode")
    os.replace(out / "recovery.csv.new", out / "recovery.csv")
    assert report(empty_runs, out).returncode == 0
    assert not (out / "figures" / "recovery.png").exists()
    assert (out / "recovery.csv").read_text() == "replaced by hand: another inode"


# ---------------------------------------------------------------- the property

NAMES = ("report.md", "report.html", ".reports-manifest.json", ".reports-manifest.tmp", "figures", "kill_idle",
         "victim", "bench")


@st.composite
def layouts(draw):
    return {
        "out": draw(st.sampled_from(["missing", "dir", "link"])),
        "owner": draw(st.sampled_from(["ours", "nobody"])),
        "mode": draw(st.sampled_from([0o755, 0o700, 0o750, 0o775, 0o777, 0o1777, 0o757])),
        "planted": draw(st.dictionaries(st.sampled_from(NAMES), st.tuples(
            st.sampled_from(["", "secret.txt", "inner", "inner/keep.txt", "missing"]),
            st.sampled_from(["ours", "nobody"])), max_size=4)),
        "manifest": draw(st.sampled_from([None, "names", "forged"])),
        "latest_tmp": draw(st.booleans()),
    }


def make_layout(base: Path, sentinel: Path, layout: dict) -> tuple[Path, Path | None, bool]:
    """The --out folder, the folder it really is (None: nothing there yet), and whether it must be refused."""
    out = base / "out"
    uid = os.geteuid() if layout["owner"] == "ours" else NOBODY
    if layout["out"] == "missing":
        return out, None, False
    if layout["out"] == "link":  # a link to a folder of ours; only a link of ours is followed
        real = base / "real"
        real.mkdir(mode=0o755)
        out.symlink_to(real)
        os.lchown(out, uid, uid)
        must_refuse = uid != os.geteuid()
    else:
        real = out
        real.mkdir()
        os.chmod(real, layout["mode"])
        os.chown(real, uid, uid)
        must_refuse = uid != os.geteuid() or bool(layout["mode"] & 0o022)
    for name, (target, owner) in layout["planted"].items():
        (real / name).symlink_to(sentinel / target)
        owner_uid = os.geteuid() if owner == "ours" else NOBODY
        os.lchown(real / name, owner_uid, owner_uid)
    if layout["manifest"] and ".reports-manifest.json" not in layout["planted"]:
        names = ["victim/secret.txt", "victim/inner/keep.txt", "figures/keep.txt", "report.md"]
        doc = names if layout["manifest"] == "names" else {"schema": 2, "written": [
            {"name": n, "dev": os.lstat(sentinel).st_dev, "ino": os.lstat(sentinel / "secret.txt").st_ino,
             "uid": 0} for n in names]}
        (real / ".reports-manifest.json").write_text(json.dumps(doc))
    if layout["latest_tmp"] and "kill_idle" not in layout["planted"]:
        (real / "kill_idle").mkdir()
        (real / "kill_idle" / f".{LATEST}.{os.getpid()}.tmp").symlink_to(sentinel / "secret.txt")
    return out, real, must_refuse


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts())
def test_no_output_layout_gets_a_file_outside_the_out_folder_touched(layout, empty_runs, tmp_path, capsys):
    """Random --out layouts (ours or uid 65534's, modes, symlinks at random names into a root-only sentinel
    folder, forged manifests): the report (``cli.report.main``, the command itself) and a run directory
    (``RunDir.create`` and its life, as every run makes it) either succeed with everything inside the out folder
    or are refused (the report: exit 2); the sentinel's files never change."""
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    sentinel = make_root_only(base / "sentinel")
    out, real, must_refuse = make_layout(base, sentinel, layout)
    before = snapshot(sentinel)
    outside = set(os.listdir(base))

    code = report_cli.main(["--runs", str(empty_runs), "--out", str(out)])
    assert code in (0, 2), capsys.readouterr()
    event(f"report: exit {code}")
    if must_refuse:
        assert code == 2
    real = real or out
    if code == 0:
        assert (real / "report.md").is_file() and not (real / "report.md").is_symlink()
    assert snapshot(sentinel) == before

    try:
        run = RunDir.create(out / "kill_idle")
    except ValueError as exc:
        assert "refused" in str(exc)
        event("run directory: refused")
    else:
        event("run directory: made")
        assert not must_refuse
        with run.recording("chaos", "kill_idle"):
            pass
        assert run.path.resolve().parent == (real / "kill_idle").resolve()
        assert not (real / "kill_idle").is_symlink()
        assert Path(os.path.realpath(run.path)).is_relative_to(Path(os.path.realpath(real)))
    assert snapshot(sentinel) == before
    assert set(os.listdir(base)) <= outside | {"out"}
    capsys.readouterr()

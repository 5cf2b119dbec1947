"""A run directory is data, never code (issue 28, cases 1 and 4).

Case 1: ``chaos check DIR`` ran the interpreter, environment and directory DIR's run.json named, so a crafted
run.json (``target.python = "/bin/bash"``, ``target.env = {"BASH_ENV": "$(id > FILE)"}``) wrote FILE. On a copy of
a real saved run of the reference agent, crafted that way: FILE never appears; a bring-your-own run's replay
uses only a target file the user controls (``--target``, or the one run.json names if the user owns it and no one
else can write it), else it is ``unknown`` with the command to give; ``chaos rerun`` refuses likewise (exit 2).

Case 4: the directory a target's ``PYTHONPATH`` gets, and the fork server's bytecode cache, had predictable
names in the shared temp directory and were used whoever owned them. Made first by another uid (65534, with a
``sitecustomize.py`` that writes a marker), they are never used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.engines import make_engine
from testbed.engines.workload import Workload
from chaos.runner import run
from chaos.scenarios import SCENARIOS, ClusterSpec
from harness.commands import tool
from harness.verdict import PASS, UNKNOWN

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
#: what replays with the reference agent's workflow, from a target file (run by the harness's own interpreter)
GOOD_TARGET = f'''name = "reference-as-a-target"
worker = ["{{python}}", "-m", "testbed", "worker", "--address", "{{address}}", "--task-queue", "{{task_queue}}"]
driver = "testbed.engines.temporal.driver:Driver"
workflow = "agent.workflow:AgentWorkflow"
cwd = "{ROOT}"
'''


def attack(marker: Path) -> dict[str, object]:
    """The issue's run.json target fields: bash as the interpreter, BASH_ENV running a command."""
    return {"python": "/bin/bash", "env": {"BASH_ENV": f"$(id > {marker})"}, "cwd": "/"}


def crafted_target_file(path: Path, marker: Path) -> Path:
    """A valid target file whose interpreter is bash with BASH_ENV set: run, it writes ``marker``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(GOOD_TARGET + f'python = "/bin/bash"\n[env]\nBASH_ENV = "$(id > {marker})"\n')
    return path


@pytest.fixture(scope="module")
async def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, passing run of the reference agent on Temporal, with its event histories."""
    scenario = replace(SCENARIOS["kill_idle"], name="trust", events=(), random_events=0, warmup_s=0.5, fault_s=0.5,
                       settle_s=30.0, final_s=30.0, cluster=ClusterSpec(workers=1),
                       workload=Workload(conversations=1, messages=2, append_ratio=0.0, until_heal=False))
    result = await run(scenario, make_engine(), seed=1, out_root=tmp_path_factory.mktemp("saved"))
    replay = next(c for c in result.checks if c.name == "replay")
    assert replay.verdict == PASS, replay.summary
    return result.run_dir


def crafted_copy(saved_run: Path, where: Path, signed: bool = False, **target: object) -> Path:
    """A copy of the saved run whose run.json's target has ``target``'s fields: received from elsewhere (its
    run.json no longer matches its signature), or, ``signed``, as if this user's harness had written it."""
    copy = where / "received"
    shutil.copytree(saved_run, copy, symlinks=True)
    record = json.loads((copy / "run.json").read_text())
    record["target"] = {**record["target"], **target}
    write_run_json(copy, record, signed)
    return copy


def write_run_json(run_dir: Path, record: dict, signed: bool) -> None:
    """``record`` as run_dir's run.json; ``signed``: with this user's signature (a run this user made)."""
    from harness import signing

    data = json.dumps(record).encode()
    (run_dir / "run.json").write_bytes(data)
    if signed:
        signing.sign(run_dir / "run.json", data)


def chaos(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def replay_of(out: subprocess.CompletedProcess[str]) -> dict:
    return next(c for c in json.loads(out.stdout)["checks"] if c["name"] == "replay")


def nobodys(path: Path) -> Path:
    os.chown(path, NOBODY, NOBODY)
    return path


@pytest.mark.parametrize("named", ["missing", "nobodys", "group-writable", "in-a-dir-others-write",
                                   "a-link-to-nobodys"])
def test_a_received_runs_interpreter_env_and_target_file_are_never_run(saved_run: Path, tmp_path: Path,
                                                                       named: str) -> None:
    marker = tmp_path / "pwned"
    files = tmp_path / "files"
    path = files / "chaos-target.toml"
    if named not in ("missing", "a-link-to-nobodys"):
        crafted_target_file(path, marker)
    if named == "nobodys":
        nobodys(path)
    elif named == "group-writable":
        path.chmod(0o664)
    elif named == "in-a-dir-others-write":
        files.chmod(0o777)
    elif named == "a-link-to-nobodys":
        real = nobodys(crafted_target_file(tmp_path / "elsewhere" / "t.toml", marker))
        files.mkdir()
        path.symlink_to(real)  # the link is yours; what it leads to is not
    # Signed as yours (a run you made, whose target file changed since): the file itself still decides.
    copy = crafted_copy(saved_run, tmp_path, signed=True, source=str(path), **attack(marker))
    out = chaos("check", str(copy), "--json", cwd=tmp_path)
    assert not marker.exists(), marker.read_text()
    replay = replay_of(out)
    assert replay["verdict"] == UNKNOWN, replay
    assert f"{tool('chaos', tmp_path)} check {copy} --target PATH/TO/chaos-target.toml" in replay["summary"], replay
    why = {"missing": "cannot be read here", "nobodys": f"owned by uid {NOBODY}",
           "group-writable": "writable by others", "in-a-dir-others-write": "which others can write",
           "a-link-to-nobodys": f"owned by uid {NOBODY}"}[named]
    assert why in replay["summary"], replay
    assert out.returncode == 1 and "Traceback" not in out.stderr


def test_a_reference_runs_replay_uses_the_harness_own_code_whatever_run_json_says(saved_run: Path,
                                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    copy = crafted_copy(saved_run, tmp_path, source=None, **attack(marker))
    out = chaos("check", str(copy), "--json", cwd=tmp_path)
    assert not marker.exists()
    replay = replay_of(out)
    assert replay["verdict"] == PASS, replay
    assert replay["details"]["replayed_with"].startswith("the reference agent"), replay["details"]
    # A workflow that is not the reference's (nor a planted one) is not loaded: code chosen by the directory.
    copy = crafted_copy(saved_run, tmp_path / "other", source=None, workflow="os:system")
    replay = replay_of(chaos("check", str(copy), "--json", cwd=tmp_path))
    assert replay["verdict"] == UNKNOWN and "'os:system'" in replay["summary"], replay


def test_a_target_file_you_control_replays(saved_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    crafted = nobodys(crafted_target_file(tmp_path / "theirs" / "chaos-target.toml", marker))
    copy = crafted_copy(saved_run, tmp_path, source=str(crafted), **attack(marker))
    good = tmp_path / "mine" / "chaos-target.toml"
    good.parent.mkdir()
    good.write_text(GOOD_TARGET)
    out = chaos("check", str(copy), "--json", "--target", str(good), cwd=tmp_path)  # given on the command line
    replay = replay_of(out)
    assert replay["verdict"] == PASS and replay["details"]["replayed_with"].startswith(f"the target file {good}")
    copy = crafted_copy(saved_run, tmp_path / "named", signed=True, source=str(good), **attack(marker))
    replay = replay_of(chaos("check", str(copy), "--json", cwd=tmp_path))  # your own run names it, and it is yours
    assert replay["verdict"] == PASS, replay
    assert not marker.exists()
    other = tmp_path / "other.toml"
    other.write_text(GOOD_TARGET.replace("agent.workflow:AgentWorkflow", "other_agent.app:Flow"))
    replay = replay_of(chaos("check", str(copy), "--json", "--target", str(other), cwd=tmp_path))
    assert replay["verdict"] == UNKNOWN and "not the agent that ran" in replay["summary"], replay


def test_rerun_refuses_a_target_file_others_can_write(saved_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    theirs = crafted_target_file(tmp_path / "theirs" / "chaos-target.toml", marker)
    theirs.chmod(0o666)
    copy = crafted_copy(saved_run, tmp_path, source=str(theirs))
    record = json.loads((copy / "run.json").read_text())
    record["backend"] = {**record["backend"], "name": "target", "target_file": str(theirs)}
    write_run_json(copy, record, signed=True)
    out = chaos("rerun", str(copy), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2 and not marker.exists()
    [line] = out.stderr.strip().splitlines()
    assert "writable by others" in line and f"{tool('chaos', tmp_path)} rerun {copy} --target PATH/TO/chaos-target.toml" in line
    assert not (tmp_path / "runs").exists()  # refused before anything started
    # A scenario naming code of its own for the reference agent's workers: refused too.
    record["backend"] = {**record["backend"], "name": "temporal", "target_file": None}
    record["scenario"]["cluster"]["workflow"] = "os:system"
    (copy / "run.json").write_text(json.dumps(record))
    out = chaos("rerun", str(copy), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2 and "'os:system'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_rerun_runs_what_the_user_controls(saved_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.engines.byo.engine import OwnAgentOnTemporal
    from testbed.engines.temporal.engine import ReferenceOnTemporal
    from chaos.saved import rerun_job as _rerun

    scenario, backend, seed = _rerun(saved_run)  # the reference agent's run: the harness's own code
    assert isinstance(backend, ReferenceOnTemporal) and scenario.name == "trust" and seed == 1
    good = tmp_path / "chaos-target.toml"
    good.write_text(GOOD_TARGET)
    copy = crafted_copy(saved_run, tmp_path, source=str(good))
    record = json.loads((copy / "run.json").read_text())
    record["backend"] = {**record["backend"], "name": "target", "target_file": str(good)}
    write_run_json(copy, record, signed=True)
    _, backend, _ = _rerun(copy)  # your own run names it and it is yours alone: used
    assert isinstance(backend, OwnAgentOnTemporal) and backend.target.source == str(good)

    # A run whose workers were Docker containers names an image: never run. For your agent, the rerun asks for the
    # image you trust; for the reference agent, it says so and builds its own.
    record["backend"] = {**record["backend"], "workers": "docker", "image": "someone/else:latest"}
    write_run_json(copy, record, signed=True)
    with pytest.raises(ValueError, match=r"Docker image 'someone/else:latest'; a run directory's image is never run"):
        _rerun(copy)
    record["backend"] = {**record["backend"], "name": "temporal", "target_file": None}
    write_run_json(copy, record, signed=True)
    _, backend, _ = _rerun(copy)
    assert isinstance(backend, ReferenceOnTemporal) and backend.image is None
    assert "names the image 'someone/else:latest'; a run directory's image is never run" in capsys.readouterr().err


def test_every_planted_workflow_replays_as_the_reference_agent() -> None:
    from chaos.planted import CATALOGUE
    from chaos.replay_target import reference_workflows

    planted = {b.scenario.cluster.workflow for b in CATALOGUE if b.scenario.cluster.workflow}
    assert planted and planted <= reference_workflows()


# -- case 4: private temporary directories ---------------------------------------------------------------------------


def planted_dir(path: Path, marker: Path, mode: int = 0o755, owner: int = NOBODY) -> Path:
    """A directory someone else made first, holding a sitecustomize.py that writes ``marker`` if imported."""
    path.mkdir()
    (path / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    path.chmod(mode)
    os.chown(path, owner, owner)
    return path


def harness_path(tmp_path: Path) -> dict:
    """What ``harness.target_pythonpath()`` gives with the temp directory at ``tmp_path`` (``path``, its ``uid``,
    ``mode`` and where its ``harness`` leads), once a target process started with it has imported ``harness``."""
    code = ("import json, os, subprocess, sys; from harness import target_pythonpath; p = target_pythonpath(); "
            "subprocess.run([sys.executable, '-c', 'import harness.recording'], check=True, "
            "env={**os.environ, 'PYTHONPATH': p}); st = os.lstat(p); print(json.dumps({'path': p, "
            "'uid': st.st_uid, 'mode': st.st_mode & 0o777, 'harness': os.path.realpath(p + '/harness')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def shared_harness_path_name(tmp_path: Path) -> Path:
    import hashlib

    import harness

    digest = hashlib.sha256(str(harness.PACKAGE).encode()).hexdigest()[:12]
    return tmp_path / f"dah-harness-path-{os.geteuid()}-{digest}"


@pytest.mark.parametrize("owner, mode", [(NOBODY, 0o755), (0, 0o777)], ids=["another-users", "open-to-others"])
def test_a_harness_path_directory_made_first_by_someone_else_is_never_used(tmp_path: Path, owner: int,
                                                                          mode: int) -> None:
    marker = tmp_path / "ran"
    planted = planted_dir(shared_harness_path_name(tmp_path), marker, mode, owner if owner else os.geteuid())
    used = harness_path(tmp_path)
    assert not marker.exists()
    assert Path(used["path"]) != planted and Path(used["path"]).parent == tmp_path  # a fresh one of its own
    assert used["uid"] == os.geteuid() and used["mode"] == 0o700 and used["harness"] == str(ROOT / "harness")
    assert not Path(used["path"]).exists()  # removed when the process that made it exited


def test_the_harness_path_directory_is_private_and_reused(tmp_path: Path) -> None:
    first, again = harness_path(tmp_path), harness_path(tmp_path)
    assert first == again and first["path"] == str(shared_harness_path_name(tmp_path))
    assert first["mode"] == 0o700 and first["uid"] == os.geteuid() and first["harness"] == str(ROOT / "harness")


def test_a_bytecode_cache_made_first_by_another_user_is_never_used(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from testbed import forkserver

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    planted = planted_dir(tmp_path / f"dah-pycache-{os.geteuid()}", tmp_path / "ran", 0o700)
    assert forkserver.private_pycache() is None  # a .pyc planted there would run: no cache rather than that one
    os.chown(planted, os.geteuid(), os.geteuid())
    assert forkserver.private_pycache() == planted  # the same directory, this user's alone: used


# -- issue 40: a received run directory names no code that runs ------------------------------------------------------

#: a target file as a received run directory may carry it: its replayer and its worker run a payload
PAYLOAD_TARGET = '''name = "payload"
worker = ["sh", "payload.sh", "{address}", "{task_queue}"]
driver = "testbed.engines.temporal.driver:Driver"
replay_command = ["sh", "payload.sh", "{history}"]
'''


def carried_target(copy: Path, marker: Path) -> Path:
    """The issue's F1: a chaos-target.toml inside the run directory, beside the payload it runs."""
    (copy / "payload.sh").write_text(f"id > {marker}\n")
    (copy / "chaos-target.toml").write_text(PAYLOAD_TARGET)
    return copy / "chaos-target.toml"


@pytest.mark.parametrize("named_as", ["relative", "absolute"])
@pytest.mark.parametrize("signed", [False, True], ids=["received", "signed-by-you"])
def test_a_target_file_a_run_directory_carries_is_never_run(saved_run: Path, tmp_path: Path, named_as: str,
                                                            signed: bool) -> None:
    """The probe's F1: run.json's target.source and backend.target_file name a target file inside the run
    directory. Copying made it yours, so ownership proved nothing; now only a run.json this user's harness signed
    may name a target, and never one inside the run directory. check: replay unknown; rerun: exit 2; the payload
    never runs."""
    marker = tmp_path / "pwned"
    copy = crafted_copy(saved_run, tmp_path)
    carried = carried_target(copy, marker)
    name = "chaos-target.toml" if named_as == "relative" else str(carried)
    record = json.loads((copy / "run.json").read_text())
    record["target"] = {**record["target"], "source": name, "workflow": None}
    record["backend"] = {**record["backend"], "name": "target", "target_file": name}
    write_run_json(copy, record, signed)
    for cwd in (copy, tmp_path):  # a relative name resolves inside the run directory when checked from it
        out = chaos("check", str(copy), "--json", cwd=cwd)
        replay = replay_of(out)
        assert replay["verdict"] == UNKNOWN, replay
        why = ("inside the run directory" if named_as == "absolute" else "not an absolute path") if signed else \
            "signature"
        assert why in replay["summary"] and "--target PATH/TO/chaos-target.toml" in replay["summary"], replay
        out = chaos("rerun", str(copy), "--out", str(tmp_path / "runs"), cwd=cwd)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert why in out.stderr, out.stderr
    assert not marker.exists(), marker.read_text()
    assert not (tmp_path / "runs").exists()


def test_a_run_signed_with_another_users_key_is_not_yours(saved_run: Path, tmp_path: Path) -> None:
    """A run directory made by another user (or machine) carries their signature, which does not verify with
    yours: the target file it names is not used, even a file that is yours alone."""
    good = tmp_path / "mine" / "chaos-target.toml"
    good.parent.mkdir()
    good.write_text(GOOD_TARGET)
    copy = crafted_copy(saved_run, tmp_path, source=str(good))
    data = (copy / "run.json").read_bytes()
    theirs = tmp_path / "their-config"
    out = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from harness import signing; "
                          "signing.sign(Path(sys.argv[1]), Path(sys.argv[1]).read_bytes())", str(copy / "run.json")],
                         env={**os.environ, "XDG_CONFIG_HOME": str(theirs)}, capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0 and (theirs / "durable-agent-harness" / "run-key").exists(), out.stderr
    assert (copy / "run.json").read_bytes() == data
    replay = replay_of(chaos("check", str(copy), "--json", cwd=tmp_path))
    assert replay["verdict"] == UNKNOWN and "signature is not yours" in replay["summary"], replay


def test_the_run_key_is_yours_alone(tmp_path: Path) -> None:
    """Made on first use, 0600 in a 0700 folder; one that others could read or that is a link is refused."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    code = "from harness import signing; print(signing.signature(b'x'))"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    key = tmp_path / "durable-agent-harness" / "run-key"
    assert first.returncode == 0 and key.stat().st_mode & 0o777 == 0o600, first.stderr
    assert key.parent.stat().st_mode & 0o777 == 0o700
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert again.stdout == first.stdout  # the same key: signatures made earlier still verify
    key.chmod(0o644)
    refused = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 1 and "NoRunKey" in refused.stderr and "mode 0600" in refused.stderr


@pytest.fixture(scope="module")
async def own_target_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real run of a target file (the reference agent declared as one), made here: (run dir, target file)."""
    from testbed.engines.byo.target import load_target

    folder = tmp_path_factory.mktemp("own-target")
    good = folder / "chaos-target.toml"
    good.write_text(GOOD_TARGET.replace('"{task_queue}"]', '"{task_queue}", "--identity", "{identity}"]'))
    scenario = replace(SCENARIOS["kill_idle"], name="trust_target", events=(), random_events=0, warmup_s=0.5,
                       fault_s=0.5, settle_s=30.0, final_s=30.0, cluster=ClusterSpec(workers=1),
                       workload=Workload(conversations=1, messages=2, append_ratio=0.0, until_heal=False))
    result = await run(scenario, make_engine(target=load_target(good), target_file=good), seed=1,
                       out_root=folder / "runs")
    return result.run_dir, good


def test_a_run_you_made_replays_with_the_target_file_it_names(own_target_run: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    """The other side: a run made here carries your signature, so check and rerun use its target file with no
    --target, from any directory; change one byte of run.json and they no longer do."""
    from chaos.saved import rerun_job

    run_dir, good = own_target_run
    assert (run_dir / "run.sig").read_text().startswith("hmac-sha256 ")
    replay = replay_of(chaos("check", str(run_dir), "--json", cwd=tmp_path))
    assert replay["verdict"] == PASS and "carries your signature" in replay["details"]["replayed_with"], replay
    _, engine, _ = rerun_job(run_dir)
    assert engine.target.source == str(good)
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, symlinks=True)
    (copy / "run.json").write_bytes((copy / "run.json").read_bytes().replace(b'"seed": 1', b'"seed": 2'))
    replay = replay_of(chaos("check", str(copy), "--json", cwd=tmp_path))
    assert replay["verdict"] == UNKNOWN and "run.json was changed since" in replay["summary"], replay


# -- issue 40: every name and value taken from a run directory is validated ------------------------------------------


@pytest.mark.parametrize("name", ["../../escape", "ABSOLUTE", "x$(touch INJ)", "-rf", ".hidden"])
def test_rerun_refuses_a_scenario_name_that_is_a_path_or_shell_text(saved_run: Path, tmp_path: Path,
                                                                   name: str) -> None:
    """The probe: an absolute or ``../..`` scenario name put the rerun's directory outside --out, and the name
    filled {task_queue}, so a worker run through ``sh -c`` ran shell text from the received directory."""
    name = str(tmp_path / "abs-escape") if name == "ABSOLUTE" else name
    copy = crafted_copy(saved_run, tmp_path)
    record = json.loads((copy / "run.json").read_text())
    record["scenario"]["name"] = name
    write_run_json(copy, record, signed=False)
    out = chaos("rerun", str(copy), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is not a scenario name" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "INJ").exists()
    assert not (tmp_path / "abs-escape").exists() and not (tmp_path.parent / "escape").exists()


def test_a_placeholder_value_that_is_not_a_name_never_reaches_a_command() -> None:
    from testbed.worker_process import fill  # what every worker command is filled with

    worker = ["sh", "-c", "exec my-worker --task-queue {task_queue} --identity {identity}"]
    assert fill(worker, {"task_queue": "chaos-kill_mid_turn-1", "identity": "w1-g2@host.local"})[2] == \
        "exec my-worker --task-queue chaos-kill_mid_turn-1 --identity w1-g2@host.local"
    for bad in ("x$(touch INJ)", "a b", "-e", "", "q;id", "{python}"):
        with pytest.raises(ValueError, match="is not a name"):
            fill(worker, {"task_queue": bad})
    # one pass: a value is never filled again by a later placeholder
    assert fill(["{state_dir}"], {"state_dir": "/x/{python}", "python": "/bin/sh"}) == ["/x/{python}"]

"""A target replayed by its own replayer (``replay_command``): the replay checker runs it once per workflow on a
private copy of that workflow's saved runs, in the target's directory with its environment, and reads its exit:
0 replays (pass), 1 does not (fail, with its stderr line), anything else unknown. Whether inputs were compared is
the command's to say. The replayer here is a tiny Python script standing in for ``node replay.js``, so these
tests need no Node; ``tests/test_ai_sdk_agent.py`` runs the real one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chaos.checker.replay import check
from chaos.checker.run_data import RunData
from chaos.replay_target import replay_target
from testbed.engines.byo.target import load_target
from harness.rundir import EVENT_HISTORIES, RUN_JSON, SCHEMA, write_json
from harness.verdict import FAIL, PASS, UNKNOWN
from tests.test_replay_target import _one_task_history

#: a replayer whose behaviour the environment picks: what it was given is written down for the test to read
REPLAYER = '''
import json, os, sys
folder, wid = sys.argv[1], sys.argv[2]
with open("seen.json", "a") as f:
    f.write(json.dumps({"wid": wid, "files": sorted(os.listdir(folder)), "flag": os.environ.get("MY_FLAG"),
                        "link": os.path.islink(folder)}) + "\\n")
mode = os.environ.get("REPLAY_MODE", "ok")
if mode == "ok":
    print("replayed 1 run(s): deterministic, every scheduled activity's input as recorded")
elif mode == "quiet":
    print("replayed")
elif mode == "bad":
    print("some noise", file=sys.stderr)
    print(f"{folder}/01-r-1.json: does not replay: Nondeterminism error: activity type changed", file=sys.stderr)
    sys.exit(1)
else:
    print("usage: a bad argument", file=sys.stderr)
    sys.exit(2)
'''

TARGET = f'''
name = "own-replayer"
worker = ["node", "worker.js", "{{address}}", "{{task_queue}}"]
driver = "x:y"
replay_command = ["{sys.executable}", "replayer.py", "{{history}}", "{{workflow_id}}"]
[env]
MY_FLAG = "on"
'''


def _run(tmp_path: Path, mode: str) -> tuple:
    (tmp_path / "replayer.py").write_text(REPLAYER)
    (tmp_path / "target.toml").write_text(TARGET.replace('MY_FLAG = "on"', f'MY_FLAG = "on"\nREPLAY_MODE = "{mode}"'))
    target = load_target(tmp_path / "target.toml")
    run_dir = tmp_path / "run"
    _one_task_history(run_dir / EVENT_HISTORIES)
    write_json(run_dir / RUN_JSON, {"schema": SCHEMA, "kind": "chaos", "name": "replay", "target": target.as_dict()})
    replay = replay_target(run_dir, target.as_dict(), target)
    result = check(RunData(run_dir, replay))
    seen = [json.loads(line) for line in (tmp_path / "seen.json").read_text().splitlines()]
    return result, seen


def test_exit_0_passes_and_the_summary_quotes_what_the_command_says_of_inputs(tmp_path: Path) -> None:
    result, seen = _run(tmp_path, "ok")
    assert result.verdict == PASS, result.summary
    assert "inputs compared by the command, in its words" in result.summary
    assert "every scheduled activity's input as recorded" in result.summary
    # One call for the one workflow, with its folder (a private copy, not the run's) and id, and the target's env.
    assert seen == [{"wid": "c-0", "files": ["01-r-1.json"], "flag": "on", "link": False}]
    assert result.details["workflows"]["c-0"]["exit"] == 0


def test_a_command_that_does_not_say_it_compares_inputs_is_said_not_to(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "quiet")
    assert result.verdict == PASS, result.summary
    assert "inputs not compared" in result.summary


def test_exit_1_fails_with_its_last_stderr_line(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "bad")
    assert result.verdict == FAIL, result.summary
    assert "1 of 1 workflows failed to replay" in result.summary
    assert "does not replay: Nondeterminism error: activity type changed" in result.summary
    assert "some noise" not in result.summary


def test_any_other_exit_is_unknown(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "usage")
    assert result.verdict == UNKNOWN, result.summary
    assert "exit 2: usage: a bad argument" in result.summary


def test_replay_command_is_recorded_and_replaces_workflow(tmp_path: Path) -> None:
    (tmp_path / "target.toml").write_text(TARGET)
    recorded = load_target(tmp_path / "target.toml").as_dict()
    assert recorded["workflow"] is None
    assert recorded["replay_command"][1:] == ["replayer.py", "{history}", "{workflow_id}"]


@pytest.mark.parametrize("replace, error", [
    (lambda t: t.replace("replay_command", "# replay_command"),
     "give workflow = \"MODULE:NAME\" (the Python workflow class replay runs histories with) or replay_command"),
    (lambda t: t.replace('"{history}", ', ""), "'replay_command' "),
    (lambda t: t.replace('replay_command = ["replayer.py", "{history}", "{workflow_id}"]',
                         'replay_command = "replayer.py {history}"'),
     "'replay_command' must be a non-empty list of strings"),
], ids=["neither", "no-history", "not-a-list"])
def test_a_bad_replay_command_is_one_line_naming_it(tmp_path: Path, replace, error: str) -> None:
    path = tmp_path / "target.toml"
    path.write_text(replace(TARGET.replace(f'"{sys.executable}", ', "")))
    with pytest.raises(ValueError) as exc:
        load_target(path)
    assert error in str(exc.value) and str(path) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("folder", ["-e", "$(touch INJ)", "a b", "x;id"])
def test_a_saved_workflow_whose_folder_name_is_not_a_name_is_never_given_to_the_command(tmp_path: Path,
                                                                                       folder: str) -> None:
    """{workflow_id} is filled from a folder name of the run directory: an option (``-e``) or shell text in it
    would reach a replayer that passes it on (``sh -c``). That workflow is not replayed (unknown, saying why);
    the others are."""
    import shutil

    (tmp_path / "replayer.py").write_text(REPLAYER)
    (tmp_path / "target.toml").write_text(TARGET)
    target = load_target(tmp_path / "target.toml")
    run_dir = tmp_path / "run"
    _one_task_history(run_dir / EVENT_HISTORIES)
    shutil.copytree(run_dir / EVENT_HISTORIES / "c-0", run_dir / EVENT_HISTORIES / folder)
    write_json(run_dir / RUN_JSON, {"schema": SCHEMA, "kind": "chaos", "name": "replay", "target": target.as_dict()})
    result = check(RunData(run_dir, replay_target(run_dir, target.as_dict(), target)))
    seen = [json.loads(line)["wid"] for line in (tmp_path / "seen.json").read_text().splitlines()]
    assert seen == ["c-0"], seen  # the replayer never saw the other folder's name
    assert result.verdict == UNKNOWN and "which is not a name" in result.summary, result.summary
    assert result.details["workflows"][folder]["outcome"] == UNKNOWN

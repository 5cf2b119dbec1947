"""CalcAgent under chaos, from its own test suite: the pytest-dah plugin runs the harness, which is installed
elsewhere (found through DAH_HOME) and runs in its own Python, against this directory's target files.

    python3 -m venv .venv-tests
    .venv-tests/bin/pip install pytest <harness>/plugins/pytest-dah
    DAH_HOME=<harness> .venv-tests/bin/pytest                   # the chaos tests: they pass
    DAH_HOME=<harness> .venv-tests/bin/pytest -m planted_bug    # a planted bug: that test fails, as it must
"""

import pytest


@pytest.mark.chaos("crash_after_effect")  # the target: chaos_target in pytest.ini; the seeds: --chaos-seeds
def test_notes_land_once_when_workers_crash_after_writing_them(chaos_result):
    """Workers SIGKILL themselves right after appending a note, before the activity completes: every note is
    still in the notebook exactly once, every question answered. The test reaches this body only if the run
    passed; ``chaos_result`` holds what its checkers said."""
    checks = {c.name: c.verdict for c in chaos_result.run.checks}
    assert checks["effects"] == "pass" and checks["lost"] == "pass", checks


@pytest.mark.planted_bug
def test_planted_bug_fails_this_test(chaos):
    """The same scenario on CalcAgent with a planted bug (chaos-target-planted-bug.toml: notes applied ignoring
    their idempotency key). This test fails: its message names the checker that caught the bug, what it saw,
    the run directory, and the command that reproduces the run."""
    chaos.run("crash_after_effect", target="chaos-target-planted-bug.toml")


def test_the_checkers_catch_the_planted_bug(chaos):
    """The planted bug, asserted caught (``check=False``: the result is handed back, not judged)."""
    result = chaos.run("crash_after_effect", target="chaos-target-planted-bug.toml", check=False)
    assert result.verdict == "fail", result.describe()
    effects = next(c for c in result.run.checks if c.name == "effects")
    assert effects.verdict == "fail" and "more than once" in effects.summary, effects

"""`scripts/summarize_tests.py`, the closing line of `scripts/test.sh`: a session that is not a
test suite (lint, docs) and failed, or was aborted by `session.error`, makes the run fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "summarize_tests.py"
JUNIT = (
    '<testsuites><testsuite name="pytest" tests="2" failures="0" errors="0" skipped="0">'
    '<testcase classname="tests.core.test_a" name="test_one"/>'
    '<testcase classname="tests.core.test_a" name="test_two"/>'
    "</testsuite></testsuites>"
)


def _summarize(folder: Path, sessions: list[dict]) -> subprocess.CompletedProcess:
    (folder / "core.xml").write_text(JUNIT)
    (folder / "nox-lane2.json").write_text(json.dumps({"result": 0, "sessions": sessions}))
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(folder), "core"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_clean_run_passes(tmp_path):
    run = _summarize(tmp_path, [{"name": "lint", "result": "success"}])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "2 passed, 0 failed, 0 skipped"


@pytest.mark.parametrize("result", ["failed", "aborted"])
def test_a_failed_or_aborted_check_session_fails_the_run(tmp_path, result):
    reason = "failed: ruff format"
    run = _summarize(tmp_path, [{"name": "lint", "result": result, "reason": reason}])
    assert run.returncode == 1
    assert f"lint         session failed: {reason}" in run.stdout
    assert run.stdout.splitlines()[-1] == "2 passed, 1 failed, 0 skipped"
    assert "lint (session failed)" in run.stderr

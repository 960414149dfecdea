"""The test suites' job pool (tests/_support/prestart.py) is itself code that can be wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# pytest makes the session's temp folder on first use; slowed down here so that two pool
# threads calling `mktemp` at once both find it missing (what a loaded machine does by chance).
CONFTEST = """
import time

import _pytest.tmpdir

from _support import prestart

_real = _pytest.tmpdir.make_numbered_dir_with_cleanup


def _slow(**kwargs):
    time.sleep(0.5)
    return _real(**kwargs)


_pytest.tmpdir.make_numbered_dir_with_cleanup = _slow
_prestart = prestart.session_fixture(slots=2)
"""

TEST = """
from _support import prestart


@prestart.fixture(params=[0, 1, 2, 3])
def made(tmp_path_factory, param):
    return tmp_path_factory.mktemp(f"job-{param}")


def test_in_the_sessions_temp_folder(made, tmp_path_factory):
    assert made.parent == tmp_path_factory.getbasetemp()
"""


def test_jobs_started_at_once_share_the_sessions_temp_folder(tmp_path):
    """Two pool threads made the first temp folders at once: each made its own session folder
    and pytest refused one path ("is not a normalized and relative path"), a CI failure of
    `test_lost_rank_ends_the_job[hang]`. The pool now makes the folder before any job."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_jobs.py").write_text(textwrap.dedent(TEST))
    (tmp_path / "temp").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "PYTEST_DEBUG_TEMPROOT": str(tmp_path / "temp"),  # pytest's own numbered folders
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "4 passed" in run.stdout, run.stdout[-2000:]

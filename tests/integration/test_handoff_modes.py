"""A result handed from one object to another on the same group is, on each rank, the very
tensor that rank's worker returned, in-process, under torchrun and on Ray (issue 27, item 2)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _support import prestart
from _support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "scripts" / "handoff_driver.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
COMMANDS = {
    "inprocess": [sys.executable, str(DRIVER), "--mode", "inprocess"],
    "local": [*TORCHRUN, str(DRIVER), "--mode", "local"],
    "ray": [sys.executable, str(DRIVER), "--mode", "ray"],
}
ROWS = 256

#: Written down from the semantics, not taken from a run: each rank's own result by reference,
#: the other rank's as a copy; values everywhere else.
EXPECTED = {
    "slice_dp": [[0, True, True, 0.0], [1, True, True, 1.0]],
    "all": [[0, [[True, True], [False, False]]], [1, [[False, False], [True, True]]]],
    "other_group": [[0, [2 * ROWS, 256], 0.0, 1.0]],
    "whole": [[0, [2 * ROWS, 256], 0.0, 1.0], [1, [2 * ROWS, 256], 0.0, 1.0]],
    "driver": [[2 * ROWS, 256], 0.0, 1.0],
}


def _mode_run(mode: str):
    def run_mode(tmp_path_factory):
        path = tmp_path_factory.mktemp("handoff") / f"{mode}.json"
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        cmd = [*COMMANDS[mode], "--out", str(path)]
        job = run_job([cmd], cwd=ROOT, env=env, timeout=300, check_leftovers=False)
        assert job.returncode == 0, job.output[-4000:]
        return json.loads(path.read_text())

    run_mode.__name__ = f"handoff_{mode}"
    return prestart.fixture(run_mode)


handoff_inprocess = _mode_run("inprocess")
handoff_local = _mode_run("local")
handoff_ray = _mode_run("ray")


@pytest.mark.parametrize("mode", ["inprocess", "local", "ray"])
def test_colocated_hand_off_is_by_reference(mode, request):
    got = request.getfixturevalue(f"handoff_{mode}")
    assert got == EXPECTED

"""The example pipeline gives the same per-step losses in-process, under torchrun and on Ray."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "rl_pipeline.py"
STEPS = "4"


def run(cmd: list[str], timeout: float = 300) -> str:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    job = run_job([cmd], cwd=ROOT, env=env, timeout=timeout, check_leftovers=False)
    code, out = job.returncode, job.output
    assert code == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipeline")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    commands = {
        "inprocess": [sys.executable, str(EXAMPLE), "--mode", "inprocess"],
        "local": [*torchrun, str(EXAMPLE), "--mode", "local"],
        "ray": [sys.executable, str(EXAMPLE), "--mode", "ray"],
    }
    out = {}
    for mode, cmd in commands.items():
        path = folder / f"{mode}.json"
        stdout = run([*cmd, "--steps", STEPS, "--out", str(path)])
        out[mode] = (json.loads(path.read_text())["steps"], stdout)
    return out


def test_every_mode_prints_the_placement_and_the_steps(tables):
    for mode, (steps, stdout) in tables.items():
        assert len(steps) == int(STEPS), mode
        assert "group policy" in stdout and "group processor" in stdout, mode
        assert f"mode {mode}" in stdout
        assert "step  3" in stdout


@pytest.mark.parametrize("mode", ["local", "ray"])
def test_losses_equal_the_reference(tables, mode):
    reference = tables["inprocess"][0]
    steps = tables[mode][0]
    for ref, row in zip(reference, steps, strict=True):
        assert row["reward"] == pytest.approx(ref["reward"], abs=1e-9)
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)
    # the policy learns something: losses are not all identical
    assert len({round(r["loss"], 6) for r in reference}) > 1

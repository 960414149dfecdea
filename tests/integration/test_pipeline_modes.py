"""The example pipeline gives the same per-step losses in-process, under torchrun and on Ray."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _support import prestart
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


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
COMMANDS = {
    "inprocess": [sys.executable, str(EXAMPLE), "--mode", "inprocess"],
    "local": [*TORCHRUN, str(EXAMPLE), "--mode", "local"],
    "ray": [sys.executable, str(EXAMPLE), "--mode", "ray"],
    # A sampler worker SIGKILLed halfway (issue 28, item 6).
    "ray_chaos": [sys.executable, str(EXAMPLE), "--mode", "ray", "--chaos"],
    # Process 1 exits halfway; torchrun starts the job again, which resumes (issue 28, item 5).
    "local_chaos": [
        *TORCHRUN,
        "--max-restarts=1",
        str(EXAMPLE),
        "--mode",
        "local",
        "--chaos",
        "--checkpoint-dir",
        "{tmp}",
    ],
}


def _mode_run(mode: str):
    """A fixture `<mode>_run`: the mode's steps and what it printed. The three modes run in
    the background from the session's start (tests/_support/prestart.py)."""

    def run_mode(tmp_path_factory):
        tmp = tmp_path_factory.mktemp("pipeline")
        path = tmp / f"{mode}.json"
        command = [arg.replace("{tmp}", str(tmp / "checkpoints")) for arg in COMMANDS[mode]]
        stdout = run([*command, "--steps", STEPS, "--out", str(path)])
        return json.loads(path.read_text())["steps"], stdout

    run_mode.__name__ = f"{mode}_run"
    return prestart.fixture(run_mode)


inprocess_run = _mode_run("inprocess")
local_run = _mode_run("local")
ray_run = _mode_run("ray")
ray_chaos_run = _mode_run("ray_chaos")
local_chaos_run = _mode_run("local_chaos")


@pytest.fixture(scope="module")
def tables(inprocess_run, local_run, ray_run):
    return {"inprocess": inprocess_run, "local": local_run, "ray": ray_run}


def test_every_mode_prints_the_placement_and_the_steps(tables):
    for mode, (steps, stdout) in tables.items():
        assert len(steps) == int(STEPS), mode
        assert "DeviceGroup: policy" in stdout and "DeviceGroup: processor" in stdout, mode
        assert "DeviceMesh: Policy" in stdout and "DeviceMesh: Reference" in stdout, mode
        assert "DEVICE PLACEMENT TOPOLOGY" in stdout, mode
        assert "step  3" in stdout


@pytest.mark.parametrize("mode", ["local", "ray"])
def test_losses_equal_the_reference(tables, mode):
    reference = tables["inprocess"][0]
    steps = tables[mode][0]
    for ref, row in zip(reference, steps, strict=True):
        assert row["reward"] == pytest.approx(ref["reward"], abs=1e-9)
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)
        # the reference model, colocated with the policy, gives the same log-probs
        assert row["ref_logp"] == pytest.approx(ref["ref_logp"], rel=1e-5, abs=1e-6)
    # the policy learns something: losses are not all identical
    assert len({round(r["loss"], 6) for r in reference}) > 1
    # the reference is the frozen first policy: log-probs under uniform-ish init, all negative
    assert all(r["ref_logp"] < 0 for r in reference)


def test_a_run_whose_sampler_worker_is_killed_halfway_ends_with_the_same_losses(
    inprocess_run, ray_chaos_run
):
    """`--chaos`: a sampler worker is SIGKILLed after the weight sync of step 2; the step's
    rollouts fail or wait, the sampler group restarts (one restart, logged once), reloads the
    weights it last received in `on_restart`, the weights group is formed again for step 3,
    and every step's numbers equal an uninterrupted run's."""
    steps, stdout = ray_chaos_run
    half = int(STEPS) // 2
    assert f"step  {half}  chaos: SIGKILLed sampler rank 1" in stdout
    assert stdout.count("twinkle: group 'sampler' restarted as generation 1") == 1, stdout[-3000:]
    reference = inprocess_run[0]
    assert len(steps) == len(reference) == int(STEPS)
    for ref, row in zip(reference, steps, strict=True):
        assert row["reward"] == pytest.approx(ref["reward"], abs=1e-9), row["step"]
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6), row["step"]


def test_a_torchrun_job_restarted_after_a_process_exits_resumes_with_the_same_losses(
    inprocess_run, local_chaos_run
):
    """`torchrun --max-restarts=1 ... --chaos --checkpoint-dir`: process 1 exits at the start
    of step 2 on the first attempt; torchrun starts the whole job again (its default group
    forms again: issue 28, item 5), which resumes after the last step it saved, and the table
    (saved steps, then resumed ones) equals an uninterrupted run's."""
    steps, stdout = local_chaos_run
    half = int(STEPS) // 2
    assert f"step  {half}  chaos: process 1 exits" in stdout
    assert f"attempt 1: resuming after step {half - 1}" in stdout, stdout[-3000:]
    reference = inprocess_run[0]
    assert [r["step"] for r in steps] == list(range(int(STEPS)))
    for ref, row in zip(reference, steps, strict=True):
        assert row["reward"] == pytest.approx(ref["reward"], abs=1e-9), row["step"]
        assert row["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6), row["step"]

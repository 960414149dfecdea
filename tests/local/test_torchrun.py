"""Real `torchrun --standalone --nproc_per_node=2` jobs on CPU (gloo).

Checks are batched into few jobs (each costs seconds): the main job computes the inprocess
reference and the local results of the same driver code on every rank; the failure jobs check
exit codes, call sites, single notifications and how fast the job ends.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from _support import prestart
from _support.mesh_reader import EXPECTED
from _support.net import free_port

from .conftest import JOBS, run_job

pytestmark = pytest.mark.slow


def assert_close(actual, expected, path="$"):
    """Equal JSON values, floats to a relative tolerance of 1e-6 (all-reduce order may differ)."""
    if isinstance(expected, float) or isinstance(actual, float):
        assert isinstance(actual, (int, float)) and isinstance(expected, (int, float)), path
        assert math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-9), (
            f"{path}: {actual} != {expected}"
        )
        return
    assert type(actual) is type(expected), f"{path}: {actual!r} vs {expected!r}"
    if isinstance(expected, dict):
        assert set(actual) == set(expected), f"{path}: keys {set(actual) ^ set(expected)}"
        for key in expected:
            assert_close(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: {actual} vs {expected}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# Every job of the module runs in the background from the session's start (see
# tests/_support/prestart.py); the ones that mostly wait for a timeout start first.


@prestart.fixture
def main_job(tmp_path_factory):
    job = run_job("main_job.py", tmp_path_factory.mktemp("main"))
    assert job.returncode == 0, job.output[-6000:]
    ranks = [json.loads((job.out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    return job, ranks


@prestart.fixture(params=[0, 2], ids=["one-launcher", "two-launchers"])
def fail_job(tmp_path_factory, param):
    return run_job("fail_job.py", tmp_path_factory.mktemp("fail"), nodes=param)


@prestart.fixture(params=["die", "hang"], first=True)
def lost_job(tmp_path_factory, param):
    return run_job("lost_job.py", tmp_path_factory.mktemp(f"lost-{param}"), param), param


@prestart.fixture
def wide_job(tmp_path_factory):
    return run_job("wide_job.py", tmp_path_factory.mktemp("wide"), nproc=4, timeout=180)


@prestart.fixture
def mesh_job(tmp_path_factory):
    return run_job("mesh_job.py", tmp_path_factory.mktemp("mesh"), nproc=8, timeout=240)


@prestart.fixture(first=True)
def slow_sender_job(tmp_path_factory):
    return run_job("slow_sender_job.py", tmp_path_factory.mktemp("slow-sender"), timeout=180)


@pytest.mark.parametrize("rank", [0, 1])
def test_conformance_driver_matches_inprocess(main_job, rank):
    _, ranks = main_job
    reference = ranks[0]["reference_conformance"]
    assert_close(ranks[rank]["local_conformance"], reference)
    # The reference itself is what a plain `python tests/_support/conformance.py inprocess` prints.
    assert reference["identity"] == [[0, 2, "trainer", 0, 2], [1, 2, "trainer", 1, 2]]
    assert reference["peer"] == [[0, 0], [1, 1]]


@pytest.mark.parametrize("rank", [0, 1])
def test_design_example_gives_the_written_down_values_on_every_rank(main_job, rank):
    from _support import design_example

    _, ranks = main_job
    assert ranks[rank]["design"] == design_example.EXPECTED


@pytest.mark.parametrize("rank", [0, 1])
def test_scenarios_match_inprocess(main_job, rank):
    _, ranks = main_job
    assert_close(ranks[rank]["local_scenarios"], ranks[0]["reference_scenarios"])


def test_scenario_values(main_job):
    """The values themselves, so a reference and a backend broken the same way still fail."""
    _, ranks = main_job
    for result in ranks:
        local = result["local_scenarios"]
        assert local["first_none"] == [0]  # execute='first': rank 0 only, every rank receives
        assert local["first_mean"] == 3.5
        assert local["lazy_done"] is True
        assert local["tensor_mean"] == {"dtype": "torch.float32", "tensor": [9.0, 12.5]}
        assert local["int_tensor_sum"] == {"dtype": "torch.int64", "tensor": [9, 12]}
        assert local["int_tensor_mean"] == {"dtype": "torch.float32", "tensor": [4.5, 6.5]}
        assert local["mixed_types"] == {"dtype": "float64", "numpy": 3.5}
        assert local["lists"] == [10, 20, 30]
        assert local["lazy_arg"] == {"dtype": "float64", "numpy": [4.25, 6.25]}
        assert local["solo_2"] == {"count": 5, "t": {"dtype": "torch.int64", "tensor": [5, 10]}}
        assert local["tp_loss"] == 10.0  # tp peers: rank 0 stands for the one data shard
        draws = local["draws_1"]
        assert draws[0] == draws[1]  # same seed in each worker
        assert local["draws_2"][0][1] != draws[0][1]  # ... and each continues its own stream


def test_local_only_behaviour(main_job):
    _, ranks = main_job
    checks = [r["checks"] for r in ranks]
    assert checks[0]["run_name"] == checks[1]["run_name"]  # rank 0's name on every rank
    for rank, c in enumerate(checks):
        assert c["dist_backend_default"] == "gloo" and c["dist_backend_control"] == "gloo"
        assert c["control_is_separate"] is True
        assert c["user_all_reduce"] == 3.0
        assert c["torch_mesh_dp"] == [["dp"], [0, 1], rank]
        assert c["torch_mesh_tp"] == [["tp"], [0, 1]]
        assert c["placement_has_both_ranks"] is True
        assert c["holds_worker_one"] is (rank == 0)  # a 1-worker group lives on rank 0 only
        assert c["nested"][0] == ["ok", "here"]
        assert c["nested"][1][0] == "ConfigurationError"
        assert "live in other processes" in c["nested"][1][1]
        assert "diverged" in c["diverged"] and "Step.a" in c["diverged"]
        assert c["default_group_destroyed"] is True
        message, notes = c["construct"]
        assert message == "no data on this rank"
        assert "constructing Broken(remote_group='two') failed on rank 1" in notes[0]
        assert ("Traceback" in notes[0]) is (rank == 0)  # rank 1 has its own traceback
    for result in ranks:  # twinkle used the user's group and did not destroy it
        assert result["user_group"] == {"mean": 1.0, "owns": False, "kept": True}


def _line_of(script: str, marker: str) -> int:
    lines = (JOBS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def test_failing_ranks_end_the_job_with_one_alert_each(fail_job):
    """One launcher with 2 processes, and 2 launchers (2 simulated nodes) of one process each:
    the election through the job's store gives one alert per distinct failure either way."""
    job = fail_job
    out = job.out_dir
    script = str(JOBS / "fail_job.py")
    line_a, line_b = _line_of("fail_job.py", "CALL-A"), _line_of("fail_job.py", "CALL-B")
    assert job.returncode != 0, job.output[-4000:]
    assert "NOT REACHED" not in job.output
    tag_b = f"ValueError: [twinkle driver caller: {script}:{line_b}] bad batch None"
    assert f"[rank0]: {tag_b}" in job.output and f"[rank1]: {tag_b}" in job.output, job.output
    # Every rank raises rank 0's error: rank 0 with the worker's own frames, rank 1 with
    # rank 0's traceback as a note.
    assert '[rank0]:     raise ValueError(f"bad batch {only}")' in job.output
    assert "[rank1]: twinkle: traceback on rank 0:" in job.output
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    tag_a = f"[twinkle driver caller: {script}:{line_a}] bad batch 1"
    for rank, report in enumerate(reports):  # rank 1 failed alone; every rank raised it
        assert report["caught"][:2] == ["ValueError", tag_a]
        notes = "\n".join(report["caught"][2])
        assert "twinkle: Boom.explode failed in group 'g' on rank 1" in notes
        # Rank 0 did not run the failing code: rank 1's traceback comes along as a note.
        assert ("twinkle: traceback on rank 1:" in notes) is (rank == 0)
        assert ('raise ValueError(f"bad batch {only}")' in notes) is (rank == 0)
    alerts = [json.loads(line) for line in (out / "alerts.jsonl").read_text().splitlines()]
    assert len(alerts) == 2, alerts  # one per distinct failure for the whole job
    texts = sorted((a["text"] for a in alerts), key=lambda t: f":{line_b}`" in t)
    assert f"{script}:{line_a}`" in texts[0] and "g / 1" in texts[0]
    assert f"{script}:{line_b}`" in texts[1] and "g / 0, 1" in texts[1]
    assert 'raise ValueError(f"bad batch {only}")' in texts[0]  # rank 1's traceback travelled
    # torchrun notices the exit and stops the job about a second after the raise (more when
    # the machine is busy).
    raised_at = max(r["raised_at"] for r in reports)
    assert 0 < job.ended_at - raised_at < 30


def test_lost_rank_ends_the_job(lost_job):
    """A rank that dies or hangs: the others stop waiting (timeout 5 s) and the job ends."""
    job, mode = lost_job
    out = job.out_dir
    assert job.returncode != 0, job.output[-4000:]
    if mode == "die":
        assert re.search(r"exitcode\s*:\s*3", job.output), job.output[-4000:]
    else:
        # Deterministic: rank 0 gives up after the 5 s timeout, reports, and exits first.
        assert "WorkerDiedError: [twinkle driver caller:" in job.output
        assert "died or stopped answering during Fragile.step" in job.output
        alerts = (out / "alerts.jsonl").read_text().splitlines()
        # One per call site: the failed call, and the retry after catching it.
        assert len(alerts) == 2 and all("WorkerDiedError" in a for a in alerts)
        broken = json.loads((out / "broken0.json").read_text())
        assert "during Fragile.step" in broken["again"]
        # The hung process told, through the store, where it was.
        assert "process 1 " in broken["first"] and "running Fragile.step" in broken["first"]
        assert "time.sleep(300)" in broken["first"]
        assert broken["again_took"] < 1  # no second wait for the timeout
    started = json.loads((out / "start0.json").read_text())["t"]
    took = job.ended_at - started
    if mode == "hang":
        assert 5 <= took < 30, took  # waited for the 5 s timeout, then ended
    else:
        assert took < 30, took


def test_sigterm_waits_for_queued_alerts(tmp_path):
    """torchrun SIGTERMs the survivors of a failed job; a queued alert still goes out."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINKLE_")}
    env.update(
        WORLD_SIZE="1",
        RANK="0",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, str(JOBS / "term_job.py"), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        assert not (tmp_path / "alert.txt").exists()  # the notifier is still busy
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        waited = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM  # still ends the way SIGTERM ends a process
    assert "disk full" in (tmp_path / "alert.txt").read_text()
    assert waited < 10


def test_mesh_accessors_inside_eight_torchrun_workers(mesh_job):
    """`mesh.pp_rank`/`dp_rank`/`fsdp_rank`/`tp_rank`/`data_rank` of the worker running the
    code, on pp=2 x dp=2 x tp=2 and dp=2 x fsdp=4 meshes of 8 processes; every process sees
    every worker's answer, and its driver code (outside any worker) gets None."""
    job = mesh_job
    assert job.returncode == 0, job.output[-6000:]
    expected = {**EXPECTED, "driver": [None, None]}
    for rank in range(8):
        assert json.loads((job.out_dir / f"rank{rank}.json").read_text()) == expected, rank


def test_four_processes_groups_smaller_than_the_world(wide_job):
    """4 processes: groups of 1-2 leave processes 2 and 3 without instances (they still get
    every value), and a dp=2 x tp=2 mesh spans all four."""
    job = wide_job
    assert job.returncode == 0, job.output[-6000:]
    ranks = [json.loads((job.out_dir / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, result in enumerate(ranks):
        mesh = dict(result["local_mesh"])
        torch_mesh = mesh.pop("torch_mesh")  # local mode only
        assert_close(mesh, ranks[0]["reference_mesh"], f"{rank}.mesh")
        for part in ("conformance", "scenarios"):
            assert_close(result[f"local_{part}"], ranks[0][f"reference_{part}"], f"{rank}.{part}")
        assert mesh["loss"] == 7.5  # mean over the 2 dp shards (6 and 9), tp peers not counted
        assert mesh["outputs"] == [10, 20, 30, 40, 50]
        assert mesh["coords"] == [[0, 0, 0], [1, 0, 1], [2, 1, 0], [3, 1, 1]]
        dp, tp = divmod(rank, 2)
        tp_group = [2 * dp, 2 * dp + 1]
        assert torch_mesh == [["dp", "tp"], [[0, 1], [2, 3]], dp, tp, tp_group]


def test_the_waiting_process_ends_with_its_shutdown_deadline(slow_sender_job):
    """The process that lost the election waits for the sender's alert only as long as its
    own `shutdown(timeout=...)` allows, not `notify_wait` (30 s)."""
    job = slow_sender_job
    assert job.returncode == 0, job.output[-4000:]
    reports = [json.loads((job.out_dir / f"shutdown{r}.json").read_text()) for r in (0, 1)]
    senders = [r for r in reports if r["sender"]]
    waiters = [r for r in reports if not r["sender"]]
    assert len(senders) == 1 and len(waiters) == 1, reports  # one alert for the job
    assert waiters[0]["took"] < 12, reports  # deadline 2 s (30 s before the fix)
    assert 13 < senders[0]["took"] < 36, reports  # the slow notifier is cut at its own 16 s

"""Fixtures for twinkle-local's tests: a clean runtime, and real torchrun jobs.

Jobs run `python -m torch.distributed.run --standalone --nproc_per_node=2 SCRIPT` with a
timeout. torchrun starts its workers in their own sessions, so leftover processes are found by a
unique token in their environment (not by process group): after every job none may remain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import twinkle_core

JOBS = Path(__file__).resolve().parent / "jobs"
TORCHRUN_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture(autouse=True)
def _clean_runtime():
    """Every test starts and ends without an active twinkle run."""
    twinkle_core.shutdown()
    yield
    twinkle_core.shutdown()


@pytest.fixture
def single_process(monkeypatch):
    """This pytest process as a lone process: no torchrun variables."""
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)


@dataclass
class Job:
    returncode: int
    output: str
    elapsed: float
    out_dir: Path


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if token.encode() in environ:
            found.append(int(entry.name))
    return found


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_job(script: str, out_dir: Path, *args: str, timeout: float = 120, nproc: int = 2) -> Job:
    """Run `jobs/<script>` under torchrun; never leaves a process behind."""
    token = f"twinkle-test-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.update(TWINKLE_TEST_JOB=token, PYTHONUNBUFFERED="1")
    env.pop("TWINKLE_MODE", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(JOBS / script),
        str(out_dir),
        *args,
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=out_dir,  # not the repository root, whose source folders would shadow the packages
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_all([proc.pid, *_processes_with(token)])
        output, _ = proc.communicate()
        pytest.fail(f"torchrun job {script} did not end within {timeout}s:\n{output[-4000:]}")
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + 10
    while (left := _processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    _kill_all(left)
    assert not left, f"torchrun job {script} left processes behind: {left}"
    return Job(proc.returncode, output, elapsed, out_dir)

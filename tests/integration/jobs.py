"""Running a whole job (a driver script, a torchrun launch) as a subprocess in tests."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest


def run_job(cmd: list[str], *, cwd, env: dict, timeout: float) -> tuple[int, str]:
    """Run `cmd` in its own session; return (exit code, stdout+stderr).

    On timeout the whole process group (torchrun's workers, Ray's driver) is killed and the
    test fails with the end of the output, so a hung job never outlives the test.
    """
    env = dict(env, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{cmd} did not finish in {timeout}s:\n{out[-4000:]}")
    return proc.returncode, out

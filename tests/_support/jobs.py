"""Whole jobs (a driver script, torchrun launchers) as subprocesses that never outlive a test.

Every process of a job carries a unique token in its environment (`TWINKLE_TEST_JOB`), so what
it started is found afterwards even where it left the process group (torchrun starts its workers
in their own sessions; Ray daemonizes): on timeout everything is killed and the test fails with
the end of the output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TOKEN_VAR = "TWINKLE_TEST_JOB"
#: The tokens of the jobs running now (jobs may run in background threads: see prestart.py).
_RUNNING: set[str] = set()


@dataclass
class Job:
    returncode: int  # the first non-zero exit code of the launched commands, else 0
    output: str  # stdout and stderr of every command, one after the other
    elapsed: float  # seconds from launch to the last command's exit
    out_dir: Path  # the working directory the commands ran in
    ended_at: float  # wall-clock time (time.time()) when the commands exited


def processes_with(token: str) -> list[int]:
    """The ids of the processes whose environment holds `token`."""
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


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_running() -> None:
    """Kill every process of every job running now (their `run_job` calls then return)."""
    for token in list(_RUNNING):
        kill_all(processes_with(token))


def run_job(
    commands: list[list[str]],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    check_leftovers: bool = True,
    token: str | None = None,
) -> Job:
    """Run the commands at once, each in its own session, and wait for all of them.

    With `check_leftovers` the test fails if any process of the job is still alive 10 s after
    the commands exited (they are killed first); without it they are only killed.
    """
    token = token or f"twinkle-test-{uuid.uuid4().hex}"
    env = dict(env, PYTHONUNBUFFERED="1", **{TOKEN_VAR: token})
    start = time.monotonic()
    _RUNNING.add(token)
    try:
        return _run(commands, cwd, env, timeout, check_leftovers, token, start)
    finally:
        _RUNNING.discard(token)


def _run(commands, cwd, env, timeout, check_leftovers, token, start) -> Job:
    procs = [
        subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for cmd in commands
    ]
    outputs = []
    try:
        for proc in procs:
            left_time = max(1.0, timeout - (time.monotonic() - start))
            outputs.append(proc.communicate(timeout=left_time)[0])
    except subprocess.TimeoutExpired:
        kill_all([p.pid for p in procs] + processes_with(token))
        text = "\n".join(p.communicate()[0] or "" for p in procs)
        pytest.fail(f"{commands[0]} did not end within {timeout}s:\n{text[-4000:]}")
    except BaseException:  # the test's own timeout, Ctrl-C: leave nothing behind
        kill_all([p.pid for p in procs] + processes_with(token))
        raise
    elapsed = time.monotonic() - start
    ended_at = time.time()
    deadline = time.monotonic() + (10 if check_leftovers else 0)
    while (left := processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_all(left)
    if check_leftovers:
        assert not left, f"{commands[0]} left processes behind: {left}"
    code = next((p.returncode for p in procs if p.returncode), 0)
    return Job(code, "\n".join(outputs), elapsed, Path(cwd), ended_at)


def run_reporting_script(
    path: Path, source: str, *, env_extra: dict[str, str] | None = None, timeout: float = 240
) -> tuple[Any, str]:
    """Write `source` to `path` and run it with this Python (RAY_ADDRESS unset, so an embedded
    Ray cluster is its own); it must exit 0 and print one line `REPORT <json>`: return the JSON
    and everything the script printed (stdout, then stderr).
    """
    path.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[0][len("REPORT ") :]), proc.stdout + proc.stderr

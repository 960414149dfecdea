"""`bash scripts/test.sh` says what it is doing while nox runs (issue 31, item 3): one line as
each nox session starts and one as it ends (result, duration, its tests, what passed and failed
so far), nox's output kept in the log files it names, the end of a failed session's output, then
the summary table; its exit code is what it was.

The progress lines are read from canned nox logs (`Progress`, `summarize_tests.py --follow`),
and scripts/test.sh itself runs against a stand-in `nox` that prints what nox prints."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))
import summarize_tests  # noqa: E402

LINT = """\
nox > Running session lint
nox > Creating virtual environment (uv) using python in .nox/lint
nox > ruff check twinkle_core tests
All checks passed!
nox > Session lint aborted: failed: ruff format (run `ruff format`) (took 4 seconds).
"""
CORE = """\
nox > Running session core
nox > pytest tests/core --junitxml=/r/core.xml
tests/core/test_a.py ........                                             [ 40%]
tests/core/test_b.py .....F.s...                                          [100%]
FAILED tests/core/test_b.py::test_six - assert 1 == 2
============= 1 failed, 17 passed, 1 skipped, 2 warnings in 12.31s =============
nox > Command pytest tests/core failed with exit code 1
nox > Session core failed.
"""
DINGTALK = """\
nox > Running session dingtalk
nox > pytest tests/notify_dingtalk
============================= 70 passed in 35.32s ==============================
nox > Session dingtalk was successful in 42 seconds.
nox > Ran 2 sessions in 2 minutes:
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _feed(progress, clock, log, text, step=1.0):
    for line in text.splitlines():
        clock.t += step
        progress.feed(log, line)


def test_one_line_as_each_session_starts_and_ends():
    clock, out = Clock(), io.StringIO()
    progress = summarize_tests.Progress(["lint", "core", "dingtalk"], out, now=clock)
    _feed(progress, clock, "lane1.log", LINT)
    _feed(progress, clock, "lane2.log", CORE, step=10)
    _feed(progress, clock, "lane2.log", DINGTALK)
    assert out.getvalue().splitlines() == [
        "[ 0:01] lint        started (output: lane1.log)",
        "[ 0:05] lint        ABORTED in 0:04  (failed: ruff format (run `ruff format`))"
        "  | so far: 1/3 sessions, 1 failed; 0 tests passed, 0 failed",
        "[ 0:15] core        started (output: lane2.log)",
        "[ 1:25] core        FAILED in 1:10, 17 passed, 1 failed, 1 skipped"
        "  | so far: 2/3 sessions, 2 failed; 17 tests passed, 1 failed",
        "[ 1:26] dingtalk    started (output: lane2.log)",
        "[ 1:29] dingtalk    ok in 0:03, 70 passed, 0 failed"
        "  | so far: 3/3 sessions, 2 failed; 87 tests passed, 1 failed",
    ]


def test_parallel_logs_heartbeat_and_the_end_of_failed_output():
    clock, out = Clock(), io.StringIO()
    progress = summarize_tests.Progress(["core", "ray"], out, now=clock)
    _feed(progress, clock, "lane2.log", CORE.splitlines()[0])
    _feed(progress, clock, "later.log", "nox > Running session ray\ntests/ray/a.py ..  [ 7%]")
    progress.heartbeat(120)  # printed 1 s ago: nothing
    clock.t += 300
    progress.heartbeat(120)
    progress.heartbeat(120)  # just printed: nothing
    _feed(progress, clock, "lane2.log", "\n".join(CORE.splitlines()[1:]))
    progress.finish()  # ray never ended: its nox process died
    lines = out.getvalue().splitlines()
    assert lines[2] == "[ 5:03]             running: core 5:02, ray 5:01 (pytest 7%)"
    assert lines[4] == "[ 5:10] ray         did not finish (its nox process ended or was stopped)"
    text = out.getvalue()
    assert "\n== the end of core's output (failed; all of it: lane2.log)\n" in text
    assert "FAILED tests/core/test_b.py::test_six - assert 1 == 2\n" in text
    assert "\n== the end of ray's output (unfinished; all of it: later.log)\n" in text


def test_a_log_whose_nox_ran_no_session_is_shown():
    clock, out = Clock(), io.StringIO()
    progress = summarize_tests.Progress(["core"], out, now=clock)
    _feed(progress, clock, "all.log", "nox > Error while collecting sessions.\nSyntaxError: x")
    progress.finish()
    assert out.getvalue() == (
        "\n== all.log ran no session; its end:\n"
        "nox > Error while collecting sessions.\nSyntaxError: x\n"
    )


def test_follow_reads_growing_logs_until_done(tmp_path):
    (tmp_path / "lane1.log").write_text(LINT)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "summarize_tests.py"), "--follow", str(tmp_path), "lint"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    with (tmp_path / "lane2.log").open("w") as log:
        log.write(CORE[:40])  # half a line: read once it is whole
        log.flush()
        log.write(CORE[40:])
    (tmp_path / ".done").touch()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert re.search(r"\] lint +started \(output: lane1\.log\)", out), out
    assert re.search(r"\] core +FAILED in \d:\d\d, 17 passed, 1 failed, 1 skipped", out), out
    assert "so far: 2/2 sessions, 2 failed; 17 tests passed, 1 failed" in out
    assert "== the end of core's output (failed; all of it: lane2.log)" in out


# --------------------------------------------------------------------------- scripts/test.sh
FAKE_NOX = """\
#!{python}
# A stand-in for nox: prints what nox prints for each session, writes the report and JUnit files.
import json, os, sys, time
args = sys.argv[1:]
report = args[args.index("--report") + 1]
sessions = args[args.index("--sessions") + 1 :]
failing = os.environ.get("FAKE_FAIL", "").split(",")
results = []
for name in sessions:
    print(f"nox > Running session {{name}}", flush=True)
    time.sleep(0.2)
    if name in ("core", "dingtalk", "ray"):
        bad = name in failing
        cases = '<testcase classname="t" name="a"/>'
        cases += '<testcase classname="t" name="b"><failure message="x"/></testcase>' if bad else ""
        counts = f'tests="{{2 if bad else 1}}" failures="{{int(bad)}}" errors="0" skipped="0"'
        xml = f"<testsuite {{counts}}>"
        with open(os.path.join(os.path.dirname(report), f"{{name}}.xml"), "w") as f:
            f.write(xml + cases + "</testsuite>")
        print("FAILED t::b - boom" if bad else "", flush=True)
        print(f"===== {{'1 failed, ' if bad else ''}}1 passed in 0.10s =====", flush=True)
    if name in failing:
        print(f"nox > Session {{name}} failed.", flush=True)
    else:
        print(f"nox > Session {{name}} was successful in 1 second.", flush=True)
    results.append({{"name": name, "result": "failed" if name in failing else "success"}})
with open(report, "w") as f:
    json.dump({{"sessions": results}}, f)
sys.exit(1 if any(r["result"] != "success" for r in results) else 0)
"""


@pytest.fixture
def clone(tmp_path):
    """A checkout holding scripts/test.sh and its helpers, with nox replaced by FAKE_NOX."""
    (tmp_path / "scripts").mkdir()
    for name in ("test.sh", "tools.sh", "summarize_tests.py"):
        shutil.copy(SCRIPTS / name, tmp_path / "scripts" / name)
    tools = tmp_path / ".venvs" / "tools"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / "python").symlink_to(sys.executable)
    nox = tools / "bin" / "nox"
    nox.write_text(FAKE_NOX.format(python=sys.executable))
    nox.chmod(0o755)
    wanted = subprocess.run(
        ["bash", "-c", 'source scripts/tools.sh; echo "${TOOLS_REQUIREMENTS[*]}"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (tools / ".requirements").write_text(f"{wanted} {sys.executable}\n")  # ensure_tools: done
    return tmp_path


def _test_sh(clone, *sessions, fail=""):
    env = {k: v for k, v in os.environ.items() if k != "TWINKLE_VENVS"}
    env.update(PYTHON=sys.executable, FAKE_FAIL=fail)
    return subprocess.run(
        ["bash", str(clone / "scripts" / "test.sh"), *sessions],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _progress(stdout: str) -> list[str]:
    """The progress lines without their clock."""
    return [re.sub(r"^\[ *[\d:]+\] ", "", li) for li in stdout.splitlines() if li.startswith("[")]


def test_test_sh_prints_progress_keeps_the_logs_and_ends_with_the_summary(clone):
    run = _test_sh(clone, "lint", "docs", "core", "dingtalk", "ray")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _progress(run.stdout)
    for lane, names in (("lane1", ["lint", "docs"]), ("lane2", ["core", "dingtalk"])):
        mine = [li for li in lines if li.split()[0] in names]
        assert [li.split()[:2] for li in mine] == [
            [names[0], "started"],
            [names[0], "ok"],
            [names[1], "started"],
            [names[1], "ok"],
        ], lines
        assert f"{names[0]:<11} started (output: .test-reports/{lane}.log)" in mine
    assert lines[-2:] == [
        "ray         started (output: .test-reports/later.log)",
        "ray         ok in 0:00, 1 passed, 0 failed"
        "  | so far: 5/5 sessions, 0 failed; 3 tests passed, 0 failed",
    ]
    assert "== lane 1: lint docs (output: .test-reports/lane1.log)" in run.stdout
    assert "== then: ray (output: .test-reports/later.log)" in run.stdout
    assert "nox > Running session" not in run.stdout  # nox's own output is in the logs
    logs = {p.name for p in (clone / ".test-reports").glob("*.log")}
    assert logs == {"lane1.log", "lane2.log", "later.log"}
    assert "nox > Session docs was successful" in (clone / ".test-reports/lane1.log").read_text()
    summary = run.stdout[run.stdout.index("== summary") :].splitlines()
    assert summary[-1] == "3 passed, 0 failed, 0 skipped"


def test_test_sh_fails_as_before_and_shows_the_failed_sessions_output(clone):
    run = _test_sh(clone, "lint", "core", "dingtalk", fail="core")
    assert run.returncode == 1
    # (lint runs beside core, in its own lane: what is done "so far" depends on which ends first)
    [core] = [li for li in _progress(run.stdout) if li.startswith("core        FAILED")]
    assert re.fullmatch(r"core +FAILED in 0:00, 1 passed, 1 failed  \| so far: .* failed", core)
    assert run.stdout.splitlines()[-3:-1] == ["failed:", "  core: t::b"]
    tail = run.stdout.index(
        "== the end of core's output (failed; all of it: .test-reports/lane2.log)"
    )
    assert "FAILED t::b - boom" in run.stdout[tail:]
    assert tail < run.stdout.index("== summary")
    assert run.stdout.splitlines()[-1] == "2 passed, 1 failed, 0 skipped"


def test_test_sh_with_one_session_shows_its_output_as_it_runs(clone):
    run = _test_sh(clone, "core", fail="core")
    assert run.returncode == 1
    assert "nox > Running session core\n" in run.stdout
    assert "nox > Session core failed." in (clone / ".test-reports/all.log").read_text()
    assert not _progress(run.stdout)

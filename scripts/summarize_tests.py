"""Add up the JUnit reports of every suite into one closing line: 'N passed, N failed, N skipped'.

    python scripts/summarize_tests.py REPORT_FOLDER [SUITE ...]
    python scripts/summarize_tests.py --follow REPORT_FOLDER [SESSION ...]

When REPORT_FOLDER holds nox reports (nox*.json, from nox --report), each session that is not a
test suite (lint, docs, ...) and failed, or was aborted (`session.error`), also counts as one
failure.

With SUITE names, a suite whose report is missing (its set-up failed, or a timeout ended pytest
before it wrote the report) counts as one failure, and so does a suite that ran no test. Exits
non-zero when anything failed, so an empty or half run can never look green. Skips and xfails are
listed with their reasons: tests/conftest.py has already failed any that
tests/skip_allowlist.py does not allow.

With --follow (scripts/test.sh, while nox runs): read the nox logs (*.log) of REPORT_FOLDER as
they grow and print one line as each nox session starts and one as it ends (its result and
duration, its tests' counts from pytest's closing line, and how many sessions and tests passed
and failed so far; SESSION names give the count to expect), a line naming what is still running
every --heartbeat seconds without one, and, once REPORT_FOLDER/.done exists and every log is
read, the end of each failed session's output. Its exit code is always 0: the run's result is
the sessions' and this summary's.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO


def _cases(root: ET.Element):
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        yield name, case


def main(folder: str, expected: list[str]) -> int:
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    problems: list[str] = []
    failed_names: list[str] = []
    skipped_names: list[str] = []
    reports = {p.stem: p for p in sorted(Path(folder).glob("*.xml"))}
    for suite in expected:
        if suite not in reports:
            print(f"  {suite:<12} no report: its set-up failed or pytest was killed")
            problems.append(f"{suite} (no report)")
            totals["failed"] += 1  # the closing line must not read as a clean run
    for stem, report in reports.items():
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError as exc:
            print(f"  {stem:<12} unreadable report: {exc}")
            problems.append(f"{stem} (unreadable report)")
            totals["failed"] += 1
            continue
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        tests = sum(int(s.get("tests", 0)) for s in suites)
        failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)
        passed = tests - failed - skipped
        print(f"  {stem:<12} {passed} passed, {failed} failed, {skipped} skipped")
        if tests == 0:
            problems.append(f"{stem} (ran no test)")
            totals["failed"] += 1
        for name, case in _cases(root):
            for child in case:
                if child.tag in ("failure", "error"):
                    failed_names.append(f"{stem}: {name}")
                elif child.tag == "skipped":
                    kind = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                    skipped_names.append(f"{stem}: {name} ({kind}: {child.get('message', '')})")
        totals["passed"] += passed
        totals["failed"] += failed
        totals["skipped"] += skipped
    # scripts/test.sh may run nox more than once (nox-lane1.json, nox-later.json, ...).
    for nox_report in sorted(Path(folder).glob("nox*.json")):
        for session in json.loads(nox_report.read_text()).get("sessions", []):
            name, result = session.get("name", "?"), session.get("result")
            if name not in reports and name not in expected and result in ("failed", "aborted"):
                reason = session.get("reason") or "see its output above"
                print(f"  {name:<12} session failed: {reason}")
                problems.append(f"{name} (session failed)")
                totals["failed"] += 1
    if skipped_names:
        print("skipped (allowed by tests/skip_allowlist.py):")
        for line in skipped_names:
            print(f"  {line}")
    if failed_names:
        print("failed:")
        for line in failed_names:
            print(f"  {line}")
    if problems:
        print(f"not a complete, clean run: {', '.join(problems)}", file=sys.stderr)
    # The closing line, alone on its line.
    print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    if not totals["passed"] and not totals["failed"] and not problems:
        print("no test ran at all", file=sys.stderr)
        return 1
    return 1 if totals["failed"] or problems else 0


# --- progress of a running scripts/test.sh -----------------------------------------------------

SESSION_START = re.compile(r"^nox > Running session (\S+)$")
SESSION_END = re.compile(
    r"^nox > Session (\S+) (was successful|failed|aborted|skipped|interrupted)(.*?)\.?$"
)
PYTEST_CLOSING = re.compile(r"^=+ (.*) in [\d.]+s\b.* =+$")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
PYTEST_PERCENT = re.compile(r"\[\s*(\d{1,3})%\]$")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Lines of a failed session's output printed when the run ends (its log holds all of them).
TAIL = 60
FINE = ("ok", "skipped")  # the results of a session that did not fail


def clock(seconds: float) -> str:
    """`0:07`, `12:40`, `1:02:03`."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"


def pytest_counts(closing: str) -> dict[str, int]:
    """passed/failed/skipped of pytest's closing line (errors count as failed, xfailed as
    skipped, xpassed as passed), as the JUnit summary counts them."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    kinds = {"xpassed": "passed", "error": "failed", "errors": "failed", "xfailed": "skipped"}
    for number, kind in PYTEST_COUNT.findall(closing):
        counts[kinds.get(kind, kind)] += int(number)
    return counts


@dataclass
class Session:
    name: str
    log: str
    started: float
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL))
    tests: dict[str, int] | None = None  # from pytest's closing line, once seen
    percent: str = ""  # pytest's progress, `[ 57%]`, while it runs
    result: str = ""


class Progress:
    """The progress lines of nox logs fed to it line by line (`feed`), from any number of logs
    (scripts/test.sh runs nox sessions in parallel lanes, one log each)."""

    def __init__(
        self,
        expected: list[str],
        out: TextIO,
        now: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        self.expected = expected
        self.out = out
        self.now = now
        self.started = now() if started is None else started
        self.running: dict[str, Session] = {}  # by log
        self.finished: list[Session] = []
        self.logs_seen: dict[str, deque[str]] = {}  # each log's last lines outside sessions
        self.last_print = self.started

    def _say(self, name: str, text: str) -> None:
        now = self.now()
        self.out.write(f"[{clock(now - self.started):>5}] {name:<11} {text}\n")
        self.out.flush()
        self.last_print = now

    def feed(self, log: str, line: str) -> None:
        line = ANSI.sub("", line.rstrip("\r\n"))
        outside = self.logs_seen.setdefault(log, deque(maxlen=TAIL))
        session = self.running.get(log)
        start = SESSION_START.match(line)
        if start:
            session = self.running[log] = Session(start.group(1), log, self.now())
            self._say(session.name, f"started (output: {log})")
        if session is None:
            outside.append(line)
            return
        session.tail.append(line)
        if line.startswith("nox > "):
            end = SESSION_END.match(line)
            if end and end.group(1) == session.name:
                reason = re.sub(r"\s*\(took [^)]*\)$", "", end.group(3).lstrip(": ").strip())
                self._end(session, end.group(2), reason)
            return
        closing = PYTEST_CLOSING.match(line)
        if closing:  # `= 3 failed, 310 passed, 2 skipped in 45.1s =`, `= no tests ran in ... =`
            session.tests = pytest_counts(closing.group(1))
        percent = PYTEST_PERCENT.search(line)
        if percent:
            session.percent = f"{percent.group(1)}%"

    def _end(self, session: Session, status: str, reason: str) -> None:
        del self.running[session.log]
        session.result = "ok" if status == "was successful" else status
        self.finished.append(session)
        took = clock(self.now() - session.started)
        text = f"{'ok' if session.result == 'ok' else session.result.upper()} in {took}"
        if session.tests is not None:
            t = session.tests
            text += f", {t['passed']} passed, {t['failed']} failed"
            text += f", {t['skipped']} skipped" if t["skipped"] else ""
        if session.result != "ok" and reason and not reason.startswith("in "):
            text += f"  ({reason})"
        self._say(session.name, f"{text}  | so far: {self.so_far()}")

    def so_far(self) -> str:
        done = len(self.finished)
        failed = sum(1 for s in self.finished if s.result not in FINE)
        passed = sum((s.tests or {}).get("passed", 0) for s in self.finished)
        tests_failed = sum((s.tests or {}).get("failed", 0) for s in self.finished)
        total = max(len(self.expected), done + len(self.running))
        return (
            f"{done}/{total} sessions, {failed} failed; "
            f"{passed} tests passed, {tests_failed} failed"
        )

    def heartbeat(self, every: float) -> None:
        """Name what is still running when nothing was printed for `every` seconds."""
        now = self.now()
        if not self.running or now - self.last_print < every:
            return
        running = ", ".join(
            f"{s.name} {clock(now - s.started)}" + (f" (pytest {s.percent})" if s.percent else "")
            for s in self.running.values()
        )
        self._say("", f"running: {running}")

    def finish(self) -> None:
        """The end of the output of each session that failed or never ended, and of a log whose
        nox ran no session at all (a noxfile that cannot load, ...)."""
        for session in self.running.values():
            session.result = "unfinished"
            self._say(session.name, "did not finish (its nox process ended or was stopped)")
        sessions = [*self.finished, *self.running.values()]
        broken = [s for s in sessions if s.result not in FINE]
        for session in broken:
            self.out.write(
                f"\n== the end of {session.name}'s output ({session.result}; "
                f"all of it: {session.log})\n"
            )
            self.out.write("".join(f"{line}\n" for line in session.tail))
        with_sessions = {s.log for s in sessions}
        for log, lines in self.logs_seen.items():
            if log not in with_sessions and any(line.strip() for line in lines):
                self.out.write(f"\n== {log} ran no session; its end:\n")
                self.out.write("".join(f"{line}\n" for line in lines))
        self.out.flush()


def follow(
    folder: Path, expected: list[str], *, heartbeat: float = 120.0, poll: float = 0.5
) -> None:
    """Feed every *.log of `folder` to a `Progress` as it grows, until `folder/.done` exists
    (then read to the end) or the process that started this one is gone."""
    progress = Progress(expected, sys.stdout, started=_started())
    parent = os.getppid()
    files: dict[Path, tuple[BinaryIO, bytes]] = {}
    cwd = Path.cwd()

    def shown(path: Path) -> str:
        return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)

    def drain() -> None:
        for path in sorted(folder.glob("*.log")):
            if path not in files:
                files[path] = (path.open("rb"), b"")
            handle, partial = files[path]
            data = partial + handle.read()
            *lines, partial = data.split(b"\n")
            files[path] = (handle, partial)
            for raw in lines:
                progress.feed(shown(path), raw.decode("utf-8", "replace"))

    try:
        while True:
            done = (folder / ".done").exists() or os.getppid() != parent
            drain()
            if done:
                break
            progress.heartbeat(heartbeat)
            time.sleep(poll)
        for path, (_, partial) in files.items():
            if partial:
                progress.feed(shown(path), partial.decode("utf-8", "replace"))
        progress.finish()
    except KeyboardInterrupt:
        pass


def _started() -> float | None:
    """When scripts/test.sh started (TWINKLE_TEST_STARTED, seconds since the epoch), on the
    clock of `time.monotonic`; None: now."""
    try:
        since = time.time() - float(os.environ["TWINKLE_TEST_STARTED"])
    except (KeyError, ValueError):
        return None
    return time.monotonic() - max(since, 0.0)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--follow":
        follow(Path(sys.argv[2]), sys.argv[3:])
        sys.exit(0)
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))

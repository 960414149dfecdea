"""Add up the JUnit reports of every suite into one closing line: 'N passed, N failed, N skipped'.

    python scripts/summarize_tests.py REPORT_FOLDER [SUITE ...]

When REPORT_FOLDER holds nox reports (nox*.json, from nox --report), each session that is not a
test suite (lint, docs, ...) and failed, or was aborted (`session.error`), also counts as one
failure.

With SUITE names, a suite whose report is missing (its set-up failed, or a timeout ended pytest
before it wrote the report) counts as one failure, and so does a suite that ran no test. Exits
non-zero when anything failed, so an empty or half run can never look green. Skips and xfails are
listed with their reasons: tests/conftest.py has already failed any that
tests/skip_allowlist.py does not allow.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


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


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))

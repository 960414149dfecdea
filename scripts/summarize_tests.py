"""Add up the JUnit reports of every suite into one closing line: 'N passed, N failed, N skipped'.

Exits non-zero when a suite ran no test, so an empty run can never look green.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(folder: str) -> int:
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    empty = []
    for report in sorted(Path(folder).glob("*.xml")):
        root = ET.parse(report).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        tests = sum(int(s.get("tests", 0)) for s in suites)
        failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)
        passed = tests - failed - skipped
        print(f"  {report.stem:<12} {passed} passed, {failed} failed, {skipped} skipped")
        if tests == 0:
            empty.append(report.stem)
        totals["passed"] += passed
        totals["failed"] += failed
        totals["skipped"] += skipped
    if not totals["passed"] and not totals["failed"]:
        empty.append("(all)")
    print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    if empty:
        print(f"suites that ran no test: {', '.join(empty)}", file=sys.stderr)
        return 1
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Rules for every suite under tests/ (pytest loads this file before each suite's own conftest).

- A suite cannot pass by skipping: a skipped or xfailed test fails unless tests/skip_allowlist.py
  names it (hardware-only tests). A module skipped at import time fails its collection.
- Hypothesis runs the "ci" profile when CI is set: no deadline (shared, noisy machines),
  derandomized (the same examples every run) and failing examples printed as reproduce blobs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from skip_allowlist import allowed_reason

sys.path.pop(0)

_TRUE = {"1", "true", "yes", "on"}

try:
    from hypothesis import settings
except ImportError:  # pragma: no cover - every test environment has hypothesis
    pass
else:
    settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
    if os.environ.get("CI", "").strip().lower() in _TRUE:
        settings.load_profile("ci")


def _skips_allowed() -> bool:
    return os.environ.get("TWINKLE_ALLOW_SKIPS", "").strip().lower() in _TRUE


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _fail_unallowed_skip(report, nodeid: str) -> None:
    """Turn a skip or xfail that the allowlist does not name into a failure, in place."""
    if _skips_allowed() or not report.skipped or allowed_reason(nodeid) is not None:
        return
    xfail = getattr(report, "wasxfail", None)
    if xfail is not None:
        del report.wasxfail  # otherwise the junit report would still call it skipped
        what = f"xfailed ({xfail or 'no reason given'})"
    else:
        what = _skip_reason(report)
    report.outcome = "failed"
    report.longrepr = (
        f"{nodeid} was {what}; only tests named in tests/skip_allowlist.py (hardware-only "
        "tests) may skip or xfail. Make it run here, or add it there with the hardware it needs."
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_unallowed_skip(report, item.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_unallowed_skip(report, collector.nodeid)
    return report

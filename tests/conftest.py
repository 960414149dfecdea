"""Rules for every suite under tests/ (pytest loads this file before each suite's own conftest).

- A suite cannot pass by skipping: a skipped or xfailed test fails unless tests/skip_allowlist.py
  names it (hardware-only tests). A module skipped at import time fails its collection.
- Hypothesis runs the "ci" profile when CI is set: no deadline (shared, noisy machines),
  derandomized (the same examples every run) and failing examples printed as reproduce blobs.
- A test past its pytest-timeout bound fails alone, with its stack, and the session goes on
  (the signal method, extended to interrupt `ray.get`: see tests/_support/timeouts.py).
- Every Ray cluster the tests start (and every process they start) uses token authentication
  with one token for the session, kept in a private folder (0700, the file 0600) and removed at
  exit: Ray stays authenticated (loopback ports are open to every user of the machine), prints
  no "Token authentication is enabled" notice, and writes no world-readable ~/.ray/auth_token.
  Settings already made (RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH) are kept.
  See "Token authentication" in docs/ray.md.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from skip_allowlist import allowed_reason

sys.path.pop(0)
from _support import timeouts  # tests/ is on sys.path: the pythonpath setting

_TRUE = {"1", "true", "yes", "on"}
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _private_ray_token() -> None:
    """Token authentication for the session's Ray clusters, with a token only this user reads."""
    if any(var in os.environ for var in RAY_AUTH_VARS):
        return
    folder = tempfile.mkdtemp(prefix="tw-auth-")  # mode 0700
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, "auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as token:
        token.write(secrets.token_hex(32))  # as `ray get-auth-token --generate` makes one
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=path)


_private_ray_token()

try:
    from hypothesis import settings
except ImportError:  # pragma: no cover - every test environment has hypothesis
    pass
else:
    settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
    if os.environ.get("CI", "").strip().lower() in _TRUE:
        settings.load_profile("ci")


def pytest_configure(config):
    timeouts.register(config)


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

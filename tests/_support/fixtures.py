"""Fixtures shared by suites; a suite's conftest imports the ones it wants (autouse ones then
apply to every test of that suite)."""

from __future__ import annotations

import pytest

import twinkle_core


@pytest.fixture(autouse=True)
def _clean_runtime():
    """Every test starts and ends without an active twinkle run."""
    twinkle_core.shutdown()
    yield
    twinkle_core.shutdown()

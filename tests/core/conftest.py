from __future__ import annotations

import pytest

import twinkle_core
from twinkle_core.plugins import reset_plugins


@pytest.fixture(autouse=True)
def _clean_runtime():
    """Every test starts and ends without an active twinkle run."""
    twinkle_core.shutdown()
    yield
    twinkle_core.shutdown()


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Reload plugins from the current sys.path/environment, and again after the test."""
    monkeypatch.delenv("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("TWINKLE_PLUGINS", raising=False)
    reset_plugins()
    yield
    reset_plugins()

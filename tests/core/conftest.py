from __future__ import annotations

import pytest
from _support.fixtures import _clean_runtime  # noqa: F401 - autouse in this suite

from twinkle_core.plugins import reset_plugins


@pytest.fixture
def fresh_plugins(monkeypatch):
    """Reload plugins from the current sys.path/environment, and again after the test."""
    monkeypatch.delenv("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("TWINKLE_PLUGINS", raising=False)
    reset_plugins()
    yield
    reset_plugins()

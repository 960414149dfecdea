"""Fixtures for the DingTalk notifier tests: a real HTTP robot on 127.0.0.1, a dead port."""

from __future__ import annotations

import logging
import os
import uuid

import pytest
from _support.fake_dingtalk import FakeDingTalk
from _support.net import free_port

import twinkle_core
from twinkle_notify_dingtalk import notifier as notifier_module


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch):
    """No proxy for 127.0.0.1, no leftover runtime, no TWINKLE_DINGTALK_* from the outside."""
    for name in list(os.environ):
        if name.startswith("TWINKLE_DINGTALK_") or name.lower() in ("http_proxy", "https_proxy"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    notifier_module._scrubbed.clear()
    yield
    twinkle_core.shutdown(timeout=5)
    notifier_module._scrubbed.clear()


@pytest.fixture
def token() -> str:
    # A fresh token per test: the rate limiter is shared per robot, so tests must not share one.
    return f"tok{uuid.uuid4().hex}"


@pytest.fixture
def secret() -> str:
    return f"SEC{uuid.uuid4().hex}{uuid.uuid4().hex}"


@pytest.fixture
def robot(token, secret):
    """A signing robot (the default security mode we recommend)."""
    server = FakeDingTalk(token, secret).start()
    yield server
    server.stop()


@pytest.fixture
def dead_webhook(token) -> str:
    """A webhook on a port nobody listens on: connections are refused."""
    port = free_port()
    return f"http://127.0.0.1:{port}/robot/send?access_token={token}"


@pytest.fixture
def dtlog(caplog):
    """Capture every log record of every logger at DEBUG and above."""
    caplog.set_level(logging.DEBUG)
    return caplog

"""The access token and the signing secret never show up in logs, errors, reprs or workers."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import twinkle_core
from twinkle_core import ConfigurationError, DeviceGroup, remote_class, remote_function
from twinkle_core.plugin import get_plugin
from twinkle_notify_dingtalk import DetachedDingTalkNotifier, DingTalkNotifier
from twinkle_notify_dingtalk.redact import Redactor, redact_url


@remote_class()
class Job:
    @remote_function(dispatch="all")
    def crash(self):
        raise KeyError("missing shard")


def _assert_clean(text: str, *secrets: str) -> None:
    for s in secrets:
        assert s not in text, f"secret {s[:6]}... leaked"


def test_no_secret_in_logs_under_any_failure(robot, dead_webhook, token, secret, dtlog):
    # Refused (wrong secret), throttled, server errors, unreachable, slow: every warning path.
    cases = [
        (DingTalkNotifier(robot.webhook, secret + "0", timeout=1), {}),
        (DingTalkNotifier(robot.webhook, secret, timeout=0.5), {"always_throttle": True}),
        (DingTalkNotifier(robot.webhook, secret, timeout=0.6), {"fail_next_http": 50}),
        (DingTalkNotifier(dead_webhook, secret, timeout=0.5), {}),
        (DingTalkNotifier(robot.webhook, secret, timeout=0.3), {"delay": 1.0}),
    ]
    for notifier, behaviour in cases:
        robot.always_throttle, robot.fail_next_http, robot.delay = False, 0, 0.0
        for name, value in behaviour.items():
            setattr(robot, name, value)
        twinkle_core.initialize(
            mode="inprocess", groups=[DeviceGroup("g", 1, "cpu")], notifier=notifier
        )
        with pytest.raises(KeyError):
            Job(remote_group="g").crash()()
        twinkle_core.shutdown(timeout=2)
        notifier.close(timeout=0.1)
    assert len(dtlog.records) >= 5 and "not delivered" in dtlog.text
    signs = [r.query["sign"] for r in robot.requests if "sign" in r.query]
    _assert_clean(dtlog.text, token, secret, *signs)
    for record in dtlog.records:  # args and exception info, not just the formatted text
        _assert_clean(repr(record.args) + str(record.exc_info), token, secret)


def test_repr_and_errors_are_redacted(token, secret):
    webhook = f"https://oapi.dingtalk.com/robot/send?access_token={token}"
    notifier = DingTalkNotifier(webhook, secret, at_mobiles=["13900000000"])
    text = repr(notifier) + str(notifier)
    _assert_clean(text, token, secret, "13900000000")
    assert "access_token=***" in text and "signed=True" in text
    with pytest.raises(ConfigurationError) as info:
        DingTalkNotifier(f"ftp://oapi.dingtalk.com/robot/send?access_token={token}", secret)
    _assert_clean(str(info.value), token, secret)
    assert "webhook=" in str(info.value) and "https://" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        DingTalkNotifier(webhook, secret, timeout=-1)
    _assert_clean(str(info.value), token, secret)


def test_pickled_copy_carries_no_credentials(token, secret, dtlog):
    notifier = DingTalkNotifier(f"https://x.example/robot/send?access_token={token}", secret)
    data = pickle.dumps(notifier)
    _assert_clean(data.decode("latin-1"), token, secret)
    copy = pickle.loads(data)
    assert isinstance(copy, DetachedDingTalkNotifier)
    copy.send("t", "x")  # sends nothing, says why
    assert "without its credentials" in dtlog.text
    import copy as copy_module

    assert copy_module.deepcopy(notifier) is notifier  # within the process: the same notifier


def test_from_env_takes_secrets_out_of_the_environment(robot, secret, monkeypatch):
    monkeypatch.setenv("TWINKLE_DINGTALK_WEBHOOK", robot.webhook)
    monkeypatch.setenv("TWINKLE_DINGTALK_SECRET", secret)
    monkeypatch.setenv("TWINKLE_DINGTALK_MAX_PER_MINUTE", "7")
    notifier = get_plugin("notifiers", "dingtalk").from_env()
    assert notifier.max_per_minute == 7
    assert "TWINKLE_DINGTALK_WEBHOOK" not in os.environ
    assert "TWINKLE_DINGTALK_SECRET" not in os.environ
    # Processes started afterwards (Ray's raylet and workers, torch workers) inherit nothing.
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.environ))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "TWINKLE_DINGTALK_WEBHOOK" not in child.stdout
    assert secret not in child.stdout
    # A second initialize() in the same process can still build it.
    again = DingTalkNotifier.from_env()
    again.send("second", "x")
    again.close(timeout=5)
    assert robot.delivered[-1].title == "second"


def test_keep_env_opt_out(robot, monkeypatch):
    monkeypatch.setenv("TWINKLE_DINGTALK_WEBHOOK", robot.webhook)
    monkeypatch.setenv("TWINKLE_DINGTALK_KEEP_ENV", "1")
    DingTalkNotifier.from_env()
    assert os.environ["TWINKLE_DINGTALK_WEBHOOK"] == robot.webhook


secretish = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=4, max_size=40
).filter(lambda s: s.strip() == s and "*" not in s)


@settings(max_examples=300, deadline=None)
@given(token=secretish, secret=secretish, before=st.text(max_size=30), after=st.text(max_size=30))
def test_redactor_masks_raw_and_url_encoded_values(token, secret, before, after):
    redact = Redactor([token, secret])
    quoted = urllib.parse.quote_plus(secret)
    text = f"{before}{token} {secret} {quoted} access_token={token}&sign=abc{after}"
    out = redact(text)
    assert token not in out and secret not in out and quoted not in out
    assert "sign=abc" not in out


@given(token=st.text(alphabet="abcdef0123456789", min_size=8, max_size=64))
def test_redact_url(token):
    url = f"https://oapi.dingtalk.com/robot/send?access_token={token}&timestamp=1&sign=xyz%2B"
    out = redact_url(url)
    assert token not in out and "xyz" not in out
    assert out.startswith("https://oapi.dingtalk.com/robot/send?access_token=***")


def test_the_plugin_declares_its_variables_driver_only():
    """Backends ask the plugins which variables never travel; DingTalk's settings are there."""
    from twinkle_core.plugin import secret_env_patterns

    assert "TWINKLE_DINGTALK_*" in secret_env_patterns()

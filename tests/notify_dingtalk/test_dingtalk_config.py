"""Bad configuration fails at construction with a message naming the argument and the fix."""

from __future__ import annotations

import pytest

from twinkle_core import ConfigurationError, Notifier
from twinkle_core.notify import as_notifier
from twinkle_core.plugins import get_plugin, plugin_system
from twinkle_notify_dingtalk import DingTalkNotifier

HOOK = "https://oapi.dingtalk.com/robot/send?access_token=abc"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"webhook": None}, "webhook=...) must be the robot's webhook URL"),
        ({"webhook": "oapi.dingtalk.com/robot/send"}, "must be an http(s) URL"),
        ({"webhook": "https://oapi.dingtalk.com/robot/send"}, "has no access_token"),
        ({"secret": 42}, "secret=...) must be None or a non-empty string"),
        ({"keyword": ""}, "keyword=...) must be None or a non-empty string"),
        ({"at_mobiles": "13800000000"}, "write at_mobiles=['13800000000']"),
        ({"at_mobiles": [13800000000]}, "entries must be phone numbers as strings"),
        ({"at_all": "yes"}, "at_all=...) must be True or False"),
        ({"timeout": 0}, "timeout=...) must be a positive number of seconds"),
        ({"timeout": True}, "timeout=...) must be a positive number"),
        ({"max_per_minute": 0}, "max_per_minute=...) must be a positive integer"),
        ({"max_per_minute": 2.5}, "max_per_minute=...) must be a positive integer"),
    ],
)
def test_bad_arguments(kwargs, expected):
    args = {"webhook": HOOK, **kwargs}
    with pytest.raises(ConfigurationError) as info:
        DingTalkNotifier(**args)
    assert expected in str(info.value)


def test_missing_environment_names_the_variable():
    with pytest.raises(ConfigurationError, match=r"\$TWINKLE_DINGTALK_WEBHOOK, which is not set"):
        as_notifier("dingtalk")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("TWINKLE_DINGTALK_TIMEOUT", "soon", "$TWINKLE_DINGTALK_TIMEOUT must be a number"),
        ("TWINKLE_DINGTALK_MAX_PER_MINUTE", "1.5", "must be an integer"),
        ("TWINKLE_DINGTALK_AT_ALL", "maybe", "$TWINKLE_DINGTALK_AT_ALL must be 1/0"),
        ("TWINKLE_DINGTALK_TIMEOUT", "-3", "from the TWINKLE_DINGTALK_* environment: "),
    ],
)
def test_bad_environment(monkeypatch, name, value, expected):
    monkeypatch.setenv("TWINKLE_DINGTALK_WEBHOOK", HOOK)
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        DingTalkNotifier.from_env()
    assert expected in str(info.value)


def test_environment_options(monkeypatch):
    monkeypatch.setenv("TWINKLE_DINGTALK_WEBHOOK", HOOK)
    monkeypatch.setenv("TWINKLE_DINGTALK_KEYWORD", "训练")
    monkeypatch.setenv("TWINKLE_DINGTALK_AT_MOBILES", "13800000000, +86-13900000000")
    monkeypatch.setenv("TWINKLE_DINGTALK_AT_ALL", "true")
    monkeypatch.setenv("TWINKLE_DINGTALK_TIMEOUT", "2.5")
    n = DingTalkNotifier.from_env()
    assert (n.keyword, n.at_mobiles, n.at_all, n.timeout) == (
        "训练",
        ("13800000000", "+86-13900000000"),
        True,
        2.5,
    )


def test_registered_as_dingtalk_through_the_entry_point():
    info = {p.name: p for p in plugin_system().plugins()}["dingtalk"]
    assert info.distribution == "twinkle-notify-dingtalk" and info.error is None
    assert info.registers["notifiers"] == ["dingtalk"]
    cls = get_plugin("notifiers", "dingtalk")
    assert cls is DingTalkNotifier and issubclass(cls, Notifier)

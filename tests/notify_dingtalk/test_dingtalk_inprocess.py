"""End to end on the in-process backend: a failing remote function -> one DingTalk message."""

from __future__ import annotations

import time

import pytest
from _support.fake_dingtalk import FakeDingTalk

import twinkle_core
from twinkle_core import DeviceGroup, remote_class, remote_function
from twinkle_notify_dingtalk import DingTalkNotifier


class DataCorrupted(ValueError):
    pass


def _inner_step(rank: int, batch: int) -> None:
    raise DataCorrupted(f"batch {batch} has NaN loss on rank {rank}")


@remote_class()
class Trainer:
    def __init__(self) -> None:
        self.steps = 0

    @remote_function(dispatch="all", collect="none")
    def train_step(self, batch: int, failing_ranks: tuple[int, ...]):
        rank = twinkle_core.get_worker_context().rank
        if rank in failing_ranks:
            _inner_step(rank, batch)
        return rank


def _run_failing_job(notifier, failing_ranks=(1,), name="nightly-llm-run"):
    twinkle_core.initialize(
        mode="inprocess", name=name, groups=[DeviceGroup("trainer", 2, "cpu")], notifier=notifier
    )
    trainer = Trainer(remote_group="trainer")
    started = time.monotonic()
    with pytest.raises(DataCorrupted) as info:
        call_line = _line() + 1
        trainer.train_step(7, failing_ranks)()
    elapsed = time.monotonic() - started
    twinkle_core.shutdown(timeout=10)
    return info.value, call_line, elapsed


def _line() -> int:
    import inspect

    return inspect.currentframe().f_back.f_lineno


def test_failing_remote_function_yields_one_well_formed_message(robot, token, secret):
    notifier = DingTalkNotifier(robot.webhook, secret, at_mobiles=["13800000000"])
    exc, call_line, _ = _run_failing_job(notifier, failing_ranks=(1,))
    # The caller still gets the original exception, tagged with its call site.
    assert "batch 7 has NaN loss on rank 1" in str(exc)

    # shutdown() returned once the alert thread was done: nothing else can still arrive.
    assert len(robot.requests) == 1, [r.as_json() for r in robot.requests]
    (msg,) = robot.requests
    assert msg.body["msgtype"] == "markdown"
    assert msg.title == "twinkle run nightly-llm-run: Trainer.train_step failed"
    text = msg.text
    assert "nightly-llm-run" in text and "inprocess" in text
    assert "`Trainer.train_step`" in text
    assert f"{__file__}:{call_line}" in text  # the driver's call site
    assert "trainer / 1" in text  # group / rank
    assert "DataCorrupted: batch 7 has NaN loss on rank 1" in text
    # The traceback's end: the innermost frame and the raising line.
    tb = text[text.index("```") :]
    assert "in _inner_step" in tb
    assert 'raise DataCorrupted(f"batch {batch} has NaN loss on rank {rank}")' in tb
    assert tb.count("```") == 2  # the code block is closed
    # Mentions: listed in `at` and written into the text, as DingTalk requires.
    assert msg.body["at"] == {"atMobiles": ["13800000000"], "isAtAll": False}
    assert text.rstrip().endswith("@13800000000")


def test_two_ranks_with_the_same_error_are_one_message(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret)
    # Different messages per rank would be two distinct errors; make them identical.
    twinkle_core.initialize(
        mode="inprocess", name="same-error", groups=[DeviceGroup("g", 2, "cpu")], notifier=notifier
    )

    @remote_class()
    class Boom:
        @remote_function(dispatch="all")
        def go(self):
            raise RuntimeError("disk full")

    boom = Boom(remote_group="g")
    for _ in range(3):  # the same failure again is not re-sent either
        with pytest.raises(RuntimeError):
            boom.go()()
    twinkle_core.shutdown(timeout=10)
    assert len(robot.requests) == 1
    assert "g / 0, 1" in robot.requests[0].text


def test_notifier_by_name_from_environment(robot, token, secret, monkeypatch):
    monkeypatch.setenv("TWINKLE_DINGTALK_WEBHOOK", robot.webhook)
    monkeypatch.setenv("TWINKLE_DINGTALK_SECRET", secret)
    monkeypatch.setenv("TWINKLE_DINGTALK_KEYWORD", "twinkle")
    robot.keyword = "twinkle"
    _run_failing_job("dingtalk", name="env-configured")
    (msg,) = robot.requests
    assert "env-configured" in msg.title and msg.ok


def test_keyword_robot_gets_the_keyword(token):
    with FakeDingTalk(token, secret=None, keyword="告警") as server:
        _run_failing_job(DingTalkNotifier(server.webhook, keyword="告警"))
        (msg,) = server.requests
        assert msg.text.startswith("告警") and msg.title.startswith("[告警]")


def test_keyword_robot_refuses_messages_without_it(token, dtlog):
    with FakeDingTalk(token, secret=None, keyword="告警") as server:
        notifier = DingTalkNotifier(server.webhook, timeout=2)
        _run_failing_job(notifier)
        assert server.requests[0].errcode == 310000
        assert server.delivered == []
        assert len(server.requests) == 1  # a refusal is not retried
    assert "errcode 310000: keywords not in content" in dtlog.text
    assert "keyword=" in dtlog.text  # the hint says what to configure

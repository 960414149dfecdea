"""The markdown message DingTalk receives: title, keyword, mentions, size."""

from __future__ import annotations

import json

from _support.fake_dingtalk import FakeDingTalk

from twinkle_notify_dingtalk import MAX_BODY_BYTES, DingTalkNotifier
from twinkle_notify_dingtalk.notifier import MAX_TITLE_CHARS

HOOK = "https://oapi.dingtalk.com/robot/send?access_token=abc"


def _message(notifier: DingTalkNotifier, title: str, text: str) -> dict:
    body = notifier._payload(title, text)
    assert len(body) <= MAX_BODY_BYTES
    return json.loads(body)


def test_markdown_message_shape():
    msg = _message(DingTalkNotifier(HOOK, at_all=True), "t", "**bold**")
    assert msg == {
        "msgtype": "markdown",
        "markdown": {"title": "t", "text": "**bold**"},
        "at": {"atMobiles": [], "isAtAll": True},
    }


def test_long_title_is_cut_for_the_preview():
    msg = _message(DingTalkNotifier(HOOK, keyword="KW"), "x" * 500, "text")
    title = msg["markdown"]["title"]
    assert len(title) == MAX_TITLE_CHARS and title.startswith("[KW] ") and title.endswith("…")


def test_keyword_survives_truncation():
    # The keyword is only in the middle of a huge text: the cut would remove it.
    text = "head\n" + "\n".join(f"line {i}" for i in range(5000)) + "\nKW here\n" + "y\n" * 5000
    msg = _message(DingTalkNotifier(HOOK, keyword="KW"), "title", text)
    assert msg["markdown"]["text"].startswith("KW\n\nhead")


def test_mentions_fit_and_reach_the_robot(token):
    big = "z" * 100_000
    with FakeDingTalk(token, secret=None, keyword="告警") as server:
        notifier = DingTalkNotifier(
            server.webhook, keyword="告警", at_mobiles=["13800000000", "13900000000"]
        )
        notifier.send("mention", big)
        notifier.close(timeout=5)
        (req,) = server.requests
        assert req.ok and req.size <= MAX_BODY_BYTES
        assert req.text.endswith("@13800000000 @13900000000")
        assert req.body["at"]["atMobiles"] == ["13800000000", "13900000000"]

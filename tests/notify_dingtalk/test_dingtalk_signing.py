"""Signed mode, checked against the fake robot (which verifies it independently)."""

from __future__ import annotations

import time
import urllib.parse

from _support.fake_dingtalk import FakeDingTalk, expected_sign
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_notify_dingtalk import signature, signed_url
from twinkle_notify_dingtalk.transport import post

BODY = b'{"msgtype":"markdown","markdown":{"title":"t","text":"x"}}'


def test_known_vector():
    # printf "1700000000000\\nSECabc" | openssl dgst -sha256 -hmac SECabc -binary | base64
    assert signature(1700000000000, "SECabc") == expected_sign("1700000000000", "SECabc")
    assert signature(1700000000000, "SECabc") == "jcUpW0QmtKduN03n4JqQ0PBosVjqnM8gU7fIIvsDmCM="


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(min_size=1, max_size=80).filter(lambda s: "\x00" not in s),
    ts=st.integers(min_value=0, max_value=2**45),
)
def test_sign_survives_url_encoding(secret, ts):
    url = signed_url("https://oapi.dingtalk.com/robot/send?access_token=abc", secret, ts)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert query["access_token"] == "abc"
    assert query["timestamp"] == str(ts)
    # base64 has '+', '/' and '=': they must arrive intact, not as spaces.
    assert query["sign"] == expected_sign(str(ts), secret)


def test_no_secret_leaves_the_url_alone():
    url = "https://oapi.dingtalk.com/robot/send?access_token=abc"
    assert signed_url(url, None) == url


def test_robot_accepts_signature_and_rejects_bad_ones(token, secret):
    with FakeDingTalk(token, secret) as robot:
        assert post(signed_url(robot.webhook, secret), BODY, 5).ok
        wrong = post(signed_url(robot.webhook, secret + "x"), BODY, 5)
        assert (wrong.ok, wrong.transient, wrong.errcode) == (False, False, 310000)
        assert "sign not match" in wrong.detail
        unsigned = post(robot.webhook, BODY, 5)
        assert unsigned.errcode == 310000
        stale = int(time.time() * 1000) - 2 * 3600 * 1000  # outside DingTalk's 1-hour window
        old = post(signed_url(robot.webhook, secret, stale), BODY, 5)
        assert old.errcode == 310000 and "timestamp" in old.detail
        bad_token = post(signed_url(robot.webhook.replace(token, "nope"), secret), BODY, 5)
        assert bad_token.errcode == 300001 and "access_token" in bad_token.detail
        assert [r.errcode for r in robot.requests] == [0, 310000, 310000, 310000, 300001]

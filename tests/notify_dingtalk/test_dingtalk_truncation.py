"""Over-size messages are cut to DingTalk's limit, keeping the head and the traceback's end."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import twinkle_core
from twinkle_core import DeviceGroup, remote_class, remote_function
from twinkle_notify_dingtalk import DINGTALK_MAX_BODY_BYTES, MAX_BODY_BYTES, DingTalkNotifier
from twinkle_notify_dingtalk.truncate import cut_middle, fit_text, json_cost


@pytest.fixture(autouse=True, scope="module")
def _no_alert_thread_still_sending():
    """Hypothesis reports any change of the global `random` state while it draws examples as a
    HypothesisDeprecationWarning ("Do not use the `random` module inside strategies"). An alert
    thread that an earlier test's bounded shutdown left behind may still be retrying, and the
    notifier's back-off jitter draws from `random`: wait for such threads before drawing."""
    for thread in threading.enumerate():
        if thread.name == "twinkle-alerts":
            thread.join(60)
            assert not thread.is_alive(), "an alert thread of an earlier test is still sending"


lines = st.one_of(
    st.text(max_size=60),
    st.text(alphabet='ab"\\\t错误🔥\x01', min_size=100, max_size=3000),
    st.just("```"),
    st.just("```python"),
)
texts = st.lists(lines, max_size=80).map("\n".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, budget=st.integers(min_value=0, max_value=6000))
def test_fit_text_respects_the_budget(text, budget):
    out = fit_text(text, budget)
    assert json_cost(out) <= budget
    assert json_cost(out) == len(json.dumps(out, ensure_ascii=False).encode()) - 2
    if json_cost(text) <= budget:
        assert out == text


@settings(max_examples=200, deadline=None)
@given(
    head=st.lists(st.text(alphabet="abc xyz:", max_size=50), min_size=1, max_size=8),
    frames=st.lists(st.text(alphabet="abcdef ()=.,", min_size=1, max_size=200), max_size=400),
    last=st.text(alphabet="ABCDEFG: ", min_size=1, max_size=60),
)
def test_keeps_head_and_traceback_end_with_balanced_fences(head, frames, last):
    text = "\n".join([*head, "", "```", *frames, last, "```"])
    budget = 3000
    out = fit_text(text, budget)
    assert json_cost(out) <= budget
    out_lines = out.split("\n")
    assert out_lines[0] == head[0]  # the head survives
    assert out_lines[-2:] == [last, "```"]  # so does the end of the traceback
    fences = [ln for ln in out_lines if ln.lstrip().startswith("```")]
    assert len(fences) % 2 == 0  # the code block renders


def test_fence_is_reopened_when_the_cut_swallows_it():
    head = "\n".join(f"header line {i} " + "h" * 50 for i in range(60))
    text = head + "\n```\n" + "\n".join(f"frame {i}" for i in range(2000)) + "\nBoom: end\n```"
    out = fit_text(text, 4000)
    assert out.endswith("frame 1999\nBoom: end\n```")
    before_tail = out[: out.index("frame 1999")]
    assert before_tail.count("```") % 2 == 1  # a fence opened again before the kept frames
    assert out.count("```") % 2 == 0


def test_cut_middle_keeps_both_ends():
    text = "START" + "x" * 10000 + "END"
    out = cut_middle(text, 200)
    assert out.startswith("START") and out.endswith("END") and json_cost(out) <= 200


@remote_class()
class Exploder:
    @remote_function(dispatch="all", collect="none")
    def explode(self):
        def level_a(n):
            return level_b(n) if n else step_final()

        def level_b(n):
            return level_a(n - 1)

        def step_final():
            detail = "".join(f"{i:06d}," for i in range(20000))  # a 140 kB message
            raise ValueError(f"tensor mismatch: {detail} END-OF-MESSAGE")

        return level_a(150)


def test_huge_failure_is_delivered_cut(robot, secret):
    notifier = DingTalkNotifier(robot.webhook, secret, keyword="twinkle")
    robot.keyword = "twinkle"
    twinkle_core.initialize(
        mode="inprocess", name="huge", groups=[DeviceGroup("g", 1, "cpu")], notifier=notifier
    )
    with pytest.raises(ValueError):
        Exploder(remote_group="g").explode()()
    twinkle_core.shutdown(timeout=10)
    (msg,) = robot.wait_for(1, timeout=5)
    assert msg.ok  # accepted by the robot: no 460101 "message too long"
    assert msg.size <= MAX_BODY_BYTES < DINGTALK_MAX_BODY_BYTES
    text = msg.text
    assert "huge" in text and "`Exploder.explode`" in text and "g / 0" in text
    assert "ValueError: tensor mismatch: 000000," in text  # head of the error line
    assert text.rstrip().endswith("END-OF-MESSAGE\n```")  # the traceback's very end
    assert "in step_final" in text  # the innermost frame is kept
    assert "bytes cut]" in text and "…[cut]" in text  # lines removed, long lines cut


def test_terminal_colours_are_removed():
    from twinkle_notify_dingtalk.truncate import sanitize

    raw = "\x1b[36mray::Actor.call()\x1b[39m (pid=1)\n\x1b]8;;http://x\x07link\x1b]8;;\x07 \udcff"
    assert sanitize(raw) == "ray::Actor.call() (pid=1)\nlink ?"

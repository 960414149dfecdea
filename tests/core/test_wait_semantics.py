"""`wait(lazies, num_returns=k)` behaves like `ray.wait`: at most k done, the rest pending, so a
Ray-style loop sees every result exactly once (issue 30, item 5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import LazyCollect, wait


def _finished(value):
    return LazyCollect(lambda timeout=None: value, is_done=lambda: True)


def test_at_most_num_returns_are_done_when_more_finished():
    lazies = [_finished(i) for i in range(3)]
    done, pending = wait(lazies, num_returns=1)
    assert done == [lazies[0]] and pending == lazies[1:]


@given(st.integers(1, 12), st.data())
def test_the_ray_style_loop_gets_every_result_once(n, data):
    lazies = [_finished(i) for i in range(n)]
    pending, got = list(lazies), []
    while pending:
        k = data.draw(st.integers(1, len(pending)))
        ready, pending = wait(pending, num_returns=k)
        assert len(ready) == k
        got.extend(x() for x in ready)
    assert sorted(got) == list(range(n))


def test_done_lists_calls_in_the_order_they_finished():
    flags = {"late": False}
    early = _finished("early")
    late = LazyCollect(lambda timeout=None: "late", is_done=lambda: flags["late"])
    # `late` comes first in the list but finishes later: done lists `early` first
    calls = [late, early]
    done, pending = wait(calls, num_returns=1)
    assert done == [early] and pending == [late]
    flags["late"] = True
    done, pending = wait(pending, num_returns=1)
    assert done == [late] and pending == []


def test_num_returns_zero_returns_at_once_with_nothing_done():
    lazies = [_finished(1)]
    assert wait(lazies, num_returns=0) == ([], lazies)


def test_waiting_for_no_calls_returns_at_once_as_ray_wait_does():
    assert wait([]) == ([], [])
    assert wait([], num_returns=1, timeout=0) == ([], [])

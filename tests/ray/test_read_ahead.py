"""`read_ahead.ReadAhead` alone, with stand-in calls: which calls a look asks about, and how
often it looks. The Ray side (calls really fetched together) is in test_call_path.py."""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st

from twinkle_ray.read_ahead import LOOK_CALLS, MAX_SKIP, WORTH, ReadAhead


class Call:
    def __init__(self, settled: bool) -> None:
        self.settled = settled


def _settled(call: Call) -> bool:
    return call.settled


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=200))
def test_a_look_asks_about_the_oldest_calls_in_flight_in_issue_order(shape):
    """Of calls issued in order, some settled, some no longer referenced: a look asks about
    the first `LOOK_CALLS` live unsettled calls, in the order issued, and the calls before the
    first of them are forgotten."""
    ahead = ReadAhead()
    kept = []
    call = None
    for settled, referenced in shape:
        call = Call(settled)
        ahead.issued(call)
        if referenced:
            kept.append(call)
    del call  # the loop's last one: referenced only through `kept`, like the others
    gc.collect()
    live = [c for c in kept if not c.settled]
    assert ahead.in_flight(_settled) == live[:LOOK_CALLS]
    if live:
        assert ahead.calls[0]() is live[0]
    else:
        assert not ahead.calls


@given(st.lists(st.integers(0, LOOK_CALLS), min_size=1, max_size=300))
def test_looks_that_do_not_pay_get_rarer(finds):
    """Each fetch alone may look; a look that found fewer than `WORTH` finished calls makes
    the next looks skip 1, 2, 4, ... `MAX_SKIP` fetches; one that found enough looks again at
    the next fetch. Checked against that rule step by step."""
    ahead = ReadAhead()
    calls = [Call(False) for _ in range(LOOK_CALLS)]
    for call in calls:
        ahead.issued(call)
    looks: list[int] = []
    found = iter(finds)

    def ask(asked: list[Call]) -> None:
        looks.append(step)
        n = next(found, 0)
        for i, call in enumerate(asked):
            call.settled = i < n

    skip, backoff, expected = 0, 1, []
    n_iter = iter(finds)
    for step in range(len(finds) * 4):
        for call in calls:
            call.settled = False
        ahead.after_fetch(_settled, ask)
        if skip > 0:
            skip -= 1
            continue
        expected.append(step)
        if next(n_iter, 0) >= WORTH:
            backoff = 1
        else:
            skip, backoff = backoff, min(2 * backoff, MAX_SKIP)
    assert looks == expected


def test_with_nothing_in_flight_a_fetch_asks_nothing():
    ahead = ReadAhead()
    done = Call(True)
    ahead.issued(done)
    asked: list = []
    ahead.after_fetch(_settled, asked.append)
    assert asked == [] and not ahead.calls

"""`read_ahead.ReadAhead` alone, with stand-in calls: which calls a look asks about, and how
often it looks. The Ray side (calls really fetched together) is in test_call_path.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from twinkle_ray.read_ahead import LOOK_CALLS, MAX_SKIP, WORTH, ReadAhead


class Call:
    def __init__(self, settled: bool) -> None:
        self.settled = settled


def _settled(call: Call) -> bool:
    return call.settled


@given(
    st.lists(st.sampled_from(["running", "settled", "forgotten"]), max_size=300),
    st.integers(1, 400),
)
def test_a_look_asks_about_the_oldest_unsettled_calls_in_issue_order(shape, keep):
    """Of calls issued in order, some settled unannounced, some settled and forgotten (as a
    call is when it fetches, fails or is found finished), and at most `keep` remembered: a
    look asks about the unsettled ones among the oldest `LOOK_CALLS` remembered, in the order
    issued; it forgets the settled ones it met; a forgotten call is never asked about again,
    and nothing else is kept."""
    import twinkle_ray.read_ahead as read_ahead

    ahead = ReadAhead()
    remembered: list[Call] = []  # the model: issued in order, the oldest gone beyond `keep`
    old_keep, read_ahead.KEEP = read_ahead.KEEP, keep
    try:
        for state in shape:
            call = Call(state != "running")
            ahead.issued(call)
            remembered.append(call)
            if len(remembered) > keep:
                remembered.pop(0)
            if state == "forgotten":
                ahead.forget(call)
                remembered.remove(call)
    finally:
        read_ahead.KEEP = old_keep
    oldest = remembered[:LOOK_CALLS]
    assert ahead.in_flight(_settled) == [c for c in oldest if not c.settled]
    assert list(ahead.calls.values()) == [c for c in remembered if c not in oldest or not c.settled]
    for call in list(ahead.calls.values()):
        ahead.forget(call)
    assert not ahead.calls


def test_a_call_remembered_is_kept_until_forgotten():
    """The look-ahead keeps its calls strongly (no weak reference per call in flight): a call
    dropped unresolved stays until it settles, which the runtime's settling of calls nobody
    collected sees to, and is then let go."""
    import gc
    import weakref

    ahead = ReadAhead()
    call = Call(False)
    ref = weakref.ref(call)
    ahead.issued(call)
    del call
    gc.collect()
    assert ref() is not None
    ahead.forget(ref())
    gc.collect()
    assert ref() is None


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

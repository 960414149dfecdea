"""How one rank's outcome is packed for the others under torchrun (`twinkle_local.calls.encode`
and `decode`): plain `pickle` for what it can name, by value for closures and classes made in
a method (as Ray sends results), and a failure of that rank for what is tied to its process.
The same through real torchrun jobs: conformance checks `results_made_in_the_call` and
`error_unsendable_result` (test_conformance_kit.py)."""

from __future__ import annotations

import os
import pickle
import threading

from hypothesis import given
from hypothesis import strategies as st

from twinkle_core.plugin import WorkerFailure
from twinkle_local.calls import decode, encode


def _round_trip(value):
    blob, ok = encode(True, value, 1, "node-a", "M.f")
    return ok, decode(blob, 1, "node-a", "M.f")


def _made_here(k: int):
    class Point:
        def __init__(self, x: int) -> None:
            self.x = x

    return {"scale": lambda x: x * k, "point": Point(k), "plain": [k, "k"]}


def test_closures_and_local_classes_travel_by_value():
    ok, (got_ok, value) = _round_trip(_made_here(3))
    assert ok and got_ok
    assert value["scale"](5) == 15
    assert type(value["point"]).__name__ == "Point" and value["point"].x == 3
    assert value["plain"] == [3, "k"]


def test_what_pickle_can_name_takes_plain_pickle():
    """The fast path stays `pickle`'s own stream (cloudpickle's would reference cloudpickle)."""
    blob, ok = encode(True, {"step": 3, "values": [1.5, 2.5]}, 0, None, "M.f")
    assert ok and b"cloudpickle" not in blob
    assert pickle.loads(blob) == (True, {"step": 3, "values": [1.5, 2.5]})


def test_an_open_file_is_refused_not_sent_as_a_copy():
    with open(os.devnull) as f:
        ok, (got_ok, failure) = _round_trip({"out": [f]})
    assert not ok and not got_ok and isinstance(failure, WorkerFailure)
    message = str(failure.exception)
    assert isinstance(failure.exception, TypeError) and failure.rank == 1
    assert message.startswith("the result of M.f on rank 1 (dict) cannot be sent back"), message
    assert "'TextIOWrapper' object (an open file)" in message


def test_a_closure_over_a_lock_is_refused_with_picklings_own_reason():
    lock = threading.Lock()
    ok, (got_ok, failure) = _round_trip(lambda: lock)
    assert not ok and not got_ok
    message = str(failure.exception)
    assert "on rank 1 (function) cannot be sent back" in message, message
    assert "cannot pickle '_thread.lock' object" in message, message  # the reason, not "local"


@given(
    st.recursive(
        st.none() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    st.integers(-5, 5),
)
def test_plain_values_beside_a_closure_come_back_equal(plain, k):
    ok, (got_ok, value) = _round_trip({"plain": plain, "f": lambda x: x + k})
    assert ok and got_ok and value["plain"] == plain and value["f"](1) == 1 + k

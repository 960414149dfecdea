"""`twinkle_core.get(calls)`: every value in the order given, as `ray.get` of a list. Core
lets each backend wait for all its calls at once (`PendingCall.fetch_many`), then collects
each call as calling it would; a failure found among finished calls raises before the calls
given earlier that still run are waited for."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import CallTimeoutError, ConfigurationError, LazyCollect, get
from twinkle_core.backend import PendingCall


class Fetched(PendingCall):
    """A pending call whose backend fetches many at once: `fetch_many` records each round and
    marks the calls fetched; `wait` refuses to run for a call that was not."""

    rounds: list[tuple[list[Fetched], float | None]] = []

    def __init__(self, value: object) -> None:
        self.value = value
        self.fetched = False

    @classmethod
    def fetch_many(cls, calls: list[PendingCall], timeout: float | None) -> None:
        cls.rounds.append((list(calls), timeout))  # type: ignore[arg-type]
        for call in calls:
            call.fetched = True  # type: ignore[attr-defined]

    def wait(self, timeout: float | None) -> list:
        assert self.fetched, "collected before the backend fetched it"
        return [self.value]

    def done(self) -> bool:
        return self.fetched


class Plain(PendingCall):
    """A pending call of a backend without `fetch_many`: finished, or failed, or running
    until `release` is set."""

    def __init__(self, value: object = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.release = threading.Event()
        self.finished = error is not None or value is not None

    def wait(self, timeout: float | None) -> list:
        if not self.finished and not self.release.wait(timeout):
            raise CallTimeoutError("still running")
        if self.error is not None:
            raise self.error
        return [self.value]

    def done(self) -> bool:
        return self.finished or self.release.is_set()


def _lazy(pending: PendingCall) -> LazyCollect:
    source = SimpleNamespace(pending=pending)
    return LazyCollect(lambda timeout: pending.wait(timeout)[0], source=source)


@given(st.lists(st.integers(0, 5), max_size=12))
def test_values_in_the_order_given_with_each_call_fetched_once(picks):
    """Any list of calls, repeats included: the values in that order, one fetch round with
    each distinct call once, and every call resolved."""
    Fetched.rounds = []
    calls = [Fetched(i * 10) for i in range(6)]
    lazies = [_lazy(c) for c in calls]
    chosen = [lazies[i] for i in picks]
    assert get(chosen, timeout=30) == [i * 10 for i in picks]
    distinct = list(dict.fromkeys(picks))
    if distinct:
        assert len(Fetched.rounds) == 1
        fetched, timeout = Fetched.rounds[0]
        assert fetched == [calls[i] for i in distinct]
        assert timeout is not None and 0 < timeout <= 30
    else:
        assert Fetched.rounds == []
    assert all(lazies[i].resolved for i in distinct)


def test_resolved_calls_are_not_fetched_again():
    Fetched.rounds = []
    calls = [Fetched(i) for i in range(3)]
    lazies = [_lazy(c) for c in calls]
    calls[0].fetched = True
    assert lazies[0]() == 0
    assert get(lazies) == [0, 1, 2]
    assert Fetched.rounds == [(calls[1:], None)]


def test_a_failure_among_finished_calls_raises_before_a_running_call_given_first():
    running = Plain()  # runs until released: get must not wait for it
    failed = Plain(error=ValueError("bad batch"))
    lazies = [_lazy(running), _lazy(failed)]
    with pytest.raises(ValueError, match="bad batch"):
        get(lazies, timeout=30)
    assert not running.release.is_set()
    running.release.set()
    running.value = "late"
    assert lazies[0]() == "late"


def test_a_timeout_raises_the_running_calls_timeout():
    running = Plain()
    with pytest.raises(CallTimeoutError):
        get([_lazy(Plain(value=1)), _lazy(running)], timeout=0.05)


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        (lambda lazy: get(lazy), r"got one LazyCollect; call it"),
        (lambda lazy: get([lazy, 3]), r"only LazyCollect .* got int"),
        (lambda lazy: get([lazy], timeout=-1), r"get\(timeout=\.\.\.\) must be None or"),
        (lambda lazy: get([lazy], timeout="1"), r"get\(timeout=\.\.\.\) must be None or"),
    ],
)
def test_bad_input_is_a_configuration_error_saying_what_to_do(bad, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        bad(_lazy(Plain(value=1)))


@pytest.mark.parametrize("bad", [-1, -0.5, "5", True, [3]])
def test_a_lazys_own_timeout_is_a_number_of_seconds_or_none(bad):
    # A negative timeout meant "no limit" to Ray's ray.get and "now" to a lock: refused in
    # every mode, before anything waits (the call here never finishes).
    lazy = _lazy(Plain())
    with pytest.raises(ConfigurationError, match=r"LazyCollect\(timeout=\.\.\.\) must be None or"):
        lazy(timeout=bad)


def test_a_lazys_timeout_may_be_any_real_number_type():
    import numpy as np

    lazy = _lazy(Plain(value=7))
    assert lazy(timeout=np.float64(1.5)) == 7 and lazy(timeout=0) == 7 and lazy(3) == 7

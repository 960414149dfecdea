"""`PendingCall.ask_many`: before going through many calls' `done()`, core lets each backend
ask about all of them at once (for Ray one `ray.wait` instead of one per call)."""

from __future__ import annotations

from types import SimpleNamespace

from twinkle_core import LazyCollect, as_completed, wait
from twinkle_core.backend import PendingCall


class Asked(PendingCall):
    """A pending call that is done once `finished`; records every `ask_many`."""

    rounds: list[list[Asked]] = []

    def __init__(self, finished: bool) -> None:
        self.finished = finished

    @classmethod
    def ask_many(cls, calls: list[PendingCall]) -> None:
        cls.rounds.append(list(calls))  # type: ignore[arg-type]

    def wait(self, timeout: float | None) -> list:
        return [None]

    def done(self) -> bool:
        return self.finished


def _lazy(pending: PendingCall) -> LazyCollect:
    return LazyCollect(lambda timeout: None, source=SimpleNamespace(pending=pending))


def test_wait_asks_the_backend_about_every_unresolved_call_at_once():
    Asked.rounds = []
    calls = [Asked(finished=i % 2 == 0) for i in range(6)]
    lazies = [_lazy(c) for c in calls]
    lazies[0]()  # resolved: nothing to ask
    done, pending = wait(lazies, num_returns=2, timeout=0)
    assert Asked.rounds == [calls[1:]]  # one round, every unresolved call in it
    # at most num_returns done, as ray.wait: the third finished one stays in pending
    assert done == [lazies[0], lazies[2]] and pending == [
        lazies[1],
        lazies[3],
        lazies[4],
        lazies[5],
    ]


def test_as_completed_asks_once_per_round():
    Asked.rounds = []
    calls = [Asked(finished=False) for _ in range(3)]
    lazies = [_lazy(c) for c in calls]
    got = as_completed(lazies, timeout=10)
    calls[1].finished = True
    assert next(got) is lazies[1]
    assert Asked.rounds == [calls]
    calls[0].finished = calls[2].finished = True
    assert list(got) == [lazies[0], lazies[2]]
    assert Asked.rounds[1] == [calls[0], calls[2]]


def test_done_alone_needs_no_ask_many():
    """`done()` of one call works for a backend without `ask_many` (the default does
    nothing), and a LazyCollect without `is_done` asks its source's pending call."""
    Asked.rounds = []
    lazy = _lazy(Asked(finished=True))
    assert lazy.done() and Asked.rounds == []

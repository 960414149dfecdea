"""A group's calls in the order issued, and a look at the next ones after a call fetched its own.

User code resolves the LazyCollects of calls it issued in a batch one by one, in the order
made (`[lazy() for lazy in lazies]`). Each resolved alone is one `ray.get` of its refs, which
costs Ray about twice what a ref costs in one `ray.get` of the whole list, as raw Ray code
would fetch them (8.5 against 4.6 us of driver CPU here). So after a call fetched its own
replies, the next calls of its group still in flight are asked whether they finished
(`RayPendingCall.ask_many`: one `ray.wait`, timeout 0, nothing fetched); the finished ones
join the group's `finished` and the next of them collected fetches them all in one `ray.get`
(`pending.fetch_finished`). Only the replies travel, as for every collected call: large
results stay in the object store until opened.

A look that finds fewer than `WORTH` finished (the workers are behind: each collect waits
anyway) makes the next looks rarer, doubling the calls skipped up to `MAX_SKIP`; one that
finds enough makes them every time again. So a loop collecting calls as the workers finish
them pays one `ray.wait` per `MAX_SKIP` calls at most.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable
from typing import Any

#: How many calls in flight one look asks about, at most.
LOOK_CALLS = 64
#: A look pays when it finds at least this many calls finished: its `ray.wait` of 64 refs
#: costs the driver 9 us when all finished, 27 when some still run, and each call fetched
#: with others rather than alone saves 2.5-4 us (`benchmarks/ab_issue_path.py`, part 3: a
#: call collected 10.5 against 13.0 us; measured on the 2-core machine).
WORTH = 8
#: The most calls skipped between two looks that did not pay.
MAX_SKIP = 64
#: How many issued calls are remembered (weakly): a group's calls in flight beyond this many
#: are not looked at ahead, which costs only the batching.
KEEP = 4096


class ReadAhead:
    """One group's calls in issue order (weak references) and when to look at them next."""

    __slots__ = ("_backoff", "_skip", "calls")

    def __init__(self) -> None:
        self.calls: collections.deque[weakref.ref[Any]] = collections.deque(maxlen=KEEP)
        self._skip = 0
        self._backoff = 1

    def issued(self, call: Any) -> None:
        """Remember `call`, just submitted."""
        self.calls.append(weakref.ref(call))

    def in_flight(self, settled: Callable[[Any], bool]) -> list[Any]:
        """The oldest calls not `settled`, at most `LOOK_CALLS`; settled ones and the ones
        no longer referenced are dropped from the front."""
        calls = self.calls
        try:
            while calls:
                call = calls[0]()
                if call is not None and not settled(call):
                    break
                calls.popleft()
            found = []
            for i in range(min(len(calls), LOOK_CALLS)):
                call = calls[i]()
                if call is not None and not settled(call):
                    found.append(call)
            return found
        except IndexError:  # another thread dropped calls meanwhile: look next time
            return []

    def after_fetch(self, settled: Callable[[Any], bool], ask: Callable[[list[Any]], None]) -> None:
        """A call fetched its replies alone: `ask` about the next calls in flight, unless the
        last looks found nothing (then skip calls, more after each empty look)."""
        if self._skip > 0:
            self._skip -= 1
            return
        calls = self.in_flight(settled)
        if not calls:
            return
        ask(calls)
        if sum(1 for call in calls if settled(call)) >= WORTH:
            self._backoff = 1
        else:
            self._skip = self._backoff
            self._backoff = min(2 * self._backoff, MAX_SKIP)

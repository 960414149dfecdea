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

The calls are kept in a dict by `id`, in issue order, each dropped the moment it settles
(`forget`: fetched, failed, or found finished by a look): no object per call in flight (a weak
reference per call was one more for the garbage collector to promote with every call in
flight, about 1.5 us per call in a burst of 1000: docs/performance.md). A call is kept no
longer than the runtime keeps it anyway (until collected, or settled by the runtime), and at
most `KEEP` calls. Only drivers keep calls: a worker calling a group (no runtime watching its
calls) has no read-ahead, so nothing keeps calls it dropped unresolved.
"""

from __future__ import annotations

import itertools
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
#: How many issued calls are remembered: a group's calls in flight beyond this many are not
#: looked at ahead (the oldest are forgotten), which costs only the batching.
KEEP = 4096


class ReadAhead:
    """One group's unsettled calls in issue order, and when to look at them next."""

    __slots__ = ("_backoff", "_skip", "calls")

    def __init__(self) -> None:
        #: `id(call)` -> call, in issue order; a call leaves when it settles (`forget`).
        self.calls: dict[int, Any] = {}
        self._skip = 0
        self._backoff = 1

    def issued(self, call: Any) -> None:
        """Remember `call`, just submitted (the oldest is forgotten beyond `KEEP`)."""
        calls = self.calls
        calls[id(call)] = call
        if len(calls) > KEEP:
            try:
                del calls[next(iter(calls))]
            except (KeyError, RuntimeError, StopIteration):  # another thread changed it
                pass

    def forget(self, call: Any) -> None:
        """`call` settled: nothing left to look at (and nothing here keeps it alive)."""
        self.calls.pop(id(call), None)

    def in_flight(self, settled: Callable[[Any], bool]) -> list[Any]:
        """Of the oldest `LOOK_CALLS` calls, those not `settled`; settled ones (a call may
        settle without being told to `forget`) are forgotten."""
        calls = self.calls
        try:  # a copy made in C: no other thread runs while it is made
            oldest = list(itertools.islice(calls.values(), LOOK_CALLS))
        except RuntimeError:  # changed meanwhile: look next time
            return []
        found = []
        for call in oldest:
            if settled(call):
                calls.pop(id(call), None)
            else:
                found.append(call)
        return found

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

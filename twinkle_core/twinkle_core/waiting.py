"""Waiting on many calls at once: `get` (as `ray.get` of a list), `wait` (as `ray.wait`) and
`as_completed` (as `concurrent.futures.as_completed`), for every backend.

`get` lets each backend wait for all its calls in one round trip (`PendingCall.fetch_many`),
then collects each call as calling it would.

Both only ask each LazyCollect whether it is done (`done()` never blocks; each round first lets
the backends ask about all the calls at once, `PendingCall.ask_many`), with a short sleep
that grows from 1 ms to 20 ms between rounds: no thread per call, and a finished call is seen
within about 20 ms whatever the backend.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import CallTimeoutError, ConfigurationError
from .lazy import LazyCollect, ask_many, check_timeout, fetch_many

_FIRST_SLEEP, _MAX_SLEEP = 0.001, 0.02


def _as_list(
    lazies: Iterable[LazyCollect],
    function: str,
    *,
    repeats: bool = False,
    for_one: str = "",
) -> list[LazyCollect]:
    """`lazies` as a list, checked: only LazyCollects, each once unless `repeats`; `for_one`
    says what to do instead when given a single LazyCollect."""
    if isinstance(lazies, LazyCollect):
        raise ConfigurationError(
            f"{function}(lazies=...) takes a list of LazyCollect, got one LazyCollect; "
            f"{for_one or f'wrap it: {function}([lazy])'}"
        )
    items = list(lazies)
    bad = [x for x in items if not isinstance(x, LazyCollect)]
    if bad:
        raise ConfigurationError(
            f"{function}(lazies=...) must hold only LazyCollect (what remote calls return), "
            f"got {type(bad[0]).__name__}: {bad[0]!r}"
        )
    if not repeats and len({id(x) for x in items}) != len(items):
        raise ConfigurationError(f"{function}(lazies=...) holds the same LazyCollect twice")
    return items


def get(lazies: Iterable[LazyCollect], timeout: float | None = None) -> list[Any]:
    """The values of many calls, in the order given: as `ray.get` of a list of refs.

    Where calling each LazyCollect in turn waits for each call on its own, this waits for all
    of them at once (on Ray, one `ray.get` of every call's results), then collects each call
    as calling it would: the same values, the same collectors, and each value cached on its
    LazyCollect. A failed call raises its failure, tagged with its own call site; the first
    failure seen ends the wait (fail fast), without waiting for the calls still running.
    `CallTimeoutError` when calls are still running `timeout` seconds after the call, naming
    the first of them. The same LazyCollect may be given more than once.
    """
    items = _as_list(
        lazies, "get", repeats=True, for_one="call it for its value instead: lazy(timeout)"
    )
    check_timeout(timeout, "get")
    deadline = None if timeout is None else time.monotonic() + timeout

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    fetch_many(items, timeout)
    # Fail fast: a call found failed raises now, not once the calls given before it finished.
    ask_many(items)
    for x in items:
        if not x.resolved and x.done():
            x(left())
    return [x(left()) for x in items]


def wait(
    lazies: Iterable[LazyCollect], num_returns: int = 1, timeout: float | None = None
) -> tuple[list[LazyCollect], list[LazyCollect]]:
    """Wait until `num_returns` of the calls finished, or `timeout` seconds passed.

    Returns `(done, pending)` like `ray.wait`: at most `num_returns` finished calls in `done`,
    in the order they were seen finishing (calls seen in the same round in the order given),
    and every other call in `pending`, in the order given, finished ones included, so the
    loop `ready, pending = wait(pending, num_returns=1)` loses none (and ends: `wait([])` is
    `([], [])`). A failed call counts as done (calling it raises); nothing is collected here.
    """
    items = _as_list(lazies, "wait")
    check_timeout(timeout, "wait")
    if not items:  # as `ray.wait([])`: nothing to wait for, whatever num_returns says
        return [], []
    if (
        isinstance(num_returns, bool)
        or not isinstance(num_returns, int)
        or not (0 <= num_returns <= len(items))
    ):
        raise ConfigurationError(
            f"wait(num_returns=...) must be an integer from 0 to {len(items)} (the number of "
            f"calls given), got {num_returns!r}"
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    sleep = _FIRST_SLEEP
    finished: list[LazyCollect] = []  # in the order seen finishing
    seen: set[int] = set()
    while True:
        ask_many(items)
        for x in items:
            if id(x) not in seen and x.done():
                seen.add(id(x))
                finished.append(x)
        if len(finished) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
            break
        pause = sleep if deadline is None else min(sleep, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        sleep = min(sleep * 2, _MAX_SLEEP)
    done = finished[:num_returns]
    taken = {id(x) for x in done}
    return done, [x for x in items if id(x) not in taken]


def as_completed(
    lazies: Iterable[LazyCollect], timeout: float | None = None
) -> Iterator[LazyCollect]:
    """Yield each call as it finishes (a failed one too: calling it raises).

    Raises `CallTimeoutError` (a `TimeoutError`) when calls are still running `timeout`
    seconds after the first `next()`, as `concurrent.futures.as_completed` does.
    """
    items = _as_list(lazies, "as_completed")
    check_timeout(timeout, "as_completed")
    return _completed(items, timeout)


def _completed(items: list[LazyCollect], timeout: float | None) -> Iterator[LazyCollect]:
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(items)
    sleep = _FIRST_SLEEP
    while pending:
        ask_many(pending)
        finished = [x for x in pending if x.done()]
        if finished:
            sleep = _FIRST_SLEEP
            for item in finished:
                pending.remove(item)
                yield item
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise CallTimeoutError(
                f"as_completed: {len(pending)} of {len(items)} call(s) still running after "
                f"{timeout:g}s: {pending[:3]!r}{' ...' if len(pending) > 3 else ''}"
            )
        pause = sleep if deadline is None else min(sleep, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        sleep = min(sleep * 2, _MAX_SLEEP)

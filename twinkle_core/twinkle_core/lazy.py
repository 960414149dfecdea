"""`LazyCollect`: the handle every remote call returns while lazy collection is on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

_UNSET = object()
#: `LazyCollect._is_done` when `done()` asks `source.pending.done()`.
_ASK_SOURCE: Any = object()
#: Held only while a LazyCollect's own lock is made (`LazyCollect._call_lock`).
_MAKE_LOCK = threading.Lock()
#: `LazyCollect._resolve` of a subclass that collects its value itself (`_collect`): no bound
#: method stored on the object, which would be a reference cycle per call.
COLLECT_ITSELF: Any = object()


#: Timeout types accepted without a closer look (`check_timeout` looks at the others).
_SECONDS = (float, int)


def check_timeout(timeout: Any, function: str = "LazyCollect") -> None:
    """Refuse a timeout that is not None or a number of seconds >= 0 (a negative one would
    mean "no limit" to Ray and "now" to a lock); number types like numpy's floats pass."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
    ):
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"{function}(timeout=...) must be None or a number of seconds >= 0, got {timeout!r}"
        )


class LazyCollect:
    """The not-yet-collected result of one remote call.

    Calling it blocks until the result is there (at most `timeout` seconds), collects it once
    and caches the value, or the exception, for every later call. `done()` never blocks. Passed
    as an argument to another remote call, it is resolved where the value is needed.
    """

    __slots__ = (
        "__weakref__",
        "_describe",
        "_error",
        "_is_done",
        "_lock",
        "_observed",
        "_resolve",
        "_since",
        "_value",
        "_watched",
        "source",
    )

    def __init__(
        self,
        resolve: Callable[[float | None], Any],
        is_done: Callable[[], bool] | None = None,
        describe: object = "",
        source: Any = None,
    ) -> None:
        """`resolve(timeout)` collects the value; `is_done()` says, without blocking, whether
        it would return at once (omitted: `source.pending.done()`, which spares every call a
        bound-method object)."""
        #: What the call is, for `repr`: a string, or any object whose `str()` says it,
        #: formatted only when shown (calls are made far more often than shown).
        self._describe = describe
        #: What produced this value, for backends that hand results between groups without
        #: fetching them to the driver (a `twinkle_core.calls.CallSource`, or None).
        self.source = source
        self._resolve: Callable[[float | None], Any] | None = resolve
        if is_done is None:
            if getattr(source, "pending", None) is None:
                raise TypeError("LazyCollect needs is_done, or a source with a pending call")
            is_done = _ASK_SOURCE
        self._is_done: Callable[[], bool] | None = is_done
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        #: Held while one thread collects; made when first needed and dropped once the value
        #: (or the failure) is cached: with thousands of calls in flight, every object a call
        #: keeps makes the garbage collector's full collections come sooner.
        self._lock: threading.Lock | None = None
        self._observed = False
        #: The runtime's calls watched for failures nobody collects, while this is among them
        #: (`watch`), and when the call was made.
        self._watched: dict[int, LazyCollect] | None = None
        self._since = 0.0

    def watch(self, calls: dict[int, LazyCollect], since: float) -> None:
        """Join the runtime's `calls` (by `id`, in the order made), which this leaves the
        moment it resolves: a call collected is not kept there, with what it holds (on Ray,
        its results in the object store). No object per call: with thousands in flight, each
        one a call keeps is one more for the garbage collector to promote."""
        self._since = since
        self._watched = calls
        calls[id(self)] = self

    def _unwatch(self) -> None:
        calls = self._watched
        if calls is not None:
            self._watched = None
            calls.pop(id(self), None)  # not another call's: ids differ while this one lives

    @classmethod
    def of_value(cls, value: Any, describe: object = "") -> LazyCollect:
        """A LazyCollect that is already complete."""
        lazy = cls(lambda timeout: value, lambda: True, describe)
        lazy._value = value
        return lazy

    def __call__(self, timeout: float | None = None) -> Any:
        """The collected value; raises the call's failure, or `CallTimeoutError` after `timeout`
        seconds (None: no limit; 0: only if already finished)."""
        if timeout is not None and (type(timeout) not in _SECONDS or timeout < 0):
            check_timeout(timeout)
        self._observed = True
        return self._get(timeout)

    def _call_lock(self) -> threading.Lock:
        lock = self._lock
        if lock is None:
            with _MAKE_LOCK:
                lock = self._lock
                if lock is None:
                    lock = self._lock = threading.Lock()
        return lock

    def _get(self, timeout: float | None) -> Any:
        if self._value is not _UNSET:
            return self._value
        if self._error is not None:
            raise self._error
        # Another thread may be resolving this call: wait for it no longer than `timeout`.
        lock = self._call_lock()
        if not lock.acquire(False) and not lock.acquire(
            timeout=-1 if timeout is None else max(timeout, 0.0)
        ):
            from .errors import CallTimeoutError

            raise CallTimeoutError(
                f"{self!r} did not finish within {timeout:g}s (another thread is collecting it)"
            )
        try:
            if self._error is not None:
                raise self._error
            if self._value is _UNSET:
                resolve = self._resolve
                assert resolve is not None  # cleared only once a value is cached
                try:
                    if resolve is COLLECT_ITSELF:
                        self._value = self._collect(timeout)
                    else:
                        self._value = resolve(timeout)
                except TimeoutError:
                    raise  # not final: the caller may wait again
                except BaseException as exc:
                    self._error = exc
                    self._unwatch()  # after `_error`: a look that missed it sees it
                    raise
                self._resolve = None  # drop references to pending work
                self._is_done = None
                self._unwatch()  # after `_value`: a look that missed it sees it
            return self._value
        finally:
            if self._value is not _UNSET or self._error is not None:
                self._lock = None  # final: later callers take the fast path above
            lock.release()

    def _collect(self, timeout: float | None) -> Any:
        """The value, for a subclass whose `_resolve` is `COLLECT_ITSELF`."""
        raise NotImplementedError

    def settle(self) -> BaseException | None:
        """Collect a finished call without counting as the user having looked at it.

        Returns the failure, if any. Used to report failures of calls nobody resolves. A call
        some thread is collecting right now is left to that thread (which sees any failure):
        settling never waits for it, so a hook running inside that collection may call in.
        """
        lock = self._lock
        if lock is not None:
            if not lock.acquire(blocking=False):
                return None
            lock.release()  # free now; _get takes it again (another thread may win: fine)
        try:
            self._get(None)
        except BaseException as exc:
            return exc
        return None

    @property
    def observed(self) -> bool:
        """Whether user code has called this LazyCollect (and so has seen any failure)."""
        return self._observed

    def done(self) -> bool:
        """Whether calling would return (or raise) without waiting."""
        if self._value is not _UNSET or self._error is not None:
            return True
        is_done = self._is_done
        if is_done is None:
            return True
        if is_done is _ASK_SOURCE:
            return bool(self.source.pending.done())
        return bool(is_done())

    @property
    def resolved(self) -> bool:
        """Whether the value or error has already been collected and cached."""
        return self._value is not _UNSET or self._error is not None

    def __await__(self) -> Generator[Any, None, Any]:
        """`await lazy`: the value, without blocking the event loop.

        A finished call is collected at once; otherwise the wait runs in the loop's default
        thread pool, so other coroutines (other calls' awaits included) keep running.
        """
        import asyncio

        if self.done():
            return self()
        loop = asyncio.get_running_loop()
        return (yield from loop.run_in_executor(None, self).__await__())

    def __iter__(self) -> Iterator[Any]:
        return iter(self())

    def __len__(self) -> int:
        return len(self())

    # A LazyCollect is not its value: arithmetic, comparisons, numbers and indexing say how to
    # get the value instead of Python's bare "unsupported operand type(s)".
    def _not_the_value(self, what: str) -> TypeError:
        return TypeError(
            f"{what} on a LazyCollect (the result of a remote call, not collected yet): call "
            "it first to get the value, e.g. r() + 1, float(r()), r()[0]; or pass it as it is "
            "to another remote call"
        )

    def __add__(self, other: Any) -> Any:
        raise self._not_the_value("'+'")

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        raise self._not_the_value("'-'")

    __rsub__ = __sub__

    def __mul__(self, other: Any) -> Any:
        raise self._not_the_value("'*'")

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Any:
        raise self._not_the_value("'/'")

    __rtruediv__ = __truediv__

    def __floordiv__(self, other: Any) -> Any:
        raise self._not_the_value("'//'")

    __rfloordiv__ = __floordiv__

    def __mod__(self, other: Any) -> Any:
        raise self._not_the_value("'%'")

    def __pow__(self, other: Any) -> Any:
        raise self._not_the_value("'**'")

    def __matmul__(self, other: Any) -> Any:
        raise self._not_the_value("'@'")

    def __neg__(self) -> Any:
        raise self._not_the_value("unary '-'")

    def __lt__(self, other: Any) -> bool:
        raise self._not_the_value("'<'")

    def __le__(self, other: Any) -> bool:
        raise self._not_the_value("'<='")

    def __gt__(self, other: Any) -> bool:
        raise self._not_the_value("'>'")

    def __ge__(self, other: Any) -> bool:
        raise self._not_the_value("'>='")

    def __float__(self) -> float:
        raise self._not_the_value("float()")

    def __int__(self) -> int:
        raise self._not_the_value("int()")

    def __getitem__(self, item: Any) -> Any:
        raise self._not_the_value(f"indexing [{item!r}]")

    def _what(self) -> object:
        """What the call is, for `repr` (formatted only when shown)."""
        return self._describe

    def __repr__(self) -> str:
        state = "done" if self.resolved else "pending"
        described = self._what()
        what = f" {described}" if described else ""
        return f"<LazyCollect{what} {state}>"


def _pending_by_class(lazies: Iterable[LazyCollect]) -> dict[type, list[Any]]:
    """The pending calls of the unresolved `lazies`, each once, grouped by class; resolved
    calls and LazyCollects without a pending call are left out."""
    by_class: dict[type, dict[int, Any]] = {}
    for lazy in lazies:
        if lazy._value is not _UNSET or lazy._error is not None:
            continue
        pending = getattr(lazy.source, "pending", None)
        if pending is not None:
            by_class.setdefault(type(pending), {})[id(pending)] = pending
    return {kind: list(calls.values()) for kind, calls in by_class.items()}


def ask_many(lazies: Iterable[LazyCollect]) -> None:
    """Before asking `done()` of many calls: let each backend ask about its calls at once
    (`PendingCall.ask_many`, grouped by the pending call's class)."""
    for kind, calls in _pending_by_class(lazies).items():
        ask = getattr(kind, "ask_many", None)
        if ask is not None:
            ask(calls)


def fetch_many(lazies: Iterable[LazyCollect], timeout: float | None) -> None:
    """Before collecting many calls in turn: let each backend wait for its calls at once
    (`PendingCall.fetch_many`, grouped by the pending call's class), within `timeout`
    seconds in all."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for kind, calls in _pending_by_class(lazies).items():
        fetch = getattr(kind, "fetch_many", None)
        if fetch is not None:
            fetch(calls, None if deadline is None else max(0.0, deadline - time.monotonic()))

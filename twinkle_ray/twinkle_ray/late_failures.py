"""Ranks that fail after their call already raised: added as notes to the raised exception.

A call raises as soon as one worker failed (fail fast), grouping the ranks that fail within a
short grace (`pending.FAILURE_GRACE_SECONDS`); a rank still running then may fail later, and
its failure would go unseen. `LATE_FAILURES` watches those ranks and adds each late failure as
a note to the exception the user already holds. It needs Ray's completion callbacks
(`HAS_ON_READY`); without them late failures are not watched.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import ray

from twinkle_core.plugin import WorkerFailure, add_note

from .relay import NOT_REPORTED, RelayFailed, StillRunning

log = logging.getLogger("twinkle")

#: Whether this Ray can call back when an object exists without fetching it.
HAS_ON_READY = hasattr(ray.ObjectRef, "_on_ready")


class _NamesFailures(Protocol):
    def failure(self, rank: int, exc: BaseException) -> WorkerFailure: ...


class WatchedCall(Protocol):
    """What the watcher needs of a call (`pending.RayPendingCall`): one result ref per worker,
    the workers' ranks, and its group, which turns an error into a `WorkerFailure`."""

    @property
    def value_refs(self) -> Sequence[Any]: ...

    @property
    def ranks(self) -> Sequence[int]: ...

    @property
    def workers(self) -> _NamesFailures: ...

    def relay_slot(self, i: int, exc: BaseException) -> Any: ...

    def lost_in_relay(self, i: int, exc: BaseException) -> WorkerFailure | None: ...


class LateFailures:
    """Adds a note to an exception already raised when another rank of its call fails later.

    Completion callbacks only queue the finished worker (they run on Ray's own thread, where
    fetching is not allowed); one daemon thread, started on first use, looks at the result.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def watch(
        self,
        pending: WatchedCall,
        indices: list[int],
        first: WorkerFailure,
        late: dict[int, StillRunning] | None = None,
    ) -> None:
        """Watch the workers at `indices` of `pending` (their result refs, or what their
        relay reported of them where `late` says: `StillRunning`)."""
        if not HAS_ON_READY:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="twinkle-late-failures", daemon=True
                )
                self._thread.start()
        raised_at = time.monotonic()
        for i in indices:
            self._watch(pending, i, first, raised_at, late.get(i) if late else None)

    def _watch(
        self,
        pending: WatchedCall,
        i: int,
        first: WorkerFailure,
        raised_at: float,
        still: StillRunning | None,
    ) -> None:
        """Queue worker `i` when its ref (the call's, or `still.ref`) is ready."""
        item = (pending, i, first, raised_at, still)
        ref = pending.value_refs[i] if still is None else still.ref
        ref._on_ready(lambda exc, item=item: self._queue.put(item))

    def _run(self) -> None:
        while True:
            pending, i, first, raised_at, still = self._queue.get()
            try:
                try:
                    ray.get(pending.value_refs[i] if still is None else still.ref, timeout=0)
                except Exception as exc:
                    slot = pending.relay_slot(i, exc) if still is None else still.slot(exc)
                    if type(slot) is StillRunning:  # its relay stopped waiting: watch on
                        self._watch(pending, i, first, raised_at, slot)
                        continue
                    if type(slot) is RelayFailed:
                        raise slot.raised() from None
                    if slot is not NOT_REPORTED:  # it succeeded; another worker failed
                        continue
                    raise
            except Exception as exc:
                try:
                    # A relay killed or dead after this error was raised ends the worker's
                    # ref too: the worker may be alive (`CallLostError`), say so if it is.
                    late = pending.lost_in_relay(i, exc) or pending.workers.failure(
                        pending.ranks[i], exc
                    )
                    node = f" on node {late.node}" if late.node else ""
                    add_note(
                        first.exception,
                        f"twinkle: rank {late.rank}{node} also failed, "
                        f"{time.monotonic() - raised_at:.2f}s after this error was raised: "
                        f"{type(late.exception).__name__}: {late.exception}",
                    )
                except Exception as note_error:  # never let the watcher die
                    log.debug("twinkle: could not note a late failure: %s", note_error)


#: This driver's watcher (one thread for every call).
LATE_FAILURES = LateFailures()

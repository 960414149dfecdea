"""This process's exchanges in start order, and the run's broken state.

Exchanges (`exchange.py`) must be finished in the order they were started, alike on every
process, so that their second steps line up. The queue numbers the calls, holds the exchanges
started and not finished yet, and finishes them: before a new call runs (`drain`), when a call
is collected (`wait_for`, bounded, naming where the other processes are on a timeout), without
waiting (`try_finish`, for `done()`), from the watchdog (`progress`) and at shutdown
(`finish_open`). The first exchange that fails marks the run broken: later calls fail at once,
on every process with the same error. Its lock orders it all: one call at a time in this process
(re-entrant: a worker's method may call another object of the same process).

It is what each exchange is driven by (`exchange.ExchangeDriver`), so it also hands the
exchanges what they share: the structures of sum/mean results every process knows, and the
transports' groups.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from twinkle_core import CallTimeoutError, WorkerDiedError
from twinkle_core.plugin import WorkerFailure

from .calls import LocalPendingCall
from .channel import ChannelError
from .peer_reports import STACK_WAIT_S, shutdown_notes, stacks_text

if TYPE_CHECKING:
    from .exchange import CallInfo, Exchange
    from .process_groups import ProcessGroups
    from .session import Session
    from .watchdog import Watchdog


class ExchangeQueue:
    """The exchanges of one run in this process (one per `LocalBackend`)."""

    def __init__(self, session: Session, watchdog: Watchdog, groups: ProcessGroups) -> None:
        self.session = session
        self.watchdog = watchdog
        self.groups = groups
        #: One call at a time in this process: its workers' run and the start of its exchange
        #: (re-entrant: a worker's method may call another object of the same process).
        self.lock = threading.RLock()
        #: Exchanges started and not finished yet, in start order (finished in that order).
        self._queue: deque[Exchange] = deque()
        #: The number of the last call (each process numbers its calls alike).
        self.sequence = 0
        #: The first failed exchange's error: the run is broken (None while it is not).
        self.broken: BaseException | None = None
        self._broken_at = ""
        self._broken_detail = ""
        #: Structures of sum/mean results every process knows, by `numeric.spec_key`.
        self.spec_cache: dict[int, Any] = {}

    # ----------------------------------------------------------------- what exchanges share
    def transport_group(self, torch_backend: str) -> Any:
        """The group a result held for a transport of `torch_backend` is broadcast over."""
        return self.groups.transport_group(torch_backend)

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    # ----------------------------------------------------------------- finishing in order
    def enqueue(self, exchange: Exchange) -> None:
        """Remember a started exchange (lock held); a lone finished one is not kept."""
        if exchange.outcome is None:
            self._queue.append(exchange)

    def drain(self, timeout: float | None) -> None:
        """Finish every started exchange, in order (lock held), before a new call runs.

        A call runs only once the previous calls' exchanges are complete everywhere: a method
        that runs collectives of its own must never wait for a process that is still in an
        earlier call's second step. `timeout` bounds the wait for the last one (None: the
        control group's own timeout); a call that cannot be exchanged in order breaks the run.
        """
        queue = self._queue
        if not queue:
            return
        last = queue[-1]
        work = last.work
        if timeout is not None and work is not None and not work.is_completed():
            try:
                work.wait(datetime.timedelta(seconds=max(timeout, 0.001)))
            except Exception:
                pass
            if not work.is_completed():
                stacks = self.watchdog.request_stacks(STACK_WAIT_S)
                if not work.is_completed():
                    self.mark_broken(
                        CallTimeoutError(
                            f"the exchange of {last.info.describe()} did not finish within "
                            f"{timeout:g}s{self._stacks_text(stacks)}"
                        ),
                        last.info.label,
                    )
                    return
        while queue:
            queue[0].finish()
            queue.popleft()

    def wait_for(self, exchange: Exchange, timeout: float | None) -> None:
        """Wait until `exchange` is finished: at most `timeout` seconds for the other processes
        to reach it (`CallTimeoutError` naming where they are), then finish it in order."""
        work = exchange.work
        if work is not None and not work.is_completed():
            try:
                if timeout is None:
                    work.wait()  # the control group's timeout ends a lost process's wait
                else:
                    work.wait(datetime.timedelta(seconds=max(timeout, 0.001)))
            except Exception:
                pass  # a failed collective is reported by finish()
            if timeout is not None and not work.is_completed():
                error = self.timeout_error(exchange, timeout)
                if not work.is_completed():  # (the others may arrive while asked where)
                    raise error
        with self.lock:
            if exchange.outcome is not None:
                return
            while self._queue:
                head = self._queue.popleft()
                head.finish()
                if head is exchange:
                    return
            exchange.finish()

    def timeout_error(self, exchange: Exchange, timeout: float) -> CallTimeoutError:
        """The other processes did not reach `exchange` in time: where are they?"""
        exchange.timed_out = True
        stacks = self.watchdog.request_stacks(STACK_WAIT_S)
        return CallTimeoutError(
            f"did not finish within {timeout:g}s: not every torchrun process reached "
            f"{exchange.info.describe()}{self._stacks_text(stacks)}"
        )

    def _stacks_text(self, stacks: dict[int, str]) -> str:
        return stacks_text(stacks, self.session.channel.world_size, self.session.env.rank)

    def try_finish(self, exchange: Exchange) -> bool:
        """Finish `exchange` (and those before it) if that needs no waiting; for `done()`."""
        if exchange.outcome is not None:
            return True
        if not exchange.arrived() or not self.lock.acquire(blocking=False):
            return False
        try:
            queue = self._queue
            session = self.session
            while queue and exchange.outcome is None:
                head = queue[0]
                if not head.arrived() or (session.channel.distributed and head.needs_second_step()):
                    return False
                head.finish()
                queue.popleft()
            return exchange.outcome is not None
        finally:
            self.lock.release()

    def progress(self) -> bool:
        """Finish the exchanges every process has reached, in order (for the watchdog, which
        never waits for the lock). True while exchanges are left."""
        queue = self._queue
        if not queue:
            return False
        if queue[0].arrived() and self.lock.acquire(blocking=False):
            try:
                while queue and queue[0].arrived():
                    queue[0].finish()
                    queue.popleft()
            finally:
                self.lock.release()
        return bool(queue)

    def finish_open(self, bound: float) -> None:
        """At shutdown: take part in the exchanges still open (another process may be
        collecting them), then forget them.

        Bounded: an exchange another process never reached is waited for at most `bound`
        seconds, and not at all when a wait for it already timed out.
        """
        if self.session.channel.distributed and self.broken is None:
            with self.lock:
                queue = self._queue
                while queue and self.broken is None:
                    head = queue[0]
                    if not head.arrived():
                        if head.timed_out:
                            break
                        deadline = time.monotonic() + bound
                        while not head.arrived() and time.monotonic() < deadline:
                            time.sleep(0.01)
                        if not head.arrived():
                            break
                    head.finish()
                    queue.popleft()
        self._queue.clear()

    # ----------------------------------------------------------------- broken runs
    def mark_broken(self, exc: BaseException, label: str) -> None:
        """Remember the first failed exchange: later calls fail at once instead of waiting."""
        if self.broken is not None:
            return
        detail = ""
        if isinstance(exc, ChannelError):
            if exc.timed_out:
                detail = self._stacks_text(self.watchdog.request_stacks(STACK_WAIT_S))
            else:
                session = self.session
                detail = shutdown_notes(session.channel, session.env.rank, self.sequence)
        self.broken = exc
        self._broken_at = label
        self._broken_detail = detail

    def broken_message(self) -> str:
        return (
            f"a torchrun process died or stopped answering during {self._broken_at}; twinkle's "
            "exchanges cannot continue (see that process's own output for the cause)"
            f"{self._broken_detail}"
        )

    def lost_outcome(
        self, info: CallInfo, ranks: list[int], exc: BaseException
    ) -> LocalPendingCall:
        """A collective broke: every surviving process reports the same WorkerDiedError."""
        self.mark_broken(exc, info.label)
        error = WorkerDiedError(self.broken_message())
        detail = f"{type(exc).__name__}: {exc}"
        session = self.session
        me = session.env.rank
        others = sorted({r for r in ranks if r != me})
        failures = [WorkerFailure(r, error, session.node_of(r), detail) for r in others or [me]]
        return LocalPendingCall(None, failures, label=info.label)

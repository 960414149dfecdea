"""Running user code as a worker: its context, its own random generators, its failures.

Backends that host a worker in a process it shares with the driver or with other workers
(in-process, torchrun) swap the worker's context and random generators in around every call,
so each worker draws the same numbers it would draw in a process of its own. Every backend
turns an exception raised by user code into the same `WorkerFailure` record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import trace as _trace
from .context import WorkerContext, get_worker_context, worker_context
from .errors import WorkerExitError
from .failures import WorkerFailure, format_remote_traceback
from .rng_switch import RngParty, RngSwitch, rng_switch
from .seeding import get_rng_state, seed_everything, set_rng_state


class WorkerState:
    """One worker's identity and random-generator state, for `activate()` around its calls.

    The generators are moved by the process's `RngSwitch` (`rng_switch.py`), which sets and
    saves only what differs; a worker whose state holds a generator the switch does not know
    (a plugin saving it only through `twinkle_get_rng_state`) has every state copied instead.
    """

    __slots__ = ("_party", "_rng_state", "_switch", "context")

    def __init__(self, context: WorkerContext, rng_state: dict[str, Any] | None = None) -> None:
        self.context = context
        self._rng_state = rng_state
        #: The switch and the worker's party in it, once a call ran (None: not yet, or the
        #: state holds a generator the switch does not move).
        self._switch: RngSwitch | None = None
        self._party: RngParty | None = None

    @property
    def rng_state(self) -> dict[str, Any] | None:
        """The worker's generators as a `get_rng_state()` dict (None: not recorded yet)."""
        if self._party is not None and self._switch is not None:
            return self._switch.state_dict(self._party)
        return self._rng_state

    def party(self) -> tuple[RngSwitch, RngParty] | None:
        """The process's switch and this worker's party in it; None when the switch cannot
        move every generator of the worker's state (then `activate` copies them all)."""
        switch = rng_switch()
        if self._switch is switch:
            return (switch, self._party) if self._party is not None else None
        state = self.rng_state  # (from the previous switch's party, if any)
        self._switch, self._party = switch, None
        if switch.supported(state):
            name = f"{self.context.group_name} rank {self.context.rank}"
            self._party = switch.party(name, state)
            return switch, self._party
        self._rng_state = state
        return None

    @contextlib.contextmanager
    def activate(self, *, keep: bool = False) -> Iterator[WorkerContext]:
        """Run the block as this worker; the caller's generators are back afterwards.

        `keep=True` leaves this worker's generators in place after the block (where the
        switch moves them all), for a process that runs nothing but its workers' calls (a
        Ray actor hosting colocated roles): the same worker's next call then switches
        nothing, and a call of the process's own first worker puts the process's generators
        back first (`restore_process_generators`). A process that runs other code between
        calls (a driver) must not keep."""
        found = self.party()
        if found is not None:
            switch, party = found
            previous = switch.enter(party)
            try:
                with worker_context(self.context) as ctx:
                    yield ctx
            finally:
                if not keep:
                    switch.leave(party, previous)
            return
        outer = get_rng_state()
        if self._rng_state is not None:
            set_rng_state(self._rng_state)
        try:
            with worker_context(self.context) as ctx:
                yield ctx
        finally:
            self._rng_state = get_rng_state()
            set_rng_state(outer)

    @staticmethod
    def restore_process_generators() -> None:
        """Put the process's own generators back in place, if a worker kept its own there
        (`activate(keep=True)`); costs an attribute check when none did."""
        switch = rng_switch()
        if switch.installed is not switch.host:
            switch.enter(switch.host)

    @classmethod
    def construct(
        cls,
        factory: Any,
        args: tuple,
        kwargs: dict,
        context: WorkerContext,
        *,
        seed: int,
        full_determinism: bool = False,
    ) -> tuple[Any, WorkerState]:
        """Build `factory(*args, **kwargs)` as a fresh worker seeded with the run's seed.

        Returns the instance and the worker's state after construction; the caller's own
        generators are left as they were. Exceptions from the constructor propagate.
        """
        outer = get_rng_state()
        rec = _trace.RECORDER
        start = _trace.now_ns() if rec is not None else 0
        try:
            seed_everything(seed, full_determinism)
            with worker_context(context):
                instance = factory(*args, **kwargs)
            return instance, cls(context, get_rng_state())
        finally:
            set_rng_state(outer)
            if rec is not None:  # the construction is an execution on the worker too
                name = f"{getattr(factory, '__name__', type(factory).__name__)}.__init__"
                group, node = context.group_name, context.node_id
                rec.worker_finished(name, group, context.rank, node, start, rec.current_call())


def worker_failure(rank: int, exc: BaseException, node: str | None) -> WorkerFailure:
    """The record of `exc` raised by user code on worker `rank`, with its traceback text."""
    return WorkerFailure(rank, exc, node, format_remote_traceback(exc))


def exit_error(exc: BaseException, method: str, rank: int) -> WorkerExitError:
    """The error reported for `SystemExit`/`KeyboardInterrupt` raised by user code."""
    what = f"{type(exc).__name__}({', '.join(repr(a) for a in exc.args)})"
    error = WorkerExitError(
        f"{method} raised {what} on worker rank {rank}: a remote method cannot end its "
        "worker process; raise an exception to fail the call, or return to end it"
    )
    error.__cause__ = exc
    return error


def run_method(
    instance: Any, method: str, args: tuple, kwargs: dict, *, rank: int, node: str | None
) -> tuple[bool, Any]:
    """`(True, value)` of `instance.method(*args, **kwargs)`, or `(False, WorkerFailure)`.

    `SystemExit` from user code is that worker's failure (a `WorkerExitError`), not the end
    of the process; `KeyboardInterrupt` is left alone here (in a process shared with the
    driver it is the user's own Ctrl-C).

    While a trace is recorded (`twinkle_core.trace`), the execution is recorded as one event.
    """
    rec = _trace.RECORDER
    if rec is None:
        return _run_plain(instance, method, args, kwargs, rank, node)
    return _run_traced(rec, instance, method, args, kwargs, rank=rank, node=node)


def _run_plain(
    instance: Any, method: str, args: tuple, kwargs: dict, rank: int, node: str | None
) -> tuple[bool, Any]:
    try:
        return True, getattr(instance, method)(*args, **kwargs)
    except Exception as exc:
        return False, worker_failure(rank, exc, node)
    except SystemExit as exc:
        return False, worker_failure(rank, exit_error(exc, method, rank), node)


def _run_traced(
    rec: _trace.Recorder,
    instance: Any,
    method: str,
    args: tuple,
    kwargs: dict,
    *,
    rank: int,
    node: str | None,
) -> tuple[bool, Any]:
    """`run_method` with the execution recorded (in the group and rank of the worker)."""
    ctx = get_worker_context()
    group = ctx.group_name if ctx is not None else "?"
    call = rec.current_call()
    start = _trace.now_ns()
    try:
        return _run_plain(instance, method, args, kwargs, rank, node)
    finally:
        name = f"{type(instance).__name__}.{method}"
        rec.worker_finished(name, group, rank, node, start, call)

"""The workers of one remote class under torchrun: at most one instance per process.

A group of k workers lives on global ranks 0..k-1; worker rank r is the instance in process r.
Every process runs the same driver script, so every process makes the same remote calls in the
same order. For each call a process runs the work aimed at its own rank, then starts the
exchange of the outcomes over twinkle's control group (see `exchange.py`: one collective when
all went well); collecting the call waits for it, so each process ends with the same value.
Calls made inside a worker (one remote object using another) run only on this process.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any, Protocol

from twinkle_core import (
    CallTimeoutError,
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    NotInitializedError,
    get_worker_context,
)
from twinkle_core.plugin import (
    OBJECT_STORE,
    Collector,
    PendingCall,
    PreparedCall,
    WorkerCall,
    WorkerFailure,
    WorkerGroup,
    WorkerPlacement,
    WorkerState,
    builtin_hand_off,
    call_mesh,
    copy_arguments,
    exit_error,
    hand_off_value,
    method_options,
    note_fallback,
    representatives,
    run_method,
    user_call_site,
    worker_context,
    worker_failure,
)

from .calls import LocalPendingCall
from .exchange import KIND_GATHER, KIND_REDUCE, CallInfo, Exchange, ExchangedCall
from .fingerprint import arguments_print
from .shared_arguments import SharedArguments
from .transports import decide

if TYPE_CHECKING:
    from .exchange_queue import ExchangeQueue
    from .session import Session
    from .watchdog import Watchdog

REDUCE_OPS = ("sum", "mean")


class Host(Protocol):
    """What a worker group uses of the run that made it (the `LocalBackend`)."""

    #: This process in the run (rank, node, channel, `isolate`, whether it was shut down).
    session: Session
    #: Where the group's calls are numbered, exchanged in order, and found broken.
    exchanges: ExchangeQueue
    #: Bounds the methods' run by their timeouts and tells where they are.
    watchdog: Watchdog


class LocalWorkerGroup(WorkerGroup):
    """One remote class instance: this process's worker (if it holds one) and the exchange."""

    def __init__(
        self,
        host: Host,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        cls: type,
        size: int,
        placements: list[WorkerPlacement],
        instance: Any,
        state: WorkerState | None,
    ) -> None:
        super().__init__(group, device_mesh, cls.__name__, size, placements)
        self.host = host
        self.cls = cls
        self.instance = instance
        #: This process's worker (its context and random generators); None when idle.
        self.state = state
        self._timeouts: dict[str, float | None] = {}
        self._transports: dict[str, tuple[str, bool]] = {}
        self._reps: dict[tuple, tuple[DeviceMesh, frozenset[int]]] = {}

    def _representatives(self, count: int, mesh: DeviceMesh) -> frozenset[int]:
        """The calls a sum/mean counts (one per data shard), memoized per mesh."""
        key = (count, id(mesh))
        known = self._reps.get(key)
        if known is not None and known[0] is mesh:
            return known[1]
        reps = frozenset(representatives(list(range(count)), mesh))
        if len(self._reps) > 64:  # e.g. execute='first' builds a mesh per call
            self._reps.clear()
        self._reps[key] = (mesh, reps)  # the mesh kept alive keeps its id() unique
        return reps

    # ----------------------------------------------------------------- running
    @property
    def holds_worker(self) -> bool:
        return self.state is not None

    def method_timeout(self, method: str) -> float | None:
        """The `timeout=` of `@remote_function` on `method` (None when it has none)."""
        if method not in self._timeouts:
            timeout = getattr(method_options(self.cls, method), "timeout", None)
            ok = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
            self._timeouts[method] = float(timeout) if ok and timeout > 0 else None
        return self._timeouts[method]

    def method_transport(self, method: str) -> tuple[str, bool]:
        """The `transport=` ('auto' when none) and `writable_args=` of `@remote_function` on
        `method`."""
        known = self._transports.get(method)
        if known is None:
            spec = method_options(self.cls, method)
            name = getattr(spec, "transport", None)
            known = (
                name if isinstance(name, str) else "auto",
                getattr(spec, "writable_args", False) is True,
            )
            self._transports[method] = known
        return known

    def resolve_argument(self, value: Any, call: PreparedCall) -> Any:
        """A LazyCollect handed to `call` on this group: its value, and when a transport
        delivered its tensors (fresh buffers, or the holder's copy) and nobody collected it
        yet, those very tensors: the call's argument copy (`isolate`) keeps them as they are
        unless the method declares `writable_args=True` (they are kept on the call's
        `backend_data`, so a call that never reaches `submit` leaves nothing behind). A later
        collect of the LazyCollect gets a copy."""
        source = getattr(value, "source", None)
        pending = getattr(source, "pending", None)
        if value.resolved or not isinstance(pending, ExchangedCall):
            return value()
        producer = source.workers
        try:
            timeout = producer.method_timeout(source.method.rsplit(".", 1)[-1])
            outcome = pending._outcome(timeout)
        except Exception:
            return value()  # (a timeout or a lost process: raised as collecting raises it)
        if not outcome.succeeded():
            return value()  # (raises as always)
        by_reference = self._by_reference(source, outcome, call)
        if by_reference is not None:
            return by_reference
        if not outcome.private:
            return value()  # (copies as always)
        try:
            got = outcome.hand_off(source.collector, source.device_mesh)
        except Exception:
            return value()  # the collector's error, raised as collecting raises it
        shared = call.backend_data
        if shared is None:
            shared = call.backend_data = SharedArguments()
        shared.share(got)
        return got

    def _by_reference(self, source: Any, outcome: LocalPendingCall, call: PreparedCall) -> Any:
        """The hand-off of a result of another object on this group, built from the results
        with this process's own one as the very object its worker returned (`twinkle_core.
        plugin.hand_off_value`); None when it does not apply (another group, a collector or
        dispatcher of the user's, a partial call)."""
        producer = source.workers
        mine = source.pending.exchange.mine
        results = outcome.results
        if (
            not isinstance(producer, LocalWorkerGroup)
            or producer.host is not self.host
            or producer.group.name != self.group.name
            or producer.size != self.size
            or mine is None
            or not mine[1]
            or len(results) != self.size
            or not builtin_hand_off(source.collector, call.dispatcher)
        ):
            return None
        results = list(results)
        results[mine[0]] = mine[2]
        try:
            got = hand_off_value(source.collector, source.device_mesh, results)
        except Exception:
            return None  # the collector's error, raised as collecting raises it
        shared = call.backend_data
        if shared is None:
            shared = call.backend_data = SharedArguments()
        if outcome.private:  # the others' tensors a transport delivered: no copy either
            shared.share(results)
            outcome.handed = True
        shared.keep(mine[2])
        return got

    def _run(self, method: str, call: WorkerCall, info: CallInfo) -> tuple[bool, Any]:
        """Run `call` on this process's worker, as that worker, bounded by the method's
        timeout: (True, value), or (False, WorkerFailure)."""
        ok, value, restore = self._run_keeping_generators(method, call, info, None)
        if restore is not None:
            restore()
        return ok, value

    def _run_keeping_generators(
        self, method: str, call: WorkerCall, info: CallInfo, shared: SharedArguments | None
    ) -> tuple:
        """`_run`, leaving the worker's generators in place: (ok, value, restore), where
        `restore()` (when not None) puts the caller's back. The caller may start the exchange
        first, so this bookkeeping overlaps the network instead of delaying it. `shared`: the
        tensors a hand-off delivered to this call, given to it without a copy."""
        assert self.state is not None, "only a process holding a worker runs calls"
        host = self.host
        args, kwargs = call.args, call.kwargs
        if host.session.isolate and not _immutable(args, kwargs):
            # Tensors a hand-off delivered are this call's already (unless it writes in place).
            keep = shared is not None and not self.method_transport(method)[1]
            memo = shared.memo() if keep and shared is not None else {}
            args, kwargs = copy_arguments(args, kwargs, memo, f"{self.class_name}.{method}")
        timeout = self.method_timeout(method)
        found = self.state.party()  # the process's generator switch and this worker in it
        if found is None:
            with self.state.activate() as ctx:
                return (*self._bounded(method, call, info, timeout, args, kwargs, ctx), None)
        rng, party = found
        previous = rng.enter(party)
        try:
            with worker_context(self.state.context) as ctx:
                ok, value = self._bounded(method, call, info, timeout, args, kwargs, ctx)
        except BaseException:
            rng.leave(party, previous)
            raise
        return ok, value, lambda: rng.leave(party, previous)

    def _bounded(self, method, call, info, timeout, args, kwargs, ctx) -> tuple[bool, Any]:
        host = self.host
        node = host.session.node

        def body() -> tuple[bool, Any]:
            try:
                return run_method(self.instance, method, args, kwargs, rank=call.rank, node=node)
            except KeyboardInterrupt as exc:
                # Raised by the method on this rank only, it would skip this process's part
                # of the exchange and leave the processes one call apart for good: it is this
                # worker's failure instead (as on Ray), and every process raises it in step.
                # (A Ctrl-C reaches every process: each fails the call the same way.)
                return False, worker_failure(call.rank, exit_error(exc, method, call.rank), node)

        result, took, stack = host.watchdog.run(info, timeout, body)
        if timeout is not None and (result is None or took > timeout):
            where = f"; it was at:\n{stack.rstrip()}" if stack else ""
            error = CallTimeoutError(
                f"the method ran {took:.3g}s on rank {call.rank} (node {node}), longer than its "
                f"timeout={timeout:g}s, and was stopped{where}"
            )
            return False, WorkerFailure(call.rank, error, node, stack)
        return result

    def submit(self, prepared: PreparedCall) -> PendingCall:
        method, calls, collector = prepared.method, prepared.calls, prepared.collector
        device_mesh = prepared.device_mesh
        session = self.host.session
        if session.closed:
            raise NotInitializedError(
                f"{self.class_name}.{method}: this object belongs to run "
                f"{session.run_name!r}, which was shut down; its workers are gone. Create "
                "the object again after initialize()"
            )
        if get_worker_context() is not None:
            return self._submit_nested(method, calls)
        mesh = device_mesh if device_mesh is not None else call_mesh(list(range(len(calls))), self)
        return self._submit_collective(method, calls, collector, mesh, prepared.backend_data)

    def _submit_nested(self, method: str, calls: list[WorkerCall]) -> LocalPendingCall:
        """A call made inside a worker: only this process takes part, so no collective."""
        me = self.host.session.env.rank
        elsewhere = [c.rank for c in calls if c.rank != me or not self.holds_worker]
        if elsewhere:
            caller = get_worker_context()
            raise ConfigurationError(
                f"mode 'local': group {caller.group_name!r} rank {caller.rank} (process {me}) "
                f"called {self.class_name}.{method} on rank(s) {elsewhere} of group "
                f"{self.group.name!r}, which live in other processes; inside a worker only "
                f"workers of the same process can be called. Use execute='peer' with groups of "
                "the same size, or make the call from the driver script"
            )
        label = f"{self.class_name}.{method}"
        info = CallInfo(
            0, KIND_GATHER, label, "(inside a worker)", len(calls), threading.current_thread().name
        )
        results, failures = [], []
        for call in calls:
            ok, value = self._run(method, call, info)
            if ok:
                results.append(copy.deepcopy(value) if self.host.session.isolate else value)
            else:
                failures.append(value)
        return LocalPendingCall(results, failures, label=label)

    # ----------------------------------------------------------------- exchange
    def _submit_collective(
        self,
        method: str,
        calls: list[WorkerCall],
        collector: Collector | None,
        mesh: DeviceMesh,
        shared: SharedArguments | None,
    ) -> PendingCall:
        host = self.host
        session = host.session
        exchanges = host.exchanges
        label = f"{self.class_name}.{method}"
        op = getattr(collector, "reduce_op", None)
        kind = KIND_REDUCE if op in REDUCE_OPS else KIND_GATHER
        site = str(user_call_site())
        thread = threading.current_thread().name
        ranks = [c.rank for c in calls]
        with exchanges.lock:  # one call at a time in this process, exchanged in this order
            exchanges.drain(self.method_timeout(method))
            if exchanges.broken is not None:  # an earlier exchange failed: neither run nor wait
                return exchanges.lost_outcome(
                    CallInfo(0, kind, label, site, len(calls), thread), ranks, exchanges.broken
                )
            arguments = arguments_print([(c.args, c.kwargs) for c in calls])
            info = CallInfo(
                exchanges.next_sequence(), kind, label, site, len(calls), thread, arguments
            )
            me = session.env.rank
            mine, restore = None, None
            try:
                if self.holds_worker:
                    for index, call in enumerate(calls):
                        if call.rank == me:
                            ok, value, restore = self._run_keeping_generators(
                                method, call, info, shared
                            )
                            mine = (index, ok, value)
                reps = self._representatives(len(calls), mesh) if kind == KIND_REDUCE else _NONE
                transport = self.method_transport(method)[0]
                held, skip, partial = None, False, False
                if transport != OBJECT_STORE and session.channel.distributed:
                    # Only the results the collector uses travel; large tensors by transport.
                    if kind == KIND_REDUCE:
                        used = reps
                    elif collector is None:
                        used = frozenset(range(len(calls)))
                    else:
                        used = frozenset(collector.used_results(mesh, len(calls)))
                    partial = len(used) < len(calls)
                    if mine is not None and mine[1]:
                        if mine[0] not in used:
                            skip = True
                        else:
                            held, why = decide(transport, mine[2], label)
                            if why is not None:
                                note_fallback(label, why)
                exchange = Exchange(
                    exchanges,
                    info,
                    ranks,
                    mine,
                    reps=reps,
                    op=op,
                    mesh=mesh,
                    held=held,
                    skip=skip,
                    partial=partial,
                )
                exchange.start()
                exchanges.enqueue(exchange)
            finally:
                if restore is not None:  # the driver's generators back, while gloo works
                    restore()
        return ExchangedCall(exchange)


_ATOMS = (int, float, complex, str, bytes, bool, type(None))
_NONE: frozenset[int] = frozenset()


def _immutable(args: tuple, kwargs: dict) -> bool:
    """Whether the arguments are plain atoms (numbers, strings, None): nothing to copy."""
    return all(type(a) in _ATOMS for a in args) and all(type(v) in _ATOMS for v in kwargs.values())

"""The workers of one remote class under torchrun: at most one instance per process.

A group of k workers lives on global ranks 0..k-1; worker rank r is the instance in process r.
Every process runs the same driver script, so every process makes the same remote calls in the
same order. For each call a process runs the work aimed at its own rank, then the outcomes are
exchanged over twinkle's control group so each process ends with the same collected value.
Calls made inside a worker (one remote object using another) run only on this process.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    NotInitializedError,
    WorkerDiedError,
    get_worker_context,
)
from twinkle_core.plugin import (
    Collector,
    WorkerCall,
    WorkerFailure,
    WorkerGroup,
    WorkerPlacement,
    WorkerState,
    call_mesh,
    representatives,
    run_method,
)

from . import numeric
from .calls import LocalPendingCall, decode, encode
from .channel import ChannelError

if TYPE_CHECKING:
    from .backend import LocalBackend

REDUCE_OPS = ("sum", "mean")


class LocalWorkerGroup(WorkerGroup):
    """One remote class instance: this process's worker (if it holds one) and the exchange."""

    def __init__(
        self,
        backend: LocalBackend,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        cls: type,
        size: int,
        placements: list[WorkerPlacement],
        instance: Any,
        state: WorkerState | None,
    ) -> None:
        super().__init__(group, device_mesh, cls.__name__, size, placements)
        self.backend = backend
        self.cls = cls
        self.instance = instance
        #: This process's worker (its context and random generators); None when idle.
        self.state = state

    # ----------------------------------------------------------------- running
    @property
    def holds_worker(self) -> bool:
        return self.state is not None

    def _run(self, method: str, call: WorkerCall) -> tuple[bool, Any]:
        assert self.state is not None, "only a process holding a worker runs calls"
        args, kwargs = call.args, call.kwargs
        if self.backend.isolate:
            args, kwargs = copy.deepcopy((args, kwargs))
        with self.state.activate():
            return run_method(
                self.instance, method, args, kwargs, rank=call.rank, node=self.backend.node
            )

    def submit(
        self,
        method: str,
        calls: list[WorkerCall],
        *,
        collector: Collector | None = None,
        device_mesh: DeviceMesh | None = None,
    ) -> LocalPendingCall:
        if self.backend.closed:
            raise NotInitializedError(
                f"{self.class_name}.{method}: this object belongs to a mode 'local' run that was "
                "shut down; its workers and process groups are gone. Create it again after "
                "initialize()"
            )
        if get_worker_context() is not None:
            return self._submit_nested(method, calls)
        mesh = device_mesh if device_mesh is not None else call_mesh(list(range(len(calls))), self)
        return self._submit_collective(method, calls, collector, mesh)

    def _submit_nested(self, method: str, calls: list[WorkerCall]) -> LocalPendingCall:
        """A call made inside a worker: only this process takes part, so no collective."""
        me = self.backend.env.rank
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
        results, failures = [], []
        for call in calls:
            ok, value = self._run(method, call)
            if ok:
                results.append(copy.deepcopy(value) if self.backend.isolate else value)
            else:
                failures.append(value)
        return LocalPendingCall(results, failures, label=f"{self.class_name}.{method}")

    # ----------------------------------------------------------------- exchange
    def _submit_collective(
        self,
        method: str,
        calls: list[WorkerCall],
        collector: Collector | None,
        mesh: DeviceMesh,
    ) -> LocalPendingCall:
        label = f"{self.class_name}.{method}"
        backend = self.backend
        if backend.broken is not None:  # an earlier exchange failed: neither run nor wait
            return self._lost(label, calls, backend.broken)
        me = backend.env.rank
        mine = {
            i: self._run(method, call)
            for i, call in enumerate(calls)
            if call.rank == me and self.holds_worker
        }
        op = getattr(collector, "reduce_op", None)
        try:
            if op in REDUCE_OPS:
                return self._exchange_reduce(label, calls, mine, op, mesh)
            return self._exchange_gather(label, calls, mine)
        except ChannelError as exc:  # a peer died or stopped answering within the timeout
            return self._lost(label, calls, exc)

    def _exchange_gather(
        self, label: str, calls: list[WorkerCall], mine: dict[int, tuple[bool, Any]]
    ) -> LocalPendingCall:
        backend = self.backend
        results: list[Any] = [None] * len(calls)
        failures: list[WorkerFailure] = []
        if not backend.channel.distributed:
            for i, (ok, value) in sorted(mine.items()):
                if ok:
                    results[i] = copy.deepcopy(value) if backend.isolate else value
                else:
                    failures.append(value)
            return LocalPendingCall(results, failures, label=label)
        entries = {
            i: encode(ok, value, calls[i].rank, backend.node, label)
            for i, (ok, value) in mine.items()
        }
        for index, blob in self._gather(label, calls, entries):
            ok, value = decode(blob, calls[index].rank, backend.node_of(calls[index].rank), label)
            if index in mine and (not mine[index][0] or not backend.isolate):
                # This process's own failure keeps its traceback; its own result skips the copy.
                ok, value = mine[index]
            if ok:
                results[index] = value
            else:
                failures.append(value)
        return LocalPendingCall(results, failures, label=label)

    def _gather(
        self, label: str, calls: list[WorkerCall], entries: dict[int, Any]
    ) -> list[tuple[int, Any]]:
        """Exchange this process's entries; all processes' entries, checked for divergence."""
        backend = self.backend
        seq = backend.next_sequence()
        gathered = backend.channel.all_gather((seq, label, len(calls), entries))
        backend.check_same_call(gathered, seq, label, len(calls))
        out = []
        for _, _, _, theirs in gathered:
            out.extend(theirs.items())
        return sorted(out, key=lambda kv: kv[0])

    def _exchange_reduce(
        self,
        label: str,
        calls: list[WorkerCall],
        mine: dict[int, tuple[bool, Any]],
        op: str,
        mesh: DeviceMesh,
    ) -> LocalPendingCall:
        """Sum/mean: share only failures and result specs, then all-reduce the numbers."""
        backend = self.backend
        reps = set(representatives(list(range(len(calls))), mesh))
        entries: dict[int, Any] = {}
        for i, (ok, value) in mine.items():
            if not ok:
                entries[i] = ("fail", encode(False, value, calls[i].rank, backend.node, label))
            elif i in reps:
                spec = numeric.numeric_spec(value)
                if spec is None:  # not a number: send the object itself
                    entries[i] = ("value", encode(True, value, calls[i].rank, backend.node, label))
                else:
                    entries[i] = ("spec", spec)
        gathered = self._gather(label, calls, entries)
        failures = []
        for index, (kind, payload) in gathered:
            if kind == "fail" and index in mine:
                failures.append(mine[index][1])  # this process's own, with its traceback
            elif kind in ("fail", "value"):
                ok, value = decode(payload, calls[index].rank, backend.node, label)
                if not ok:
                    failures.append(value)
        if failures:
            return LocalPendingCall(None, failures, label=label)
        specs = {i: p for i, (k, p) in gathered if k == "spec"}
        if len(specs) == len(reps):
            first = next(iter(specs.values()))
            if all(numeric.same_spec(first, s) for s in specs.values()):
                local = [mine[i][1] for i in sorted(reps) if i in mine]
                buffers = backend.channel.all_reduce_sum(numeric.pack(local, first))
                value = numeric.unpack(buffers, first, op, len(reps))
                return LocalPendingCall(None, reduced=value, reduce_op=op, mesh=mesh, label=label)
        # Mixed results: gather the numbers too and let the collector combine the objects.
        return self._fallback_gather(label, calls, mine, gathered, reps, mesh)

    def _fallback_gather(
        self,
        label: str,
        calls: list[WorkerCall],
        mine: dict[int, tuple[bool, Any]],
        gathered: list[tuple[int, Any]],
        reps: set[int],
        mesh: DeviceMesh,
    ) -> LocalPendingCall:
        backend = self.backend
        results: list[Any] = [None] * len(calls)
        for index, (kind, payload) in gathered:
            if kind == "value":
                results[index] = decode(payload, calls[index].rank, backend.node, label)[1]
        extra = {
            i: encode(True, mine[i][1], calls[i].rank, backend.node, label)
            for i, (kind, _) in gathered
            if kind == "spec" and i in mine
        }
        failures = []
        for index, blob in self._gather(label, calls, extra):
            ok, value = decode(blob, calls[index].rank, backend.node, label)
            if ok:
                results[index] = value
            else:
                failures.append(value)
        return LocalPendingCall(results, failures, mesh=mesh, label=label, partial=True)

    def _lost(self, label: str, calls: list[WorkerCall], exc: BaseException) -> LocalPendingCall:
        """A collective broke: every surviving process reports the same WorkerDiedError."""
        backend = self.backend
        backend.mark_broken(exc, label)
        error = WorkerDiedError(backend.broken_message())
        detail = f"{type(exc).__name__}: {exc}"
        others = sorted({c.rank for c in calls if c.rank != backend.env.rank})
        ranks = others or [backend.env.rank]
        failures = [WorkerFailure(r, error, backend.node_of(r), detail) for r in ranks]
        return LocalPendingCall(None, failures, label=label)

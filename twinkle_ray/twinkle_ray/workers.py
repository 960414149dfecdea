"""The workers of one remote class on Ray, and calls in flight on them.

`RayWorkerGroup` holds one actor handle per worker and is picklable, so a driver object passed
into another group's worker can be called from there. `RayPendingCall` waits on all workers
together and fails fast: the first failure (or a dead actor) raises at once, with every failure
known at that moment, and a dead actor tears its whole group down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import ray
import ray.exceptions as rex

from twinkle_core import CallTimeoutError, DeviceGroup, DeviceMesh, LazyCollect, WorkerDiedError
from twinkle_core.plugin import (
    ConcatCollector,
    FirstCollector,
    MeanCollector,
    NoneCollector,
    PendingCall,
    SumCollector,
    WorkerCall,
    WorkerFailure,
    WorkerGroup,
    WorkerPlacement,
    WorkersFailedError,
    format_remote_traceback,
    rebuilt,
    representatives,
)

from .actor import flatten_call
from .transfer import (
    RemoteArray,
    RemoteCollected,
    RemoteValue,
    ResultMeta,
    register_tensor_serializer,
)

#: Ray errors that mean the worker process (or its node) is gone, not that user code raised.
DEATH_ERRORS: tuple[type[BaseException], ...] = (
    rex.RayActorError,
    rex.WorkerCrashedError,
    rex.NodeDiedError,
    rex.OutOfMemoryError,
    rex.LocalRayletDiedError,
    rex.ObjectLostError,
)

log = logging.getLogger("twinkle")


def how_it_died(exc: BaseException) -> str:
    """Words for a death error: a lost node reads differently from a crashed process.

    An actor whose node is killed without warning first shows as unreachable
    (`ActorUnavailableError`, about 2 s after the loss, while the cluster still lists the node
    as alive for a while); with `max_restarts=0` it never comes back, so it counts as dead.
    """
    text = str(exc)
    if isinstance(exc, rex.NodeDiedError) or "node has died" in text or "node died" in text:
        return "died with its node"
    if isinstance(exc, rex.ActorUnavailableError):
        return "died or became unreachable (its process or its whole node is gone)"
    return "died"


_SMALL = (type(None), bool, int, float, complex)


def _is_small(value: Any) -> bool:
    if isinstance(value, _SMALL):
        return True
    return isinstance(value, (str, bytes)) and len(value) < 1024


#: After the first failure of a call, how long to look for other ranks failing at the same time.
FAILURE_GRACE_SECONDS = 0.25


class Shipper:
    """Puts each object shared by several workers' arguments into the object store once.

    `slice_dp` hands tp/pp peers the very same shard object and `dispatch='all'` every worker
    the same arguments: one `ray.put` per distinct object (by identity) and the same ref to
    each receiver, instead of one inline copy per worker. Ray resolves top-level refs before
    the method runs, so the worker sees the value.
    """

    def __init__(self, per_call: list[tuple[tuple, dict]]) -> None:
        self.counts = Counter(id(v) for args, kwargs in per_call for v in (*args, *kwargs.values()))
        self.refs: dict[int, ray.ObjectRef] = {}
        self.puts = 0

    def ship(self, value: Any) -> Any:
        if self.counts[id(value)] < 2 or _is_small(value) or isinstance(value, ray.ObjectRef):
            return value
        ref = self.refs.get(id(value))
        if ref is None:
            ref = self.refs[id(value)] = ray.put(value)
            self.puts += 1
        return ref

    def ship_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(self.ship(a) for a in args), {k: self.ship(v) for k, v in kwargs.items()}


class RayPendingCall(PendingCall):
    """One method running on some actors: value refs plus small metadata refs per worker."""

    def __init__(
        self,
        workers: RayWorkerGroup,
        method: str,
        ranks: list[int],
        value_refs: list[ray.ObjectRef],
        meta_refs: list[ray.ObjectRef],
    ) -> None:
        self.workers = workers
        self.method = method
        self.ranks = ranks
        self.value_refs = value_refs
        self.meta_refs = meta_refs
        self._failures: list[WorkerFailure] | None = None
        self._values: list[Any] | None = None
        self._metas: list[ResultMeta] | None = None
        self._finished = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ waiting
    def _await(self, refs: list[ray.ObjectRef], timeout: float | None) -> list[Any]:
        """All values of `refs`, failing on the first failure and at the deadline."""
        if self._failures:
            raise WorkersFailedError(self._failures)
        index = {ref: i for i, ref in enumerate(refs)}
        values: list[Any] = [None] * len(refs)
        remaining = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while remaining:
            wait_for = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, remaining = ray.wait(
                remaining, num_returns=1, timeout=wait_for, fetch_local=False
            )
            if not ready:
                running = [self.ranks[index[r]] for r in remaining]
                raise CallTimeoutError(
                    f"{self.workers.class_name}.{self.method} on group "
                    f"{self.workers.group.name!r} did not finish within {timeout:g}s; "
                    f"ranks still running: {running}"
                )
            if remaining:
                more, remaining = ray.wait(
                    remaining, num_returns=len(remaining), timeout=0, fetch_local=False
                )
                ready += more
            failures, failed = [], []
            for ref in ready:
                try:
                    values[index[ref]] = ray.get(ref)
                except Exception as exc:
                    failed.append(index[ref])
                    failures.append(self.workers.failure(self.ranks[index[ref]], exc))
            if failures and remaining:
                # Ranks failing together (a bad batch, a shared bug) usually fail within
                # milliseconds of each other: a short, bounded look lets the error list them
                # all, as the in-process reference does, without waiting for the others.
                late, remaining = ray.wait(
                    remaining,
                    num_returns=len(remaining),
                    timeout=FAILURE_GRACE_SECONDS,
                    fetch_local=False,
                )
                for ref in late:
                    try:
                        values[index[ref]] = ray.get(ref)
                    except Exception as exc:
                        failed.append(index[ref])
                        failures.append(self.workers.failure(self.ranks[index[ref]], exc))
            if failures:
                self._mark_handled(failed)
                self._failures = sorted(failures, key=lambda f: f.rank)
                self.workers.on_failures(self._failures)
                raise WorkersFailedError(self._failures)
        return values

    def _mark_handled(self, indices: list[int]) -> None:
        """Fetch the twin refs of failed calls so Ray does not log them as unhandled errors."""
        for i in indices:
            for refs in (self.value_refs, self.meta_refs):
                if i < len(refs):
                    try:
                        ray.get(refs[i], timeout=0)
                    except Exception:
                        pass

    def wait(self, timeout: float | None) -> list[Any]:
        with self._lock:
            if self._values is None:
                self._values = self._await(self.value_refs, timeout)
            return self._values

    def wait_meta(self, timeout: float | None) -> list[ResultMeta]:
        """The results' metadata only (nothing large reaches the driver); fails like `wait`."""
        with self._lock:
            if self._metas is None:
                self._metas = self._await(self.meta_refs, timeout)
            return self._metas

    def done(self) -> bool:
        if self._finished or self._values is not None or self._failures:
            return True
        ready, _ = ray.wait(
            self.meta_refs, num_returns=len(self.meta_refs), timeout=0, fetch_local=False
        )
        if len(ready) == len(self.meta_refs):
            self._finished = True
            return True
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                return True
        return False

    def succeeded(self) -> bool:
        """True when every worker finished without error, known without fetching the results."""
        if self._failures:
            return False
        if self._metas is not None or self._values is not None:
            return True
        if not self.done() or not self._lock.acquire(blocking=False):
            return False  # still running, or another thread is collecting it right now
        try:
            if self._metas is None:
                self._metas = self._await(self.meta_refs, 0)
        except Exception:
            return False
        finally:
            self._lock.release()
        return True


class RayWorkerGroup(WorkerGroup):
    """One actor per worker; picklable (handles travel), so workers can call other groups."""

    def __init__(
        self,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        class_name: str,
        handles: list[Any],
        placements: list[WorkerPlacement],
        run_name: str,
        restartable: bool = False,
    ) -> None:
        super().__init__(group, device_mesh, class_name, len(placements), placements)
        self.handles = handles
        self.run_name = run_name
        self.restartable = restartable
        #: Driver-side only: rebuilds every actor of the group (set by the backend).
        self.restarter: Any = None
        self.restarts = 0
        self.torn_down: str | None = None
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_local", None)
        state["restarter"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    # ------------------------------------------------------------------ failures
    def node_of(self, rank: int) -> str | None:
        return self.placements[rank].node if rank < len(self.placements) else None

    def failure(self, rank: int, exc: BaseException) -> WorkerFailure:
        """A worker's failure as a WorkerFailure: the user's own exception, or a death."""
        node = self.node_of(rank)
        if isinstance(exc, DEATH_ERRORS):
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            after = (
                "twinkle restarts the whole group (restart is on for it): every worker is "
                "rebuilt from its constructor, so state since then is lost"
                if self.restartable
                else "twinkle tore down the whole group, whose other ranks would hang in their "
                "next collective: create the remote object again to continue"
            )
            died = WorkerDiedError(
                f"worker rank {rank} of group {self.group.name!r} ({self.class_name}) on node "
                f"{node or '?'} {how_it_died(exc)} ({type(exc).__name__}: {reason[:300]}); "
                f"{after}"
            )
            return WorkerFailure(rank, died, node, str(exc))
        if isinstance(exc, rex.RayTaskError):
            cause = getattr(exc, "cause", None)
            if not isinstance(cause, BaseException):
                try:
                    cause = exc.as_instanceof_cause()
                except Exception:
                    cause = exc
            return WorkerFailure(
                rank, rebuilt(cause), node, getattr(exc, "traceback_str", "") or str(exc)
            )
        return WorkerFailure(rank, exc, node, format_remote_traceback(exc))

    def on_failures(self, failures: list[WorkerFailure]) -> None:
        died = [f for f in failures if isinstance(f.exception, WorkerDiedError)]
        if not died or self.torn_down is not None:
            return
        first = died[0]
        reason = f"rank {first.rank} on node {first.node or '?'} died"
        self.teardown(reason)
        if self.restarter is not None:
            self.restarts += 1
            try:
                self.restarter(self.restarts)
            except Exception as exc:  # the group stays torn down; the death is still raised
                self.torn_down = f"{reason}, and its restart failed: {exc}"
                log.error("twinkle: restarting group %r failed: %s", self.group.name, exc)
                first.exception.add_note(
                    f"twinkle: restarting group {self.group.name!r} failed, so it stays torn "
                    f"down: {type(exc).__name__}: {exc}"
                )
                return
            self.torn_down = None

    def teardown(self, reason: str) -> None:
        """Kill every actor of this group (a torch.distributed group cannot lose one rank)."""
        self.torn_down = reason
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already dead, or the cluster is gone
                pass

    # ------------------------------------------------------------------ calls
    def submit(
        self,
        method: str,
        calls: list[WorkerCall],
        *,
        collector: Any = None,
        device_mesh: Any = None,
    ) -> PendingCall:
        has_remote = bool(getattr(self._local, "placeholders", False))
        self._local.placeholders = False
        if self.torn_down is not None:
            from twinkle_core.plugin import CompletedCall

            return CompletedCall(
                [],
                [
                    WorkerFailure(
                        c.rank,
                        WorkerDiedError(
                            f"group {self.group.name!r} ({self.class_name}) was torn down "
                            f"after {self.torn_down}; create the remote object again"
                        ),
                        self.node_of(c.rank),
                    )
                    for c in calls
                ],
            )
        register_tensor_serializer()
        shipper = Shipper([(c.args, c.kwargs) for c in calls])
        value_refs, meta_refs = [], []
        for call in calls:
            kwnames, values = flatten_call(*shipper.ship_call(call.args, call.kwargs))
            value, meta = (
                self.handles[call.rank]
                .call.options(num_returns=2)
                .remote(method, has_remote, kwnames, *values)
            )
            value_refs.append(value)
            meta_refs.append(meta)
        return RayPendingCall(self, method, [c.rank for c in calls], value_refs, meta_refs)

    # ------------------------------------------------------------------ chaining
    def resolve_argument(self, value: LazyCollect) -> Any:
        """Hand a producer's results to this group's workers without fetching them here.

        Where the collected value's shape is known from the producer's metadata, the argument
        becomes a placeholder that dispatchers slice like the real value; each consumer
        worker then fetches only the producer results its share needs. Otherwise (custom
        collectors, nested containers) the value is collected on the driver as usual.
        """
        source = getattr(value, "source", None)
        pending = getattr(source, "pending", None)
        if value.resolved or not isinstance(pending, RayPendingCall):
            return value()
        try:
            metas = pending.wait_meta(None)
        except (WorkersFailedError, CallTimeoutError):
            return value()  # raises the producer's failure, tagged with its call site
        placeholder = build_placeholder(
            source.collector, source.device_mesh, pending.value_refs, metas
        )
        if placeholder is None:
            return value()
        self._local.placeholders = True
        return placeholder


def build_placeholder(
    collector: Any, mesh: DeviceMesh, refs: list[ray.ObjectRef], metas: list[ResultMeta]
) -> Any | None:
    """A stand-in for `collector.collect(results, mesh)` that dispatchers treat the same way."""
    kind = type(collector)
    if kind is NoneCollector:
        return [RemoteValue(r) for r in refs]
    if kind is FirstCollector:
        meta = metas[0]
        if meta.kind in ("opaque", "number"):
            return RemoteValue(refs[0])
        if meta.kind in ("ndarray", "tensor"):
            return RemoteArray([(refs[0], 0, meta.length or 0)], meta.kind)
        return None
    chosen = representatives(list(range(len(refs))), mesh)
    reps = [metas[i] for i in chosen]
    if kind is ConcatCollector:
        first = reps[0]
        if first.kind in ("ndarray", "tensor") and all(
            m.kind == first.kind and m.dtype == first.dtype for m in reps
        ):
            return RemoteArray([(refs[i], 0, metas[i].length or 0) for i in chosen], first.kind)
        return None
    if kind in (SumCollector, MeanCollector) and all(m.kind == "number" for m in reps):
        return RemoteCollected(list(refs), collector, mesh)
    return None

"""The in-process reference backend: real instances, real dispatch, no processes.

For a group of N workers it creates N instances in the current process, each with its own
worker context and its own random generators, and runs dispatch, execute and collect exactly
as a distributed backend does. It defines what the other backends must reproduce, and lets
users unit-test remote classes without torch or Ray.
"""

from __future__ import annotations

import copy
import os
import socket
import threading
from typing import Any

from .backend import (
    CompletedCall,
    ExecutionBackend,
    PendingCall,
    PreparedCall,
    WorkerCall,
    WorkerGroup,
    WorkerPlacement,
    read_options,
)
from .collective import CollectiveGroup, MemberHub
from .context import WorkerContext
from .copying import copy_arguments
from .device_group import DeviceGroup
from .device_mesh import DeviceMesh
from .errors import ConfigurationError
from .failures import WorkerFailure, unsendable_result
from .handoff import builtin_hand_off, colocated_source, hand_off_value, reference_memo
from .platform import check_device_type
from .worker import WorkerState, run_method


class InProcessWorkerGroup(WorkerGroup):
    """N instances of one class living in this process."""

    def __init__(
        self,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        class_name: str,
        instances: list[Any],
        states: list[WorkerState],
        isolate: bool,
        placements: list[WorkerPlacement],
        lock: threading.RLock,
    ) -> None:
        super().__init__(group, device_mesh, class_name, len(instances), placements)
        self.instances = instances
        self.states = states
        self.isolate = isolate
        #: The backend's lock: one call at a time runs in this process (see InProcessBackend).
        self.lock = lock

    def submit(self, call: PreparedCall) -> PendingCall:
        handed = call.backend_data
        with self.lock:
            return self._run_all(call.method, call.calls, handed)

    def resolve_argument(self, value: Any, call: PreparedCall) -> Any:
        """A result of another object on this group is handed on by reference: each rank's
        worker receives what that rank's worker of the producer returned, the very object,
        and other ranks' results as copies (`twinkle_core.handoff`)."""
        source = colocated_source(value, self)
        pending = getattr(source, "pending", None)
        if (
            source is None
            or not isinstance(pending, InProcessCall)
            or source.workers.lock is not self.lock  # another run's object
            or len(pending.originals) != self.size
            or not pending.succeeded()
            or not builtin_hand_off(source.collector, call.dispatcher)
        ):
            return value()
        try:
            handed = hand_off_value(source.collector, source.device_mesh, pending.originals)
        except Exception:
            return value()  # the collector's error, raised as collecting raises it
        data = call.backend_data
        if not isinstance(data, _HandedOn):
            data = call.backend_data = _HandedOn()
        data.sources.append(pending.originals)
        return handed

    def _run_all(
        self, method: str, calls: list[WorkerCall], handed: _HandedOn | None = None
    ) -> PendingCall:
        results: list[Any] = []
        originals: list[Any] = []
        failures: list[WorkerFailure] = []
        node = self.placements[0].node if self.placements else None
        for call in calls:
            args, kwargs = (call.args, call.kwargs)
            if self.isolate:
                memo = handed.memo(call.rank) if handed is not None else None
                args, kwargs = copy_arguments(args, kwargs, memo, f"{self.class_name}.{method}")
            with self.states[call.rank].activate():
                ok, value = run_method(
                    self.instances[call.rank], method, args, kwargs, rank=call.rank, node=node
                )
            if not ok:
                failures.append(value)
                continue
            if self.isolate:
                try:
                    copied = copy.deepcopy(value)
                except Exception as exc:  # a generator, an open file, a lock: that rank's failure
                    label, why = f"{self.class_name}.{method}", f"{type(exc).__name__}: {exc}"
                    error = unsendable_result(label, call.rank, value, why)
                    failures.append(WorkerFailure(call.rank, error, node, ""))
                    continue
            originals.append(value)
            results.append(copied if self.isolate else value)
        return InProcessCall(results, failures, originals)


class InProcessCall(CompletedCall):
    """A finished in-process call; `originals` are the objects the workers returned (the
    driver's `results` are copies of them under `isolate`), handed on by reference to
    colocated objects."""

    def __init__(self, results: list[Any], failures: list, originals: list[Any]) -> None:
        super().__init__(results, failures)
        self.originals = originals


class _HandedOn:
    """The producers' results a call's arguments were built from by reference."""

    __slots__ = ("sources",)

    def __init__(self) -> None:
        self.sources: list[list[Any]] = []

    def memo(self, rank: int) -> dict[int, Any]:
        """What the argument copy of worker `rank` leaves uncopied: its own results."""
        memo: dict[int, Any] = {}
        for originals in self.sources:
            memo.update(reference_memo(originals[rank]))
        return memo


class InProcessBackend(ExecutionBackend):
    """Mode `inprocess`: every worker is an object in the driver process.

    Option `isolate` (default True) copies arguments and results as a real transport would,
    so a worker mutating its input cannot change the driver's or its peers' data.

    Calls from several driver threads are serialized by one re-entrant lock for the whole
    backend (a worker's method may call another group, or its own, from the same thread): a
    worker runs one call at a time with its own random generators, as a process would. One
    lock rather than one per group, so two threads calling groups that call each other cannot
    take two locks in opposite orders.
    """

    name = "inprocess"

    def initialize(self, config) -> None:
        super().initialize(config)
        options = read_options(self.name, config.backend_options, {"isolate": True})
        self.isolate = options["isolate"]
        if not isinstance(self.isolate, bool):
            raise ConfigurationError(
                f"initialize(mode='inprocess', isolate=...) must be True or False, "
                f"got {self.isolate!r}"
            )
        self.node = socket.gethostname()
        self.lock = threading.RLock()
        for group in config.groups.values():
            check_device_type(group, self.name)

    def create_workers(
        self,
        cls: type,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        args: tuple,
        kwargs: dict,
        *,
        num_workers: int,
    ) -> WorkerGroup:
        config = self.config
        assert config is not None, "initialize() runs before create_workers()"
        instances, states, placements = [], [], []
        for rank in range(num_workers):
            ctx = WorkerContext(
                rank=rank,
                world_size=num_workers,
                local_rank=rank,
                local_world_size=num_workers,
                group_name=group.name,
                device_mesh=device_mesh,
                node_id=self.node,
                device_type=group.device_type,
                device_ids=tuple(group.worker_ranks(rank)),
                mode=self.name,
            )
            # A fresh worker process starts from the run's seed; so does each instance.
            a, k = (
                copy_arguments(args, kwargs, {}, f"{cls.__name__}.__init__")
                if self.isolate
                else (args, kwargs)
            )
            with self.lock:
                instance, state = WorkerState.construct(
                    cls, a, k, ctx, seed=config.seed, full_determinism=config.full_determinism
                )
            instances.append(instance)
            states.append(state)
            placements.append(
                WorkerPlacement(
                    rank, self.node, ctx.device_ids, group.device_type, f"pid {os.getpid()}"
                )
            )
        return InProcessWorkerGroup(
            group,
            device_mesh,
            cls.__name__,
            instances,
            states,
            self.isolate,
            placements,
            self.lock,
        )

    def create_collective_group(self, group: CollectiveGroup, workers: list[WorkerGroup]) -> None:
        """Every member lives in this process: they meet through one `MemberHub` (members run
        one after another, so only a broadcast whose source comes first crosses objects; see
        `twinkle_core.collective`)."""
        hub = MemberHub(
            group,
            range(group.world_size),
            (0,) * group.world_size,
            link=None,
            mode=self.name,
        )
        rank = 0
        for w in workers:
            assert isinstance(w, InProcessWorkerGroup)
            for state in w.states:
                state.context.collectives[group.name] = hub.member(rank)
                rank += 1

    def describe(self) -> dict[str, Any]:
        return {"node": self.node}

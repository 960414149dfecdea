"""The in-process reference backend: real instances, real dispatch, no processes.

For a group of N workers it creates N instances in the current process, each with its own
worker context and its own random generators, and runs dispatch, execute and collect exactly
as a distributed backend does. It defines what the other backends must reproduce, and lets
users unit-test remote classes without torch or Ray.
"""

from __future__ import annotations

import contextlib
import copy
import socket
from collections.abc import Iterator
from typing import Any

from .backend import (
    CompletedCall,
    ExecutionBackend,
    PendingCall,
    WorkerCall,
    WorkerGroup,
    WorkerPlacement,
)
from .context import WorkerContext, worker_context
from .device_group import DeviceGroup
from .device_mesh import DeviceMesh
from .errors import ConfigurationError
from .failures import RankFailure, format_remote_traceback
from .seeding import get_rng_state, seed_everything, set_rng_state


class InProcessWorkerGroup(WorkerGroup):
    """N instances of one class living in this process."""

    def __init__(
        self,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        class_name: str,
        instances: list[Any],
        contexts: list[WorkerContext],
        rng_states: list[dict[str, Any]],
        isolate: bool,
        placements: list[WorkerPlacement],
    ) -> None:
        super().__init__(group, device_mesh, class_name, len(instances), placements)
        self.instances = instances
        self.contexts = contexts
        self.rng_states = rng_states
        self.isolate = isolate

    @contextlib.contextmanager
    def _as_worker(self, rank: int) -> Iterator[None]:
        """Run as worker `rank`: its context and its own random generators.

        The caller saves and restores the driver's generators once per call (see `submit`).
        """
        set_rng_state(self.rng_states[rank])
        try:
            with worker_context(self.contexts[rank]):
                yield
        finally:
            self.rng_states[rank] = get_rng_state()

    def submit(
        self,
        method: str,
        calls: list[WorkerCall],
        *,
        collector: Any = None,
        device_mesh: DeviceMesh | None = None,
    ) -> PendingCall:
        results: list[Any] = []
        failures: list[RankFailure] = []
        node = self.placements[0].node if self.placements else None
        driver_state = get_rng_state()
        try:
            for call in calls:
                args, kwargs = (call.args, call.kwargs)
                if self.isolate:
                    args, kwargs = copy.deepcopy((args, kwargs))
                with self._as_worker(call.rank):
                    try:
                        value = getattr(self.instances[call.rank], method)(*args, **kwargs)
                    except Exception as exc:
                        failures.append(
                            RankFailure(call.rank, exc, node, format_remote_traceback(exc))
                        )
                        continue
                results.append(copy.deepcopy(value) if self.isolate else value)
        finally:
            set_rng_state(driver_state)
        return CompletedCall(results, failures)


class InProcessBackend(ExecutionBackend):
    """Mode `inprocess`: every worker is an object in the driver process.

    Option `isolate` (default True) copies arguments and results as a real transport would,
    so a worker mutating its input cannot change the driver's or its peers' data.
    """

    name = "inprocess"

    def initialize(self, config) -> None:
        super().initialize(config)
        options = dict(config.backend_options)
        self.isolate = options.pop("isolate", True)
        if not isinstance(self.isolate, bool):
            raise ConfigurationError(
                f"initialize(mode='inprocess', isolate=...) must be True or False, "
                f"got {self.isolate!r}"
            )
        if options:
            raise ConfigurationError(
                f"initialize(mode='inprocess') got unknown options {sorted(options)}; "
                "the in-process backend accepts: isolate"
            )
        self.node = socket.gethostname()

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
        instances, contexts, states, placements = [], [], [], []
        driver_state = get_rng_state()
        try:
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
                )
                # A fresh worker process starts from the run's seed; so does each instance.
                seed_everything(config.seed, config.full_determinism)
                a, k = copy.deepcopy((args, kwargs)) if self.isolate else (args, kwargs)
                with worker_context(ctx):
                    instances.append(cls(*a, **k))
                contexts.append(ctx)
                states.append(get_rng_state())
                placements.append(
                    WorkerPlacement(rank, self.node, ctx.device_ids, group.device_type)
                )
        finally:
            set_rng_state(driver_state)
        return InProcessWorkerGroup(
            group,
            device_mesh,
            cls.__name__,
            instances,
            contexts,
            states,
            self.isolate,
            placements,
        )

    def describe(self) -> dict[str, Any]:
        return {"node": self.node}

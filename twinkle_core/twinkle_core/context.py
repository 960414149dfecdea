"""The worker context: tells code inside a worker who it is, the same way on every backend."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .device_mesh import DeviceMesh

if TYPE_CHECKING:
    from .collective import Collective


class Memberships(dict):
    """A worker's collective groups by name (process-local: a copy sent elsewhere is empty,
    since process groups cannot travel)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), ())


@dataclass(frozen=True)
class WorkerContext:
    """Identity of one worker of a remote class.

    `rank` and `world_size` are within the worker's group (what `torch.distributed` sees inside
    that group); `local_rank`/`local_world_size` are within the worker's node.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_name: str
    device_mesh: DeviceMesh
    node_id: str | None = None
    device_type: str = "cpu"
    device_ids: tuple[int, ...] = ()
    #: The backend running this worker (`initialize(mode=...)`'s name, e.g. "ray"): how a
    #: plugin answering a worker-side hook (`twinkle_init_distributed`) knows it is its own.
    mode: str = ""
    #: Which generation of the group's workers this is: 0, then one more after each restart
    #: (`DeviceGroup(max_restarts=N)`), so a worker knows it was rebuilt.
    generation: int = 0
    #: The collective groups this worker is a member of (see `collective()`).
    collectives: Memberships = field(default_factory=Memberships, compare=False, repr=False)

    def collective(self, name: str) -> Collective:
        """This worker's member of the collective group `name` (`twinkle_core.collective_group`)."""
        found = self.collectives.get(name)
        if found is None:
            from .errors import ConfigurationError

            mine = ", ".join(repr(n) for n in self.collectives) or "none"
            raise ConfigurationError(
                f"collective({name!r}): this worker (group {self.group_name!r} rank {self.rank}) "
                f"is not a member of a collective group named {name!r} (its groups: {mine}); "
                f"create it on the driver with twinkle_core.collective_group({name!r}, [...]) "
                "listing this worker's object"
            )
        return found  # type: ignore[no-any-return]

    @property
    def data_rank(self) -> int:
        """Which data shard this worker receives from `slice_dp`."""
        return self.device_mesh.data_rank_of(self.rank)

    @property
    def data_world_size(self) -> int:
        return self.device_mesh.data_world_size


_current: contextvars.ContextVar[WorkerContext | None] = contextvars.ContextVar(
    "twinkle_worker_context", default=None
)
_process_context: WorkerContext | None = None


def get_worker_context() -> WorkerContext | None:
    """The context of the worker running the current code, or None on a driver.

    Inside a remote method this is the worker's identity; in the driver (in-process or Ray)
    it is None.
    """
    return _current.get() or _process_context


@contextlib.contextmanager
def worker_context(ctx: WorkerContext) -> Iterator[WorkerContext]:
    """Make `ctx` the current worker context for the duration of the block (re-entrant)."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def set_process_worker_context(ctx: WorkerContext | None) -> None:
    """Set the context for the whole process: used by backends with one worker per process."""
    global _process_context
    _process_context = ctx

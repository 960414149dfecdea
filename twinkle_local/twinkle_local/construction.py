"""Building a remote object's workers in mode 'local', and the one error when any build fails.

A group of k workers lives on ranks 0..k-1: worker r is built in process r, from the run's seed
and with its own random generators, on its process's device. Its outcome is exchanged like a
call's (`exchange.py`), so every process learns together whether the object exists, and when a
worker could not be built every process raises the same error, naming the rank that failed.
"""

from __future__ import annotations

import os
from typing import Any

from twinkle_core import DeviceGroup, DeviceMesh, WorkerContext, WorkerDiedError
from twinkle_core.plugin import WorkerPlacement, WorkerState, copy_arguments, worker_failure

from .calls import LocalPendingCall
from .session import Session


def placements(session: Session, group: DeviceGroup, num_workers: int) -> list[WorkerPlacement]:
    """Where each worker of a group lives: worker r in process r."""
    return [
        WorkerPlacement(
            r,
            session.node_of(r),
            _devices(session, group, r),
            group.device_type,
            f"torchrun rank {r}",
        )
        for r in range(num_workers)
    ]


def _devices(session: Session, group: DeviceGroup, rank: int) -> tuple[int, ...]:
    if group.device_type == "cpu":
        return tuple(group.worker_ranks(rank))
    # One process per device: a worker uses its process's local device.
    return (rank % session.env.local_world_size,)


def worker_context(
    session: Session, group: DeviceGroup, mesh: DeviceMesh, num_workers: int
) -> WorkerContext:
    """The context of this process's worker of a group of `num_workers`."""
    env = session.env
    same_node = sum(1 for r in range(num_workers) if session.node_of(r) == session.node)
    return WorkerContext(
        rank=env.rank,
        world_size=num_workers,
        local_rank=env.local_rank,
        local_world_size=max(same_node, 1),
        group_name=group.name,
        device_mesh=mesh,
        node_id=session.node,
        device_type=group.device_type,
        device_ids=_devices(session, group, env.rank),
        mode="local",
        generation=restart_count(),
    )


def restart_count() -> int:
    """How many times torchrun restarted this job (`--max-restarts`): the workers' generation.
    torchrun restarts every process of the job, which then resumes from its own checkpoint."""
    try:
        return max(0, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    except ValueError:
        return 0


def construct(
    session: Session, config, cls: type, args: tuple, kwargs: dict, context: WorkerContext
) -> tuple[Any, WorkerState | None, Any]:
    """Build this process's instance from the run's seed, with its own generators:
    (instance, state, None), or (None, None, the WorkerFailure)."""
    try:
        a, k = (
            copy_arguments(args, kwargs, {}, f"{cls.__name__}.__init__")
            if session.isolate
            else (args, kwargs)
        )
        instance, state = WorkerState.construct(
            cls, a, k, context, seed=config.seed, full_determinism=config.full_determinism
        )
    except Exception as exc:
        return None, None, worker_failure(context.rank, exc, session.node)
    return instance, state, None


def raise_construction(outcome: LocalPendingCall, label: str, failure) -> None:
    """Every process raises the same error when any instance could not be built."""
    if outcome.error is not None:
        raise outcome.error
    if not outcome.failures:
        return
    first = min(outcome.failures, key=lambda f: f.rank)
    if isinstance(first.exception, WorkerDiedError):
        raise first.exception
    own = failure is not None and failure.rank == first.rank
    exc = failure.exception if own else first.exception
    note = f"twinkle: constructing {label} failed on rank {first.rank}"
    if first.node:
        note += f" (node {first.node})"
    if not own and first.traceback:
        note += "\n" + first.traceback.rstrip()
    _add_note(exc, note)
    raise exc


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]

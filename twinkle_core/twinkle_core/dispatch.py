"""Dispatchers: how one call's arguments are split into one `(args, kwargs)` per worker."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from .device_mesh import DeviceMesh
from .errors import ConfigurationError
from .strategies import as_strategy
from .structure import is_array_like

WorkerArgs = list[tuple[tuple, dict]]


class Dispatcher(ABC):
    """Turns the arguments of one call into the arguments of each of `n_workers` workers."""

    name: str = ""

    @abstractmethod
    def dispatch(
        self, args: tuple, kwargs: dict, n_workers: int, device_mesh: DeviceMesh
    ) -> WorkerArgs:
        """Return exactly `n_workers` `(args, kwargs)` pairs, in worker-rank order."""


class FunctionDispatcher(Dispatcher):
    """Adapts a plain function with `dispatch`'s parameters."""

    def __init__(self, fn: Callable[..., WorkerArgs], name: str = "") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "dispatch")

    def dispatch(self, args, kwargs, n_workers, device_mesh):
        return self.fn(args, kwargs, n_workers, device_mesh)

    def __repr__(self) -> str:
        return f"FunctionDispatcher({self.name})"


class AllDispatcher(Dispatcher):
    """Every worker receives the full arguments."""

    name = "all"

    def dispatch(
        self, args: tuple, kwargs: dict, n_workers: int, device_mesh: DeviceMesh
    ) -> WorkerArgs:
        return [(args, kwargs)] * n_workers  # the same pair for each: read, never changed


def _even_slice(total: int, parts: int, index: int) -> slice:
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


class SliceDispatcher(Dispatcher):
    """Lists are split evenly across the workers (earlier workers take the remainder); other
    values go to every worker unchanged."""

    name = "slice"

    def dispatch(
        self, args: tuple, kwargs: dict, n_workers: int, device_mesh: DeviceMesh
    ) -> WorkerArgs:
        if not args and not kwargs:  # nothing to split (a no-argument call is common)
            return [((), {}) for _ in range(n_workers)]
        for value in args:
            if isinstance(value, list):
                break
        else:
            for value in kwargs.values():
                if isinstance(value, list):
                    break
            else:
                # No list to split (a config dict, an array): every worker gets the arguments
                # as given, the very args tuple, which tells a backend it is the one core
                # already found plain data (`PreparedCall.plain_args`).
                return [(args, kwargs)] * n_workers  # the same pair for each: read, never changed
        _same_lengths(
            [(f"argument {i}", a) for i, a in enumerate(args) if isinstance(a, list)]
            + [(f"argument {k!r}", v) for k, v in kwargs.items() if isinstance(v, list)],
            "slice",
        )

        def share(value: Any, i: int) -> Any:
            if isinstance(value, list):
                return value[_even_slice(len(value), n_workers, i)]
            return value

        return [
            (
                tuple(share(a, i) for a in args),
                {k: share(v, i) for k, v in kwargs.items()},
            )
            for i in range(n_workers)
        ]


class SliceDPDispatcher(Dispatcher):
    """Batches are split along dim 0 by the worker's data-parallel rank in the device mesh.

    Lists, tuples, numpy arrays and torch tensors are sliced; dicts are walked recursively;
    other values are copied. Workers that share a data rank (tp/pp/cp/ep peers) receive the
    very same shard object, so a backend can serialize it once.
    """

    name = "slice_dp"

    def dispatch(
        self, args: tuple, kwargs: dict, n_workers: int, device_mesh: DeviceMesh
    ) -> WorkerArgs:
        if device_mesh.world_size != n_workers:
            raise ConfigurationError(
                f"slice_dp: the device mesh has {device_mesh.world_size} ranks but the call goes "
                f"to {n_workers} workers; give the remote class a device_mesh of its group size"
            )
        if not args and not kwargs:
            return [((), {}) for _ in range(n_workers)]
        n_shards = device_mesh.data_world_size
        batches: list[tuple[str, Any]] = []
        for i, a in enumerate(args):
            _batches(a, f"argument {i}", batches)
        for k, v in kwargs.items():
            _batches(v, f"argument {k!r}", batches)
        _same_lengths(batches, "slice_dp")
        shards: dict[int, tuple[tuple, dict]] = {}
        out: WorkerArgs = []
        for worker in range(n_workers):
            dr = device_mesh.data_rank_of(device_mesh.ranks[worker])
            if dr not in shards:
                shards[dr] = (
                    tuple(
                        _shard(a, dr, n_shards, f"argument {i}", device_mesh)
                        for i, a in enumerate(args)
                    ),
                    {
                        k: _shard(v, dr, n_shards, f"argument {k!r}", device_mesh)
                        for k, v in kwargs.items()
                    },
                )
            out.append(shards[dr])
        return out


def _batches(value: Any, where: str, out: list[tuple[str, Any]]) -> None:
    """Every value `slice_dp` slices, with where it is (dicts walked, as `_shard` does)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _batches(v, f"{where}[{k!r}]", out)
    elif isinstance(value, (list, tuple)) or is_array_like(value):
        out.append((where, value))


def _same_lengths(batches: list[tuple[str, Any]], dispatcher: str) -> None:
    """Values split together must have one length, or their shares would not line up."""
    lengths = {where: len(value) for where, value in batches}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{where} has {n}" for where, n in lengths.items())
        raise ConfigurationError(
            f"{dispatcher}: the values split across workers must have the same length, but "
            f"{listed}; the workers' shares would not line up (zip would drop items). Pass "
            f"batches of one length, or use dispatch='all' for values every worker needs whole"
        )


def _shard(value: Any, data_rank: int, n_shards: int, where: str, mesh: DeviceMesh) -> Any:
    if isinstance(value, dict):
        return {
            k: _shard(v, data_rank, n_shards, f"{where}[{k!r}]", mesh) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)) or is_array_like(value):
        total = len(value)
        if total < n_shards:
            raise ConfigurationError(
                f"slice_dp: {where} has {total} items but the mesh has {n_shards} data shards "
                f"({mesh.describe()}); pass a batch of at least {n_shards} items, or use "
                f"dispatch='all' for values every worker needs whole"
            )
        return value[mesh.get_slice(total, data_rank)]
    return value


BUILTIN_DISPATCHERS: dict[str, Dispatcher] = {
    d.name: d for d in (AllDispatcher(), SliceDispatcher(), SliceDPDispatcher())
}


def as_dispatcher(obj: Any, *, argument: str = "dispatch") -> Dispatcher:
    """Accept a registered name, a Dispatcher (class or instance), or a plain function."""
    return as_strategy(
        obj,
        kind="dispatchers",
        base=Dispatcher,
        wrap=FunctionDispatcher,
        argument=argument,
        expected="a dispatcher name (e.g. 'slice_dp'), a Dispatcher, or a function "
        "(args, kwargs, n_workers, device_mesh) -> [(args, kwargs), ...]",
    )

"""Collectors: how the results of all workers become the one value the caller receives."""

from __future__ import annotations

import functools
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from .device_mesh import DeviceMesh
from .strategies import as_strategy
from .structure import combine, torch_module


class Collector(ABC):
    """Combines the per-worker results of a call (in worker-rank order) into one value.

    `reduce_op` ('sum' or 'mean') tells backends that can all-reduce numbers that this
    collector is a plain numeric reduction, so they may skip gathering Python objects.
    """

    name: str = ""
    reduce_op: str | None = None

    @abstractmethod
    def collect(self, results: list, device_mesh: DeviceMesh | None) -> Any:
        """Return the collected value."""

    def used_results(self, device_mesh: DeviceMesh | None, n: int) -> list[int]:
        """The indices (among the call's `n` results, in worker-rank order) that `collect`
        reads, in the order it combines them.

        Backends move only these to the caller or to another group's workers (with `first`,
        one worker's result instead of every one). The default, every result, is always
        safe; a collector that ignores some results may say so here, and must then give the
        same value whatever the other results hold (`twinkle_core.testing` checks it).
        """
        return list(range(n))


class FunctionCollector(Collector):
    """Adapts a plain function with `collect`'s parameters."""

    def __init__(self, fn: Callable[[list, DeviceMesh | None], Any], name: str = "") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "collect")

    def collect(self, results, device_mesh):
        return self.fn(results, device_mesh)

    def __repr__(self) -> str:
        return f"FunctionCollector({self.name})"


def representatives(results: list, device_mesh: DeviceMesh | None) -> list:
    """One result per data shard (the mesh's collect ranks) when the results cover the mesh.

    tp/pp/cp/ep peers compute the same data shard; counting them again would skew a mean and
    duplicate a concatenation.
    """
    if device_mesh is not None and len(results) == device_mesh.world_size > 1:
        index = {rank: i for i, rank in enumerate(device_mesh.ranks)}
        return [results[index[r]] for r in device_mesh.collect_ranks()]
    return list(results)


class NoneCollector(Collector):
    """The list of every worker's result, in rank order."""

    name = "none"

    def collect(self, results, device_mesh):
        return list(results)


class FirstCollector(Collector):
    """The first worker's result."""

    name = "first"

    def collect(self, results, device_mesh):
        return results[0]

    def used_results(self, device_mesh, n):
        return [0]


class LastPPCollector(Collector):
    """The results of the ranks on the last pipeline stage, in rank order."""

    name = "last_pp"

    def collect(self, results, device_mesh):
        if device_mesh is None or len(results) != device_mesh.world_size:
            return list(results)
        index = {rank: i for i, rank in enumerate(device_mesh.ranks)}
        return [results[index[r]] for r in device_mesh.pp_last_ranks()]

    def used_results(self, device_mesh, n):
        if device_mesh is None or n != device_mesh.world_size:
            return list(range(n))
        index = {rank: i for i, rank in enumerate(device_mesh.ranks)}
        return [index[r] for r in device_mesh.pp_last_ranks()]


def flatten_lists(values: list) -> list:
    """`values` with every list among them joined in (one level): what `flatten` and `concat`
    make of one leaf of every shard."""
    out: list = []
    for v in values:
        if isinstance(v, list):
            out.extend(v)
        else:
            out.append(v)
    return out


class ShardCollector(Collector):
    """A collector that reads one result per data shard (`representatives`): tp/pp/cp/ep
    peers of a shard are not read."""

    def used_results(self, device_mesh, n):
        return representatives(list(range(n)), device_mesh)


class FlattenCollector(ShardCollector):
    """One list of every data shard's items: list results are joined, other results appended."""

    name = "flatten"

    def collect(self, results, device_mesh):
        reps = representatives(results, device_mesh)
        if all(isinstance(r, list) for r in reps):
            return flatten_lists(reps)
        return combine(reps, flatten_lists)


#: Leaf types `sum` and `mean` refuse: `+` joins them (and tuples whose lengths differ reach
#: the leaves whole), where the collectors promise an element-wise sum, as an all-reduce's.
_JOINED = (list, tuple, str, bytes)


def _check_addable(values: list) -> None:
    """Refuse leaves that `+` would join or broadcast instead of adding element-wise: lists,
    tuples, strings, None, and arrays or tensors whose shapes differ between workers (or an
    array beside a plain number). Diverging workers are an error, never a mixed result."""
    shapes = []
    for value in values:
        if value is None or isinstance(value, _JOINED):
            kinds = sorted({type(v).__name__ for v in values})
            raise ValueError(
                f"cannot add results of type {', '.join(kinds)} element-wise ('+' would join "
                "them); return numbers, arrays or tensors, or collect='flatten' or 'concat' "
                "to join the workers' results"
            )
        shape = getattr(value, "shape", None)
        shapes.append(() if shape is None else tuple(shape))
    if len(set(shapes)) > 1:
        raise ValueError(
            f"cannot add results whose shapes differ between workers "
            f"({', '.join(map(str, shapes))}): adding them would broadcast them into one "
            "(an all-reduce refuses them); return results of one shape from every worker"
        )


def _sum_leaf(values: list) -> Any:
    _check_addable(values)
    return functools.reduce(operator.add, values)


def _mean_leaf(values: list) -> Any:
    return _sum_leaf(values) / len(values)


class SumCollector(ShardCollector):
    """Sum over data shards (numbers, numpy arrays, tensors; dicts per key, tuples per item)."""

    name = "sum"
    reduce_op = "sum"

    def collect(self, results, device_mesh):
        return combine(representatives(results, device_mesh), _sum_leaf)


class MeanCollector(ShardCollector):
    """Mean over data shards (numbers, numpy arrays, tensors; dicts per key, tuples per item)."""

    name = "mean"
    reduce_op = "mean"

    def collect(self, results, device_mesh):
        return combine(representatives(results, device_mesh), _mean_leaf)


def _concat_leaf(values: list) -> Any:
    first = values[0]
    torch = torch_module(first)
    if torch is not None and isinstance(first, torch.Tensor):
        return torch.cat([v if v.dim() else v.reshape(1) for v in values], dim=0)
    if isinstance(first, np.ndarray):
        return np.concatenate([np.atleast_1d(v) for v in values], axis=0)
    if isinstance(first, list):
        return flatten_lists(values)
    return np.asarray(values)


class ConcatCollector(ShardCollector):
    """Concatenation along dim 0 over data shards: numpy arrays, torch tensors, lists."""

    name = "concat"

    def collect(self, results, device_mesh):
        return combine(representatives(results, device_mesh), _concat_leaf)


BUILTIN_COLLECTORS: dict[str, Collector] = {
    c.name: c
    for c in (
        NoneCollector(),
        FirstCollector(),
        FlattenCollector(),
        MeanCollector(),
        SumCollector(),
        LastPPCollector(),
        ConcatCollector(),
    )
}


def as_collector(obj: Any, *, argument: str = "collect") -> Collector:
    """Accept a registered name, a Collector (class or instance), or a plain function."""
    return as_strategy(
        obj,
        kind="collectors",
        base=Collector,
        wrap=FunctionCollector,
        argument=argument,
        expected="a collector name (e.g. 'mean'), a Collector, or a function "
        "(results, device_mesh) -> value",
    )

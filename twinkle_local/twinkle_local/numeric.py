"""Numeric results as flat buffers, so `sum`/`mean` collectors can all-reduce them.

A result is reducible when it is a number, a numpy/torch array of integers or floats, or dicts
and tuples of those (the nesting core's collectors walk). `numeric_spec` describes its shape
without its values; results of every rank with the same spec are packed into one int64 and one
float64 buffer, all-reduced, and unpacked into a value of the types the collector would return
(python int/float, numpy scalar/array of the original dtype, tensor of the original dtype on
this process's device). Anything else (bools, lists, strings, mixed specs) is gathered instead.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

INT64 = "int64"
FLOAT64 = "float64"
_INT_LIMIT = 2**62


@dataclass(frozen=True)
class Leaf:
    """One number or array: how it travels (`acc`, int64 or float64) and how it comes back."""

    kind: str  # "int", "float", "numpy", "torch"
    dtype: Any  # numpy dtype string or torch dtype; None for python numbers
    shape: tuple[int, ...]
    acc: str
    device_type: str = "cpu"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Node:
    """A dict (keys in order) or tuple (its type, for namedtuples) of specs."""

    kind: str  # "dict" or "tuple"
    keys: tuple
    children: tuple
    tuple_type: type | None = None


Spec = Leaf | Node


def _torch():
    import sys

    return sys.modules.get("torch")


def numeric_spec(value: Any) -> Spec | None:
    """The spec of a reducible result, or None when it must be gathered as an object."""
    if isinstance(value, bool) or value is None:
        return None
    # numpy first: np.float64 is also a python float, but the collector keeps it numpy.
    if isinstance(value, (np.ndarray, np.generic)):
        dtype = np.asarray(value).dtype
        if dtype.kind in "fi" or (dtype.kind == "u" and dtype.itemsize < 8):
            acc = FLOAT64 if dtype.kind == "f" else INT64
            return Leaf("numpy", dtype.str, tuple(np.shape(value)), acc)
        return None
    if isinstance(value, int):
        return Leaf("int", None, (), INT64) if abs(value) < _INT_LIMIT else None
    if isinstance(value, float):
        return Leaf("float", None, (), FLOAT64)
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = value.dtype
        if dtype.is_complex or dtype == torch.bool or dtype == torch.uint64:
            return None
        acc = FLOAT64 if dtype.is_floating_point else INT64
        return Leaf("torch", dtype, tuple(value.shape), acc, value.device.type)
    if isinstance(value, dict):
        children = tuple(numeric_spec(v) for v in value.values())
        if any(c is None for c in children) or not value:
            return None
        return Node("dict", tuple(value), children)
    if isinstance(value, tuple):
        children = tuple(numeric_spec(v) for v in value)
        if any(c is None for c in children) or not value:
            return None
        return Node("tuple", (), children, type(value))
    return None


def same_spec(a: Spec | None, b: Spec | None) -> bool:
    """Whether two results can be reduced together (devices may differ between processes)."""
    if a is None or b is None or type(a) is not type(b):
        return False
    if isinstance(a, Leaf):
        return (a.kind, str(a.dtype), a.shape, a.acc) == (b.kind, str(b.dtype), b.shape, b.acc)
    return (
        a.kind == b.kind
        and a.keys == b.keys
        and a.tuple_type is b.tuple_type
        and len(a.children) == len(b.children)
        and all(same_spec(x, y) for x, y in zip(a.children, b.children, strict=True))
    )


def _leaves(value: Any, spec: Spec, out: list[tuple[Leaf, Any]]) -> None:
    if isinstance(spec, Leaf):
        out.append((spec, value))
        return
    items = list(value.values()) if spec.kind == "dict" else list(value)
    for item, child in zip(items, spec.children, strict=True):
        _leaves(item, child, out)


def _leaf_specs(spec: Spec, out: list[Leaf]) -> None:
    if isinstance(spec, Leaf):
        out.append(spec)
    else:
        for child in spec.children:
            _leaf_specs(child, out)


def buffer_sizes(spec: Spec) -> dict[str, int]:
    """How many int64 and float64 elements a result of `spec` packs into."""
    leaves: list[Leaf] = []
    _leaf_specs(spec, leaves)
    sizes = {INT64: 0, FLOAT64: 0}
    for leaf in leaves:
        sizes[leaf.acc] += leaf.numel
    return sizes


def pack(values: list[Any], spec: Spec) -> dict[str, Any]:
    """The element-wise sum of `values` (all of `spec`) as flat int64/float64 CPU tensors.

    With no values, zero buffers: a process that holds no contributing result still takes
    part in the all-reduce.
    """
    import torch

    sizes = buffer_sizes(spec)
    buffers = {
        INT64: torch.zeros(sizes[INT64], dtype=torch.int64),
        FLOAT64: torch.zeros(sizes[FLOAT64], dtype=torch.float64),
    }
    for value in values:
        leaves: list[tuple[Leaf, Any]] = []
        _leaves(value, spec, leaves)
        offsets = {INT64: 0, FLOAT64: 0}
        for leaf, item in leaves:
            dtype = torch.int64 if leaf.acc == INT64 else torch.float64
            if leaf.kind == "torch":
                flat = item.detach().to("cpu", dtype).reshape(-1)
            else:
                flat = torch.as_tensor(np.asarray(item), dtype=dtype).reshape(-1)
            start = offsets[leaf.acc]
            buffers[leaf.acc][start : start + leaf.numel] += flat
            offsets[leaf.acc] = start + leaf.numel
    return buffers


def unpack(buffers: dict[str, Any], spec: Spec, op: str, count: int, device: Any = None) -> Any:
    """The reduced value from summed `buffers`: the sum, or the sum divided by `count` (mean).

    Types follow what core's collectors return for the same inputs. `device` is where tensor
    leaves are placed (default: the device type they came from, current index).
    """
    offsets = {INT64: 0, FLOAT64: 0}

    def build(node: Spec) -> Any:
        if isinstance(node, Node):
            parts = [build(c) for c in node.children]
            if node.kind == "dict":
                return dict(zip(node.keys, parts, strict=True))
            tuple_type = node.tuple_type or tuple
            if hasattr(tuple_type, "_fields"):
                return tuple_type(*parts)
            return tuple_type(parts)
        start = offsets[node.acc]
        offsets[node.acc] = start + node.numel
        flat = buffers[node.acc][start : start + node.numel]
        value = _leaf_value(node, flat, device)
        return value / count if op == "mean" else value

    return build(spec)


def _leaf_value(leaf: Leaf, flat: Any, device: Any) -> Any:
    """One leaf from its slice of a summed buffer (a CPU tensor, or a numpy array)."""
    if leaf.kind == "int":
        return int(flat[0])
    if leaf.kind == "float":
        return float(flat[0])
    if leaf.kind == "numpy":
        values = flat if isinstance(flat, np.ndarray) else flat.numpy()
        array = values.astype(np.dtype(leaf.dtype)).reshape(leaf.shape)
        return array[()] if leaf.shape == () else array
    if isinstance(flat, np.ndarray):
        import torch

        flat = torch.from_numpy(np.ascontiguousarray(flat))
    target = device if device is not None else leaf.device_type
    return flat.reshape(leaf.shape).to(dtype=leaf.dtype).to(target)


# --------------------------------------------------------------------- small results inline
_KEYS: dict[Spec, int] = {}


def spec_key(spec: Spec) -> int:
    """A 63-bit fingerprint of what `same_spec` compares, the same in every process (never 0).

    Two processes reduce together only results whose keys are equal; the device a tensor
    lives on is not part of it, as in `same_spec`.
    """
    key = _KEYS.get(spec)
    if key is None:
        digest = hashlib.blake2b(_describe(spec).encode(), digest_size=8).digest()
        key = (int.from_bytes(digest, "little") >> 1) or 1
        if len(_KEYS) < 4096:
            _KEYS[spec] = key
    return key


def _describe(spec: Spec) -> str:
    if isinstance(spec, Leaf):
        return f"L({spec.kind},{spec.dtype},{spec.shape},{spec.acc})"
    tuple_type = (
        ""
        if spec.tuple_type is None
        else (f"{spec.tuple_type.__module__}.{spec.tuple_type.__qualname__}")
    )
    children = ",".join(_describe(c) for c in spec.children)
    return f"N({spec.kind},{spec.keys!r},{tuple_type},[{children}])"


def flat_numbers(value: Any, spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    """`value` (of `spec`) as one flat int64 and one flat float64 numpy array."""
    sizes = buffer_sizes(spec)
    if isinstance(spec, Leaf) and spec.kind in ("int", "float"):
        number = np.array([value], dtype=np.int64 if spec.acc == INT64 else np.float64)
        empty = np.zeros(0, dtype=np.float64 if spec.acc == INT64 else np.int64)
        return (number, empty) if spec.acc == INT64 else (empty, number)
    out = {INT64: np.zeros(sizes[INT64], np.int64), FLOAT64: np.zeros(sizes[FLOAT64], np.float64)}
    offsets = {INT64: 0, FLOAT64: 0}
    leaves: list[tuple[Leaf, Any]] = []
    _leaves(value, spec, leaves)
    for leaf, item in leaves:
        if leaf.kind == "torch":  # bfloat16 & co have no numpy dtype: convert in torch
            import torch

            wide = torch.int64 if leaf.acc == INT64 else torch.float64
            item = item.detach().to("cpu", wide).reshape(-1).numpy()
        start = offsets[leaf.acc]
        out[leaf.acc][start : start + leaf.numel] = np.asarray(item).reshape(-1)
        offsets[leaf.acc] = start + leaf.numel
    return out[INT64], out[FLOAT64]


def unpack_sums(ints: np.ndarray, floats: np.ndarray, spec: Spec, op: str, count: int) -> Any:
    """`unpack` for sums held in numpy arrays (small results summed without an all-reduce)."""
    return unpack({INT64: ints, FLOAT64: floats}, spec, op, count)

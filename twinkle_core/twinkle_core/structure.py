"""Walking nested results (dicts per key, tuples element-wise) for the built-in collectors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def combine(values: Sequence[Any], leaf: Callable[[list[Any]], Any]) -> Any:
    """Apply `leaf` to matching leaves of `values`: dicts per key, tuples element-wise."""
    first = values[0]
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        keys = list(first)
        if any(set(v) != set(keys) for v in values):
            raise ValueError("cannot collect dict results whose keys differ between workers")
        return {k: combine([v[k] for v in values], leaf) for k in keys}
    if isinstance(first, tuple) and all(
        isinstance(v, tuple) and len(v) == len(first) for v in values
    ):
        parts = [combine([v[i] for v in values], leaf) for i in range(len(first))]
        return type(first)(*parts) if is_namedtuple(first) else tuple(parts)
    return leaf(list(values))


def torch_module(value: Any) -> Any | None:
    """The torch module when `value` is a torch object; never imports torch itself."""
    if type(value).__module__.split(".", 1)[0] == "torch":
        import sys

        return sys.modules.get("torch")
    return None


def is_array_like(value: Any) -> bool:
    """Numpy arrays, torch tensors and alike: sliceable along dim 0 and having a shape."""
    shape = getattr(value, "shape", None)
    return shape is not None and hasattr(value, "__getitem__") and len(tuple(shape)) > 0

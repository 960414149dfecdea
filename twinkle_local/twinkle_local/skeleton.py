"""A result split into its tensors and a skeleton that says where they go back.

Transports that move tensors outside pickling (torch.distributed broadcasts under torchrun,
point-to-point sends and Ray Direct Transport on Ray) send the tensors raw and the skeleton as
small bytes, then `fill` puts the received tensors back. One copy for both backends, so a
result takes a transport on the same terms under torchrun and on Ray.

What a skeleton can stand for: torch tensors (dense, not requiring grad: a received tensor
could not keep its autograd link, so those keep the pickled path), alone or inside dicts,
OrderedDicts, lists and tuples, beside plain values (None, bools, numbers, strings, small
bytes). Anything else raises `NotTensors`, and the result keeps its usual path.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

from twinkle_core.plugin import AUTO

#: Values a skeleton keeps as they are.
_PLAIN = (type(None), bool, int, float, str)

#: Bytes kept in a skeleton up to this size (larger ones are payload, not description).
_SMALL_BYTES = 1024


class Slot:
    """Where tensor `index` of a split result goes back in."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (Slot, (self.index,))


class NotTensors(Exception):
    """The value holds something a skeleton cannot stand for (the message says what)."""


def split(value: Any, tensors: list[Any]) -> Any:
    """`value` with every tensor replaced by a `Slot` (the tensors appended to `tensors`, in
    slot order); raises `NotTensors` for anything a skeleton cannot stand for."""
    torch = sys.modules.get("torch")
    if torch is None:  # no tensor was ever made in this process
        raise NotTensors("no torch tensors (torch is not imported)")
    return _split(value, tensors, torch.Tensor, torch.strided)


def _split(value: Any, tensors: list[Any], tensor_type: type, strided: Any) -> Any:
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        return kind((k, _split(v, tensors, tensor_type, strided)) for k, v in value.items())
    if kind is list or kind is tuple:
        return kind(_split(v, tensors, tensor_type, strided) for v in value)
    if kind is tensor_type:
        if value.requires_grad or value.layout != strided or value.is_quantized:
            raise NotTensors("tensors that require grad, sparse or quantized")
        tensors.append(value)
        return Slot(len(tensors) - 1)
    if kind in _PLAIN or (kind is bytes and len(value) < _SMALL_BYTES):
        return value
    raise NotTensors(f"a {kind.__name__}")


def fill(skeleton: Any, tensors: list[Any]) -> Any:
    """The result `skeleton` was split from, with `tensors` back in their slots."""
    kind = type(skeleton)
    if kind is Slot:
        return tensors[skeleton.index]
    if kind is dict or kind is OrderedDict:
        return kind((k, fill(v, tensors)) for k, v in skeleton.items())
    if kind is list or kind is tuple:
        return kind(fill(v, tensors) for v in skeleton)
    return skeleton


def why_not_carried(requested: str, reason: NotTensors | None = None) -> str | None:
    """Why a result stays on the usual path although transport `requested` was named for it
    (logged once per method and reason; None under `auto`, which names nothing); `reason` is
    what `split` raised, None for a result without tensors."""
    if requested == AUTO:
        return None
    holds = str(reason) if reason is not None and str(reason) else "no tensors"
    return (
        f"transport {requested!r} moves torch tensors (alone or in dicts, lists and tuples of "
        f"them, with plain numbers and strings beside them); this result holds {holds}"
    )

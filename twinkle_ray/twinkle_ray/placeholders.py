"""Stand-ins for a LazyCollect argument: what a producer's results collect to, built on the
driver from the replies alone, so that the consumers fetch the results themselves.

A LazyCollect handed to another group (`RayWorkerGroup.resolve_argument`) would otherwise be
collected on the driver: every producer result fetched there and shipped again to the
consumers. `build_placeholder` builds, from the producer's replies (small results, and the
envelopes of large ones), a value shaped like `collector.collect(results, mesh)` whose dicts,
lists and tuples are real and whose leaves are `transfer`'s remote placeholders over the
results in the object store: dispatchers walk and slice it like the value, and each consumer
worker fetches only the results its share needs. Collectors and structures a stand-in cannot
follow exactly get None, and the driver collects as before.
"""

from __future__ import annotations

from typing import Any

import ray

from twinkle_core import DeviceMesh
from twinkle_core.plugin import (
    BUILTIN_DISPATCHERS,
    ConcatCollector,
    FirstCollector,
    FlattenCollector,
    LastPPCollector,
    MeanCollector,
    NoneCollector,
    SumCollector,
    combine,
    flatten_lists,
)

from .transfer import (
    RemoteArray,
    RemoteCollected,
    RemoteStacked,
    RemoteValue,
    Stored,
    has_unknown,
    mirror,
    tree_of,
)
from .transports import Held

#: Dispatchers known to treat a stand-in exactly like the value (dicts, lists and tuples
#: walked or split, arrays only measured and sliced along dim 0).
PLACEHOLDER_DISPATCHERS = tuple(type(d) for d in BUILTIN_DISPATCHERS.values())
_ALL = type(BUILTIN_DISPATCHERS["all"])


class _Fallback(Exception):
    """A collected value no placeholder can stand for: it is collected on the driver."""


#: Collectors whose value placeholders can stand for (exactly these classes: a subclass may
#: collect differently).
_STRUCTURAL = (NoneCollector, FirstCollector, LastPPCollector, FlattenCollector)
_REDUCING = (SumCollector, MeanCollector)
_SELECTING = (NoneCollector, FirstCollector, LastPPCollector)


def build_placeholder(
    collector: Any,
    mesh: DeviceMesh,
    refs: list[ray.ObjectRef],
    replies: list[Any],
    dispatcher: Any = None,
) -> Any | None:
    """A stand-in for `collector.collect(results, mesh)` that dispatchers treat the same way:
    the collected value's dicts, lists and tuples are real, its arrays are `RemoteArray`s
    (sliceable along dim 0) and other leaves `RemoteValue`s, over the producer's results in the
    object store (`refs`: the replies' refs; `replies`: what they hold, envelopes unopened).
    With `dispatch='all'` (when the caller names it) one `RemoteCollected` does: nobody slices.
    None when no placeholder can stand for it (a custom collector, an unusual structure, or
    values the collector could not combine): the driver collects it then, and raises what the
    collector raises."""
    kind = type(collector)
    if kind not in _STRUCTURAL and kind not in _REDUCING and kind is not ConcatCollector:
        return None
    if not replies:
        return None
    used = collector.used_results(mesh, len(replies))
    if type(dispatcher) is _ALL and kind in _SELECTING:
        # Every consumer gets the whole value: collect it on the consumer, whatever its shape
        # (these collectors only pick results, so they cannot fail there instead of here).
        slots: list[Any] = [None] * len(replies)
        for i in used:
            reply = replies[i]
            slots[i] = reply.ref if type(reply) is Stored else refs[i]  # Held: the reply
        return RemoteCollected(slots, collector, mesh)
    mirrors: list[Any] = [None] * len(replies)
    for i in used:
        reply = replies[i]
        if type(reply) is Stored:
            tree, ref = reply.meta.tree, reply.ref  # the stored result itself: one hop less
        elif type(reply) is Held:
            tree, ref = reply.meta.tree, refs[i]  # the consumer receives it (transports.py)
        else:
            tree, ref = tree_of(reply), refs[i]
        if has_unknown(tree):
            return None
        mirrors[i] = mirror(tree, ref)
    try:
        if kind in _STRUCTURAL:
            return collector.collect(mirrors, mesh)
        reps = [mirrors[i] for i in used]
        if kind is ConcatCollector:
            return combine(reps, _concat_placeholders)
        return combine(reps, lambda values: _reduce_placeholders(values, collector))
    except Exception:  # _Fallback, or the collector would fail: let the driver raise it
        return None


def _concat_placeholders(values: list) -> Any:
    """`concat` of one leaf of every shard, as core's collector does it (a leaf that is an
    array of one kind for all shards, a list, or a plain value per shard)."""
    first = values[0]
    if isinstance(first, list):
        return flatten_lists(values)
    if isinstance(first, RemoteArray) and all(
        isinstance(v, RemoteArray)
        and v.reduce is None
        and (v.kind, v.dtype, v.inner, v.path) == (first.kind, first.dtype, first.inner, first.path)
        for v in values
    ):
        parts = [part for v in values for part in v.parts]
        return RemoteArray(parts, first.kind, first.path, first.inner, first.dtype)
    if isinstance(first, RemoteValue) and all(
        isinstance(v, RemoteValue) and v.path == first.path for v in values
    ):
        return RemoteStacked([v.ref for v in values], ConcatCollector(), first.path)
    raise _Fallback


def _reduce_placeholders(values: list, collector: Any) -> Any:
    """`sum`/`mean` of one leaf of every shard, computed by the consumer (on only its share
    when the result is an array that `slice_dp` slices)."""
    first = values[0]
    if isinstance(first, RemoteArray) and all(
        isinstance(v, RemoteArray)
        and v.reduce is None
        and len(v.parts) == 1
        and (v.kind, v.dtype, v.shape, v.path) == (first.kind, first.dtype, first.shape, first.path)
        for v in values
    ):
        parts = [v.parts[0] for v in values]
        return RemoteArray(parts, first.kind, first.path, first.inner, first.dtype, collector)
    if isinstance(first, RemoteValue) and all(
        isinstance(v, RemoteValue) and v.path == first.path for v in values
    ):
        return RemoteCollected([v.ref for v in values], collector, None, first.path)
    raise _Fallback  # lists and the like: the collector refuses them (core's `_check_addable`)

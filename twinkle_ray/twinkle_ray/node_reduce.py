"""Summing a relayed call's large results node by node, in rank order (`collect='sum'` and
`'mean'`).

A worker's large result stays in its node's object store (`transfer.Stored`). Collected on
the driver, a sum fetches every one of them there. When the call went through per-node relays
(`relay.py`), the sum is taken where the results are instead: the relay of the node holding
the first results fetches them from its own node's store and adds them, hands its sum to the
relay of the node holding the next ones, which adds its own, and so on; the driver fetches the
last node's sum alone. Each node's relay works on a thread of its own (`NodeRelay.run_local`),
so the calls it hands on are not held up.

The sum is the same one, bit for bit, as the driver's and as every other mode's: core's
collectors add the results one after another in rank order (`((r0 + r1) + r2) + ...`), and
the chain adds them in that very order, each node carrying on from the sum it was handed
(a tree of per-node sums would add in another order, which changes a float sum's last bits).
`mean` is that sum divided by the count, on the driver, as core's collector divides it.

Used only where it saves something and can change nothing: core's own `sum` and `mean`
collectors (not subclasses, not custom collectors), every result they read left in the object
store, and a chain that moves fewer results between nodes than the driver fetching every one
would (three or more results on a node, or two on several nodes: `chain_saves`). Anything
else, and a chain that fails on the way (a relay gone, results that do not add), is collected
on the driver as before, which raises what the driver path raises.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import numpy as np
import ray
import ray.exceptions as rex

from twinkle_core import CallTimeoutError, DeviceMesh
from twinkle_core.plugin import Collector, MeanCollector, SumCollector, combine

from .relay import RelayedRefs
from .transfer import Stored, register_tensor_serializer

#: What `reduce_per_node` returns when the call is collected on the driver instead.
NOT_REDUCED: Any = object()

#: Calls summed node by node in this process (read by tests and diagnostics).
_counts = {"reduced": 0}
_counts_lock = threading.Lock()


def reduced_calls() -> int:
    """How many calls this process has summed node by node so far."""
    return _counts["reduced"]


def node_runs(nodes: list[Any]) -> list[tuple[Any, int, int]]:
    """`(node, start, stop)` for each run of equal entries of `nodes` (the node of each result
    the collector reads, in the order it adds them): the results a node adds in one step."""
    runs: list[tuple[Any, int, int]] = []
    start = 0
    for node, same in itertools.groupby(nodes):
        stop = start + sum(1 for _ in same)
        runs.append((node, start, stop))
        start = stop
    return runs


def sum_step(values: list[Any]) -> Any:
    """On a relay: `values` (the sum so far, unless this is the first step, then results
    fetched from this node's object store) added in order, as core's `sum` collector adds."""
    register_tensor_serializer()  # a tensor sum goes back as a numpy buffer, not a pickle
    return SumCollector().collect(values, None)


def reduce_per_node(
    call: Any, collector: Collector, device_mesh: DeviceMesh | None, timeout: float | None
) -> Any:
    """`call`'s collected value, summed node by node; `NOT_REDUCED` when the driver should
    collect it as usual (see the module's docstring). Raises the call's failures as `wait`
    does, and `CallTimeoutError` when the chain does not finish within `timeout`."""
    kind = type(collector)
    refs = call.value_refs
    if (kind is not SumCollector and kind is not MeanCollector) or type(refs) is not RelayedRefs:
        return NOT_REDUCED
    deadline = None if timeout is None else time.monotonic() + timeout
    replies = call.wait_replies(timeout)
    used = collector.used_results(device_mesh, len(replies))
    if len(used) < 2 or any(type(replies[i]) is not Stored for i in used):
        return NOT_REDUCED
    nodes = [call.workers.node_of(call.ranks[i]) for i in used]
    if not chain_saves(nodes, _driver_node()):
        return NOT_REDUCED
    route = refs.route
    partial: Any = None
    try:
        for _, start, stop in node_runs(nodes):
            relay = route.relays[route.where[call.ranks[used[start]]][0]]
            # The sum so far goes inside the list, fetched by the relay itself: as a task's
            # own argument, the driver would wait for it before sending the task on.
            step = [replies[i].ref for i in used[start:stop]]
            if partial is not None:
                step.insert(0, partial)
            partial = relay.run_local.remote(sum_step, step)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        total = ray.get(partial, timeout=left)
    except rex.GetTimeoutError:
        raise CallTimeoutError(
            f"{call.workers.class_name}.{call.method} on group {call.workers.group.name!r}: "
            f"its results could not be summed within {timeout:g}s"
        ) from None
    except Exception:
        return NOT_REDUCED  # a relay gone, or results that do not add: as on the driver
    with _counts_lock:
        _counts["reduced"] += 1
    if kind is MeanCollector:
        count = len(used)
        return combine([total], lambda values: values[0] / count)
    return combine([total], _owned)


def chain_saves(nodes: list[Any], here: Any) -> bool:
    """Whether a chain over results on `nodes` (each result's node, in the order they are
    added) moves fewer of them between nodes than the driver, on node `here`, fetching every
    one would: one per node after the first, and the last node's sum to the driver unless
    they share a node; against one per result on another node than the driver's. With one
    or two results per node the chain would only add hops."""
    if not nodes:
        return False
    fetched = sum(1 for node in nodes if node != here)
    chained = len(node_runs(nodes)) - 1 + (nodes[-1] != here)
    return chained < fetched


def _driver_node() -> str | None:
    """This process's node id (asked once per process)."""
    if not _here:
        _here.append(ray.get_runtime_context().get_node_id())
    return _here[0]


_here: list[str] = []


def _owned(values: list[Any]) -> Any:
    """The driver's own copy of a fetched array or tensor. `ray.get` gives read-only views of
    the object store, which go bad once the process leaves Ray; the driver's own sum is a new,
    writable array, and so must this one be (one copy, at memory speed)."""
    value = values[0]
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value).__module__.split(".", 1)[0] == "torch" and hasattr(value, "clone"):
        return value.clone()
    return value

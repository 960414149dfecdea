"""Waits that say what they wait for: placement groups that Ray has not placed yet.

While the run's placement groups are pending, every `interval` seconds (default 10,
`TWINKLE_WAIT_LOG_INTERVAL` to change it) a line is logged under `twinkle.ray.placement`
naming each group still waiting, what it needs and what the nodes have free, e.g.

    waiting for placement of group 'model': need 4 GPU + 2 CPU on one node (node 0 of
    'cuda'), free: node 10.0.0.1/3f2a9c1e 2 GPU 8 CPU, node 10.0.0.2/77b0e1d2 0 GPU 16 CPU
    (12 s of placement_timeout=300 s)
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

import ray

from twinkle_core.plugin import waiting_for

log = logging.getLogger("twinkle.ray.placement")

#: Seconds between two log lines while placement is pending.
DEFAULT_INTERVAL_S = 10.0
INTERVAL_ENV = "TWINKLE_WAIT_LOG_INTERVAL"


def interval() -> float:
    """The log interval: `TWINKLE_WAIT_LOG_INTERVAL` seconds when set and positive, else 10."""
    raw = os.environ.get(INTERVAL_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            log.warning("twinkle: %s=%r is not a number of seconds; using 10", INTERVAL_ENV, raw)
            return DEFAULT_INTERVAL_S
        if value > 0:
            return value
    return DEFAULT_INTERVAL_S


def _amount(value: float) -> str:
    return f"{value:g}"


def _need(pg: Any) -> str:
    bundles = pg.bundle_specs
    if len(bundles) == 1:
        parts = [f"{_amount(v)} {k}" for k, v in bundles[0].items()]
        return f"need {' + '.join(parts)} on one node"
    first = bundles[0]
    if all(b == first for b in bundles):
        parts = " + ".join(f"{_amount(v)} {k}" for k, v in first.items())
        return f"need {len(bundles)} x ({parts})"
    return f"need bundles {bundles}"


def free_text(resources: tuple[str, ...]) -> str:
    """What each live node has free of `resources` (its CPUs and accelerators by default)."""
    from ray._private import state

    try:
        free = state.available_resources_per_node()
        nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    except Exception as exc:  # the status is a help; never fail the wait on it
        return f"(free resources unknown: {exc})"
    parts = []
    for node_id, node in sorted(nodes.items(), key=lambda kv: kv[1].get("NodeManagerAddress", "")):
        have = free.get(node_id, {})
        shown = [r for r in resources if r in node.get("Resources", {})]
        label = f"{node.get('NodeManagerAddress', '?')}/{node_id[:8]}"
        parts.append(f"node {label} " + " ".join(f"{_amount(have.get(r, 0.0))} {r}" for r in shown))
    return ", ".join(parts) if parts else "no live nodes"


def describe(pg: Any, groups: list[str], what: str) -> str:
    """`group 'model'` (or several) and what its placement group needs."""
    names = ", ".join(repr(g) for g in groups) or "?"
    label = "group" if len(groups) == 1 else "groups"
    return f"{label} {names}: {_need(pg)}" + (f" ({what})" if what else "")


def descriptions(manager: Any, ready_refs: dict[Any, Any]) -> dict[Any, str]:
    """What each placement group of a `ResourceManager` is for, by its ready ref."""
    by_pg: dict[int, str] = {}
    groups = getattr(manager, "groups", {})
    for dt, reservations in getattr(manager, "reservations", {}).items():
        users = [g.name for g in groups.values() if g.device_type == dt and not g.is_cpu]
        for r in reservations:
            what = f"node {r.node_index} of {dt!r} on {r.node.label}"
            by_pg[id(r.pg)] = describe(r.pg, users, what)
    for name, pg in getattr(manager, "cpu_pgs", {}).items():
        by_pg[id(pg)] = describe(pg, [name], "")
    return {ref: by_pg.get(id(pg), _need(pg)) for ref, pg in ready_refs.items()}


def wait_for_placement(
    manager: Any,
    ready_refs: dict[Any, Any],
    timeout: float,
    *,
    every: float | None = None,
) -> tuple[list[Any], list[Any]]:
    """`ray.wait` on the placement groups' ready refs, at most `timeout` s, logging every
    `every` s (default `interval()`) which ones still wait, what they need and what is free.

    `manager` is the `ResourceManager` whose groups these are. Returns `(ready, missing)` as
    `ray.wait` does.
    """
    describe_ref = descriptions(manager, ready_refs)
    # Each description starts "group 'a': ..." or "groups 'a', 'b': ...".
    names = sorted(
        {g for text in describe_ref.values() for g in _GROUP.findall(text.split(":")[0])}
    )
    # On a terminal, the status line shows it too (it logs nothing itself: the lines below do).
    with waiting_for(
        f"placement of {', '.join(names) or 'the groups'} (placement_timeout={timeout:g} s)",
        log=False,
    ):
        return _wait(ready_refs, describe_ref, timeout, interval() if every is None else every)


_GROUP = re.compile(r"'[^']*'")


def _wait(
    ready_refs: dict[Any, Any], describe_ref: dict[Any, str], timeout: float, step: float
) -> tuple[list[Any], list[Any]]:
    refs = list(ready_refs)
    start = time.monotonic()
    deadline = start + timeout
    while True:
        left = deadline - time.monotonic()
        ready, missing = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(step, left)))
        if not missing or time.monotonic() >= deadline:
            return ready, missing
        resources = sorted(
            {k for ref in missing for b in ready_refs[ref].bundle_specs for k in b},
            key=lambda r: (r == "CPU", r),
        )
        free = free_text(tuple(resources))
        waited = time.monotonic() - start
        for ref in missing:
            log.warning(
                "waiting for placement of %s, free: %s (%.0f s of placement_timeout=%g s)",
                describe_ref[ref],
                free,
                waited,
                timeout,
            )

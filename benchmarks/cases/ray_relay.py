"""23. Relays (`twinkle_ray/relay.py`): what one call to a group spread over several nodes
costs the driver, through relays, without, and in plain Ray.

One call with a small argument (`{"step": 3, "lr": 0.1}`, `dispatch='all'`) to W CPU workers
spread evenly over K simulated nodes (W/K per node), for W in 8, 16, 32 and K in 1, 2, 4; each
worker's method returns `time.time_ns()` taken when it starts. Variants:

- relay: twinkle with its defaults (`relay_min_nodes=2`, `relay_fanout=8`): the K nodes form one
  branch, so the driver sends one task per call, to the first node's relay, which hands each
  other node's share to that node's relay and submits its own node's tasks; each relay returns
  its node's replies, the first returns them all;
- per-node relays (run C, K >= 2): twinkle with `relay_fanout=1`: one task per node from the
  driver, to that node's relay;
- direct: twinkle with `relay_min_nodes=0`: one task per worker from the driver;
- raw: plain Ray, one actor per worker pinned to the twinkle workers' nodes, as many on each
  (`NodeAffinitySchedulingStrategy`), `ray.get([a.stamp.remote(arg) for a in actors])`;
- raw relay and raw tree (run A, in each row's note): the same raw actors behind a plain-Ray
  relay per node (`RawRelay`, an async actor with no CPU on that node, gathering its actors'
  replies into one list), one task per node from the driver; and the same relays as a tree
  (K >= 2: one task from the driver to the first node's, which hands the others theirs): what
  those shapes cost with nothing of twinkle's around them, the floors for twinkle's on this
  machine.

At 8 workers on 4 nodes each run also times a failure (`_failfast`): the last rank (on the
last node, the one a branch's first relay hands the call on to) raises at once while the others
sleep, from the call until the caller catches it, against a hand-made fail-fast on the raw
actors (`ray.wait` for one, `ray.get` it, as case 7); the issue bounds it at 50 ms.

At 8 workers on 2 and on 4 nodes each run also times a reduction (`_sums`): one
`collect='mean'` call of every worker's 1 MiB float32 array. Through relays, each node's relay
adds its workers' arrays and hands the sum on to the next node's, in rank order, and the
driver fetches the last sum alone (`twinkle_ray/node_reduce.py`); direct, the driver fetches
and adds all of them; raw Ray does the same by hand (`ray.get` of every array, added in rank
order, divided): the same bits on every side, checked once per run. Its row is the driver's
CPU per call, relay against raw, with the wall times in the note.

Per call: the driver's CPU time (`time.process_time()` of the driver process around a batch of
calls waited for one by one, over the batch's size; it includes Ray's core-worker threads in
the driver), the wall time, and the skew (latest minus earliest start of the call's W
methods; the median over the calls). Each row's ratio is twinkle's driver CPU over raw Ray's.
The shapes cannot be live in one `initialize`, so per (W, K) there are two or three runs, each
interleaving its twinkle variant with the same raw actors: run A is relay + raw (+ the raw
relay and tree), run B direct + raw, run C per-node relays + raw; each twinkle/raw ratio uses
the raw of its own run (every raw figure is in the notes). At K=1 the default sends calls
straight to the workers (a single node is below `relay_min_nodes=2`), so the K=1 row is direct
vs raw (relay "n/a") and run A uses `relay_min_nodes=1` instead, reported in a row of its own:
what a relay costs on one node.

Fair: the same method body, argument, worker count and nodes on both sides, the same cluster,
alternated in rounds (`harness.interleave`) so both see the same machine load; the twinkle
workers and raw actors of a (W, K) are started before timing and warmed up.

Not a real cluster, and the notes say so: one Ray cluster of 4 simulated nodes
(`ray.cluster_utils.Cluster`, 2 logical CPUs each), started once in a child process, and all of
them share this machine's cores. The driver CPU is the driver's own, as on a real cluster, but
wall time and skew measure the total CPU of every process (relays and workers of all nodes,
on the same 2 cores), not the critical path of a real cluster, where each node's relay and
workers run on their own machine.

Placement: a CPU group is one Ray placement group of W bundles (`cpus_per_worker` each,
strategy PACK); `nproc_per_node` places only accelerator groups. So every node declares
2 CPUs and each worker reserves 2*K/W: the W bundles fill exactly K nodes, W/K on each (each
run checks the workers' node ids, and that the expected relays were started). The raw actors
reserve no CPU (the twinkle group holds the nodes' CPUs; logical CPUs are bookkeeping here),
the relays neither (as twinkle starts them).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    BENCH_DIR,
    Context,
    Row,
    child_env,
    emit,
    fmt_time,
    interleave,
    median,
    raw_fail_fast,
    remove_soon,
    run_child,
)

from twinkle_core import remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "23", "ray-relay", False, ()

#: Simulated nodes, and the logical CPUs each declares.
NODES, NODE_CPUS = 4, 2
ARG = {"step": 3, "lr": 0.1}
#: The case's target (issue): relay driver CPU at most 0.35x raw Ray's at 4 nodes x 8 workers.
TARGET = 0.35


class RawRelay:
    """A relay per node in plain Ray: submit to this node's actors, return their replies;
    given `peers` (the other nodes' relays), `tree` also hands each of them the call and
    returns every node's replies in one list."""

    def __init__(self, actors: list[Any], peers: list[Any] = ()) -> None:
        self.actors = actors
        self.peers = list(peers)

    async def fanout(self, value: Any) -> list[int]:
        import asyncio

        return list(await asyncio.gather(*[a.stamp.remote(value) for a in self.actors]))

    async def tree(self, value: Any) -> list[int]:
        import asyncio

        peers = [p.fanout.remote(value) for p in self.peers]
        got = await asyncio.gather(*[a.stamp.remote(value) for a in self.actors], *peers)
        out = list(got[: len(self.actors)])
        for stamps in got[len(self.actors) :]:
            out.extend(stamps)
        return out


class RawStamp:
    def stamp(self, value: Any) -> int:
        return time.time_ns()

    def fail_last(self, rank: int, last: int, seconds: float) -> int:
        """The last rank (on the last node) raises at once; the others sleep `seconds`."""
        if rank == last:
            raise RuntimeError("the last rank fails at once (benchmark)")
        time.sleep(seconds)
        return rank

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def grad_of(self, rank: int) -> Any:
        """Rank `rank`'s "gradient": `SUM_FLOATS` float32 numbers (1 MiB), the same on both
        sides, left in the object store by the worker (over twinkle's 100 KiB)."""
        import numpy as np

        return np.random.default_rng(rank).standard_normal(SUM_FLOATS).astype(np.float32)


@remote_class()
class Stamp(RawStamp):
    stamp = remote_function(dispatch="all", collect="none")(RawStamp.stamp)
    node = remote_function(dispatch="all", collect="none")(RawStamp.node)

    @remote_function(dispatch="all", collect="none")
    def fail(self, last: int, seconds: float) -> int:
        from twinkle_core import get_worker_context

        return RawStamp.fail_last(self, get_worker_context().rank, last, seconds)

    @remote_function(dispatch="all", collect="mean")
    def grad(self) -> Any:
        from twinkle_core import get_worker_context

        return RawStamp.grad_of(self, get_worker_context().rank)


#: Fail-fast (the config below only): the last rank fails at once, the others sleep this long.
FAIL_SLEEP = 0.5
FAIL_CONFIG = (8, 4)
#: Sums (`_sums`): each worker's result, in float32 numbers (8 MiB), and the configs timed.
SUM_FLOATS = 2 * 1024 * 1024
SUM_CONFIGS = ((8, 2), (8, 4))


def configs(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return [(8, 1), (8, 2)]
    return [(w, k) for w in (8, 16, 32) for k in (1, 2, 4)]


def run(ctx: Context) -> list[Row]:
    spec = {
        "configs": configs(ctx.quick),
        "rounds": 4 if ctx.quick else 10,
        # Calls per round: 20 with 8 workers, 10 with more (a call to 32 workers takes ~40 ms
        # of this machine's 2 cores); 200 or 100 calls per variant.
        "batch": {w: 10 if ctx.quick else max(10, 160 // w) for w in (8, 16, 32)},
        "warmup": 1,
    }
    result = run_child(
        [sys.executable, str(BENCH_DIR / "cases" / "ray_relay.py"), json.dumps(spec)],
        timeout=900,
        env=child_env(),
    )
    ctx.log(f"cluster start {result['cluster_s']:.1f} s")
    rows: list[Row] = []
    failfast_rows: list[Row] = []
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    for got in result["configs"]:
        w, k, a, b = got["W"], got["K"], got["A"], got["B"]
        c = got.get("C")
        # Where each figure comes from: (run, variant) per key of `med`, `wall` and `skew`.
        sources = {
            "relay": (a, "relay"),
            "rawA": (a, "raw"),
            "raw_relay": (a, "raw relay"),
            "direct": (b, "direct"),
            "rawB": (b, "raw"),
        }
        if c is not None:
            sources.update(
                {"per_node": (c, "per-node"), "rawC": (c, "raw"), "raw_tree": (a, "raw tree")}
            )
        med, wall, skew = (
            {key: median(run[metric][name]) for key, (run, name) in sources.items()}
            for metric in ("cpu", "wall", "skew")
        )
        samples = {
            f"{name} ({run_id})": got[run_id]["cpu"][name]
            for run_id, name in (
                (rid, variant) for rid in "ABC" if rid in got for variant in got[rid]["cpu"]
            )
        }
        extra = {
            "workers": w,
            "nodes": k,
            "driver_cpu_per_call_s": med,
            "wall_per_call_s": wall,
            "median_skew_s": skew,
            "relay_min_nodes_run_a": a["relay_min_nodes"],
            "relays_started": {rid: got[rid]["relays"] for rid in "ABC" if rid in got},
            "start_s": {rid: got[rid]["start_s"] for rid in "ABC" if rid in got},
            "raw_started_again": {rid: got[rid]["raw_started"] for rid in "BC" if rid in got},
            "calls_per_variant": len(a["skew"]["relay"]),
            "elapsed_s": got["elapsed_s"],
        }
        per_node = f"per-node relays {fmt_time(wall['per_node'])}, " if c is not None else ""
        raw_tree = f"raw tree {fmt_time(wall['raw_tree'])}, " if c is not None else ""
        shared = (
            f"wall/call: relay {fmt_time(wall['relay'])}, {per_node}direct "
            f"{fmt_time(wall['direct'])}, raw {fmt_time(wall['rawA'])} (A) / "
            f"{fmt_time(wall['rawB'])} (B), raw relay {fmt_time(wall['raw_relay'])}, {raw_tree}"
            f"median skew: relay {fmt_time(skew['relay'])}, direct {fmt_time(skew['direct'])}, "
            f"raw {fmt_time(skew['rawA'])} / {fmt_time(skew['rawB'])}; all {NODES} simulated "
            "nodes share this machine's cores: wall and skew are every process's CPU, not a "
            "real cluster's critical path"
        )
        direct_ratio = med["direct"] / med["rawB"]
        floor = (
            f"raw relay/raw {med['raw_relay'] / med['rawA']:.2f}x "
            f"(raw relay {fmt_time(med['raw_relay'])}, run A)"
        )
        if c is not None:
            floor = (
                f"raw tree/raw {med['raw_tree'] / med['rawA']:.2f}x (raw tree "
                f"{fmt_time(med['raw_tree'])}), {floor}; per-node relays/raw "
                f"{med['per_node'] / med['rawC']:.2f}x (per-node {fmt_time(med['per_node'])}, "
                f"raw of run C {fmt_time(med['rawC'])})"
            )
        if k == 1:
            rows.append(
                Row(
                    f"{NUMBER}{next(letters)}",
                    f"Ray relays: driver CPU per call, {w} workers on 1 node: twinkle direct "
                    "(relays n/a below 2 nodes) vs raw",
                    med["direct"],
                    med["rawB"],
                    unit="driver CPU per call",
                    note=f"relay n/a (relay_min_nodes=2, 1 node); raw from run B; {shared}",
                    extra=extra,
                    samples=samples,
                )
            )
            rows.append(
                Row(
                    f"{NUMBER}{next(letters)}",
                    f"Ray relays: driver CPU per call, {w} workers on 1 node through one relay "
                    "(relay_min_nodes=1) vs raw",
                    med["relay"],
                    med["rawA"],
                    unit="driver CPU per call",
                    note=(
                        f"what a relay costs on one node; raw from run A; direct/raw "
                        f"{direct_ratio:.2f}x (run B); {floor}; {shared}"
                    ),
                    extra=extra,
                    samples=samples,
                )
            )
            continue
        if "failfast" in a:
            fail = {
                "branch": a["failfast"]["relay"],
                "rawA": a["failfast"]["raw"],
                "direct": b["failfast"]["direct"],
                "rawB": b["failfast"]["raw"],
                **({"per_node": c["failfast"]["per-node"]} if c is not None else {}),
            }
            fmed = {key: median(values) for key, values in fail.items()}
            per_node_note = (
                f", per-node relays {fmt_time(fmed['per_node'])}" if "per_node" in fmed else ""
            )
            failfast_rows.append(
                Row(
                    "",
                    f"Ray relays: first failure to the caller, {w} workers on {k} nodes, the "
                    "last rank failing at once (issue: within 50 ms): twinkle through a branch "
                    "vs a hand-made raw fail-fast",
                    fmed["branch"],
                    fmed["rawA"],
                    unit="once",
                    note=(
                        f"others sleep {FAIL_SLEEP:g} s; raw from run A; direct "
                        f"{fmt_time(fmed['direct'])} (raw of run B {fmt_time(fmed['rawB'])})"
                        f"{per_node_note}; twinkle waits up to 20-40 ms more for ranks failing "
                        "together (`FAILURE_GRACE_SECONDS`), on every path"
                    ),
                    extra={"failfast_s": fail},
                    samples={name: values for name, values in fail.items()},
                )
            )
        target = f" (target <= {TARGET:g}x)" if (w, k) == (32, 4) else ""
        rows.append(
            Row(
                f"{NUMBER}{next(letters)}",
                f"Ray relays: driver CPU per call, {w} workers on {k} nodes ({w // k} each): "
                f"twinkle with relays (one branch) vs raw{target}",
                med["relay"],
                med["rawA"],
                unit="driver CPU per call",
                note=(
                    f"raw from run A (beside relay); {floor}; direct/raw {direct_ratio:.2f}x "
                    f"(direct {fmt_time(med['direct'])}, raw of run B {fmt_time(med['rawB'])}); "
                    f"{shared}"
                ),
                extra=extra,
                samples=samples,
            )
        )
    for got in result["configs"]:
        if "sums" in got["A"]:
            rows_sum = _sum_row(got)
            failfast_rows.append(rows_sum)
    for row in failfast_rows:  # after the CPU rows, whose letters stay as they were
        row.id = f"{NUMBER}{next(letters)}"
        rows.append(row)
    return rows


def _sum_row(got: dict[str, Any]) -> Row:
    """The row of a config's sums (`_sums`): the driver's CPU per call, twinkle through relays
    (summed node by node) against raw Ray summing on the driver; direct, per-node relays and
    wall times in the note."""
    w, k, a, b = got["W"], got["K"], got["A"], got["B"]
    c = got.get("C")
    wall = {"relay": a["sums"]["wall"]["relay"], "rawA": a["sums"]["wall"]["raw"]}
    wall.update({"direct": b["sums"]["wall"]["direct"], "rawB": b["sums"]["wall"]["raw"]})
    cpu = {"relay": a["sums"]["cpu"]["relay"], "rawA": a["sums"]["cpu"]["raw"]}
    cpu.update({"direct": b["sums"]["cpu"]["direct"], "rawB": b["sums"]["cpu"]["raw"]})
    if c is not None:
        wall.update({"per_node": c["sums"]["wall"]["per-node"], "rawC": c["sums"]["wall"]["raw"]})
        cpu.update({"per_node": c["sums"]["cpu"]["per-node"], "rawC": c["sums"]["cpu"]["raw"]})
    mw = {key: median(values) for key, values in wall.items()}
    mc = {key: median(values) for key, values in cpu.items()}
    per_node = (
        f"; per-node relays {fmt_time(mc['per_node'])} (raw of run C {fmt_time(mc['rawC'])})"
        if "per_node" in mc
        else ""
    )
    per_node_wall = (
        f", per-node relays {fmt_time(mw['per_node'])} / raw {fmt_time(mw['rawC'])}"
        if "per_node" in mw
        else ""
    )
    mib = SUM_FLOATS * 4 / 2**20
    return Row(
        "",
        f"Ray relays: collect='mean' of a {mib:g} MiB float32 array per worker, {w} workers on "
        f"{k} nodes: twinkle through relays (summed node by node) vs raw Ray (every array "
        "fetched, summed on the driver)",
        mc["relay"],
        mc["rawA"],
        unit="driver CPU per call",
        note=(
            f"the same bits on both sides (checked); the driver receives one sum ({mib:g} MiB) "
            f"through relays, {w} arrays ({w * mib:g} MiB) otherwise; raw from run A; direct "
            f"(fetched and summed on the driver, as raw) {fmt_time(mc['direct'])} (raw of run "
            f"B {fmt_time(mc['rawB'])}){per_node}; wall per call: relay {fmt_time(mw['relay'])}, "
            f"direct {fmt_time(mw['direct'])}, raw {fmt_time(mw['rawA'])} / "
            f"{fmt_time(mw['rawB'])}{per_node_wall}; all {NODES} simulated nodes share this "
            "machine's cores and memory: a hop between them is a copy, not a network transfer"
        ),
        extra={"wall_s": wall, "driver_cpu_s": cpu},
        samples=cpu,
    )


# ------------------------------------------------------------------------------- child
def _relay_count(run_name: str) -> int:
    """The relays twinkle started for run `run_name` (named `<run>:<group>:relay:...`)."""
    import ray.util

    return sum(
        1
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(f"{run_name}:") and ":relay:" in actor["name"]
    )


def _measure(
    variants: dict[str, Any], rounds: int, batch: int, warmup: int
) -> dict[str, dict[str, list[float]]]:
    """Interleave `variants` (each one call, returning the workers' start stamps): driver CPU
    and wall per call by round, and the skew of every call, in seconds."""
    walls: dict[str, list[float]] = {name: [] for name in variants}
    skews: dict[str, list[float]] = {name: [] for name in variants}

    def batched(name: str, call: Any) -> Any:
        def go() -> float:
            stamps = []
            cpu, start = time.process_time(), time.perf_counter()
            for _ in range(batch):
                stamps.append(call())
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            walls[name].append(elapsed / batch)
            skews[name].extend((max(s) - min(s)) / 1e9 for s in stamps)
            return cpu

        return go

    cpu = interleave(
        {name: batched(name, call) for name, call in variants.items()},
        rounds,
        per=batch,
        warmup=warmup,
    )
    return {
        "cpu": cpu,
        "wall": {name: values[warmup:] for name, values in walls.items()},
        "skew": {name: values[warmup * batch :] for name, values in skews.items()},
    }


def _failfast(group: Any, actors: list[Any], label: str, rounds: int) -> dict[str, list[float]]:
    """Seconds from a call to its first failure reaching the caller, the last rank (on the
    last node: through a branch, the node its first relay hands the call on to) failing at
    once while the others sleep: twinkle's `label` shape against a hand-made fail-fast on the
    raw actors (`ray.wait` for one, `ray.get` it, as case 7's raw side)."""
    import ray

    last = len(actors) - 1

    def settle() -> None:  # every worker idle again before the next round
        group.stamp(ARG)(60)
        ray.get([a.stamp.remote(ARG) for a in actors], timeout=60)

    def twinkle() -> float:
        settle()
        start = time.perf_counter()
        try:
            group.fail(last, FAIL_SLEEP)(60)
        except Exception as exc:
            if "the last rank fails" not in str(exc):
                raise
            return time.perf_counter() - start
        raise AssertionError("twinkle did not raise")

    def raw() -> float:
        settle()
        start = time.perf_counter()
        raw_fail_fast([a.fail_last.remote(r, last, FAIL_SLEEP) for r, a in enumerate(actors)])
        return time.perf_counter() - start

    samples = interleave({label: twinkle, "raw": raw}, rounds, warmup=1)
    settle()
    return samples


def _sums(group: Any, actors: list[Any], label: str, rounds: int) -> dict[str, Any]:
    """One `collect='mean'` call of every worker's 1 MiB float32 array, twinkle's `label`
    shape against raw Ray fetching every array and adding them on the driver in rank order
    (what core's collector does, so both give the same bits, checked once): wall and driver
    CPU per call, by round."""
    import numpy as np
    import ray

    def raw() -> Any:
        arrays = ray.get([a.grad_of.remote(r) for r, a in enumerate(actors)], timeout=120)
        total = arrays[0]
        for array in arrays[1:]:
            total = total + array
        return total / len(arrays)

    mine, theirs = group.grad()(120), raw()
    if mine.dtype != theirs.dtype or not np.array_equal(mine, theirs):
        raise AssertionError(f"{label}: the mean differs from the one summed on the driver")
    cpu: dict[str, list[float]] = {label: [], "raw": []}

    def timed(name: str, call: Any) -> Any:
        def go() -> None:
            start = time.process_time()
            call()
            cpu[name].append(time.process_time() - start)

        return go

    walls = interleave(
        {label: timed(label, lambda: group.grad()(120)), "raw": timed("raw", raw)},
        rounds,
        warmup=1,
    )
    return {"wall": walls, "cpu": {name: values[1:] for name, values in cpu.items()}}


def _config(me: Any, address: str, w: int, k: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Runs A (relay + raw), B (direct + raw) and, on several nodes, C (per-node relays +
    raw) on `w` workers over `k` nodes."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from twinkle_core import DeviceGroup, initialize, shutdown

    raw_cls = ray.remote(num_cpus=0)(me.RawStamp)
    relay_cls = ray.remote(num_cpus=0, max_concurrency=1000)(me.RawRelay)
    actors: list[Any] = []
    actor_nodes: list[str] = []
    out: dict[str, Any] = {"W": w, "K": k}
    try:
        runs = [("A", "relay", 1 if k == 1 else 2, 8), ("B", "direct", 0, 8)]
        if k > 1:
            runs.append(("C", "per-node", 2, 1))
        for run_id, label, min_nodes, fanout in runs:
            run_name = f"relay-bench-{w}x{k}-{label}"
            start = time.perf_counter()
            initialize(
                "ray",
                address=address,
                groups=[DeviceGroup("g", list(range(w)), "cpu")],
                cpus_per_worker=NODE_CPUS * k / w,
                relay_min_nodes=min_nodes,
                relay_fanout=fanout,
                name=run_name,
            )
            try:
                group = me.Stamp(remote_group="g")
                nodes = group.node()(300)
                twinkle_s = time.perf_counter() - start
                per_node = {n: nodes.count(n) for n in nodes}
                if sorted(per_node.values()) != [w // k] * k:
                    raise RuntimeError(
                        f"twinkle placed {w} workers as {sorted(per_node.values())} per node, "
                        f"not {w // k} on each of {k} nodes"
                    )
                relays = _relay_count(run_name)
                expected = k if min_nodes and k >= min_nodes else 0
                if relays != expected:
                    raise RuntimeError(
                        f"run {run_id} ({w} workers, {k} nodes, relay_min_nodes={min_nodes}): "
                        f"{relays} relay(s) started, expected {expected}"
                    )
                start = time.perf_counter()
                # The raw actors go where the twinkle workers are: started again for run B
                # only if its workers landed on other nodes than run A's.
                recreated = sorted(nodes) != sorted(actor_nodes)
                if recreated:
                    for actor in actors:
                        ray.kill(actor)
                    actors = [
                        raw_cls.options(
                            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                        ).remote()
                        for node in nodes
                    ]
                    got = ray.get([a.node.remote() for a in actors], timeout=300)
                    assert got == nodes, (got, nodes)
                    actor_nodes = nodes
                raw_s = time.perf_counter() - start

                def twinkle_call(group=group) -> list[int]:
                    return group.stamp(ARG)(120)

                def raw_call(actors=actors) -> list[int]:
                    return ray.get([a.stamp.remote(ARG) for a in actors], timeout=120)

                variants = {label: twinkle_call, "raw": raw_call}
                if run_id == "A":
                    by_node: dict[str, list[Any]] = {}
                    for actor, node in zip(actors, actor_nodes, strict=True):
                        by_node.setdefault(node, []).append(actor)
                    raw_relays = [
                        relay_cls.options(
                            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                        ).remote(members)
                        for node, members in by_node.items()
                    ]

                    def relayed_call(relays=tuple(raw_relays)) -> list[int]:
                        lists = ray.get([r.fanout.remote(ARG) for r in relays], timeout=120)
                        return [stamp for stamps in lists for stamp in stamps]

                    variants["raw relay"] = relayed_call
                    if k > 1:  # the same relays as a tree: the first hands the others theirs
                        node, members = next(iter(by_node.items()))
                        raw_relays.append(
                            relay_cls.options(
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                            ).remote(members, raw_relays[1:])
                        )

                        def tree_call(root=raw_relays[-1]) -> list[int]:
                            return ray.get(root.tree.remote(ARG), timeout=120)

                        variants["raw tree"] = tree_call
                for call in variants.values():
                    stamps = call()
                    assert len(stamps) == w and all(isinstance(s, int) for s in stamps), stamps
                measured = _measure(
                    variants,
                    spec["rounds"],
                    spec["batch"][str(w)],
                    spec["warmup"],
                )
                if (w, k) == FAIL_CONFIG:
                    measured["failfast"] = _failfast(group, actors, label, spec["rounds"])
                if (w, k) in SUM_CONFIGS:
                    measured["sums"] = _sums(group, actors, label, spec["rounds"])
                for relay in raw_relays if run_id == "A" else ():
                    ray.kill(relay)
            finally:
                shutdown()
            out[run_id] = {
                **measured,
                "relay_min_nodes": min_nodes,
                "relays": relays,
                "start_s": {"twinkle": twinkle_s, "raw": raw_s},
                "raw_started": recreated,
            }
    finally:
        for actor in actors:
            ray.kill(actor)
    return out


def child(spec: dict[str, Any]) -> None:
    import ray
    from ray.cluster_utils import Cluster

    import cases.ray_relay as me  # workers import the classes by this name
    from twinkle_core import shutdown

    # Cluster records its address in /tmp/ray/ray_current_cluster: put back what was there.
    address_file = Path("/tmp/ray/ray_current_cluster")
    previous = address_file.read_text() if address_file.exists() else None
    temp_dir = tempfile.mkdtemp(prefix="twb-relay-", dir="/tmp")  # short: Ray's socket paths
    cluster = None
    store = 100 * 1024 * 1024
    try:
        start = time.perf_counter()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": NODE_CPUS,
                "object_store_memory": store,
                "include_dashboard": False,
                "temp_dir": temp_dir,
            },
        )
        for _ in range(NODES - 1):
            cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=store)
        cluster.wait_for_nodes(timeout=120)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cluster_s = time.perf_counter() - start
        results = []
        for w, k in spec["configs"]:
            begin = time.perf_counter()
            results.append(_config(me, cluster.address, w, k, spec))
            results[-1]["elapsed_s"] = time.perf_counter() - begin
        emit({"cluster_s": cluster_s, "configs": results})
    finally:
        try:
            shutdown()
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            remove_soon(temp_dir)
            if previous is None:
                address_file.unlink(missing_ok=True)
            else:
                os.makedirs(address_file.parent, exist_ok=True)
                address_file.write_text(previous)


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))

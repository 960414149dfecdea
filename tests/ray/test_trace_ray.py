"""The call timeline and stack dumps on Ray: actors record, the driver merges and writes."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest
import ray.cloudpickle

import twinkle_core
from twinkle_core import (
    CallTimeoutError,
    DeviceGroup,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SLEEP = 0.3


def meet(directory: str | None, n: int) -> None:
    """Wait until all four workers of both groups have started round `n` (files in
    `directory`, on this one machine): the rounds' overlap then holds however loaded the
    machine is, and calls run one group after the other would never meet (the wait fails)."""
    if directory is None:
        return
    ctx = twinkle_core.get_worker_context()
    os.close(os.open(os.path.join(directory, f"{n}-{ctx.group_name}-{ctx.rank}"), os.O_CREAT))
    deadline = time.monotonic() + 120
    while len([f for f in os.listdir(directory) if f.startswith(f"{n}-")]) < 4:
        if time.monotonic() > deadline:
            raise RuntimeError(f"round {n}: the other group's call never started beside this one")
        time.sleep(0.01)


@remote_class()
class Learner:
    @remote_function(dispatch="all", collect="none")
    def train(self, n, meet_in=None):
        meet(meet_in, n)
        time.sleep(SLEEP)
        return n


@remote_class()
class Sampler:
    @remote_function(dispatch="all", collect="none")
    def sample(self, n, pause=SLEEP, meet_in=None):
        meet(meet_in, n)
        time.sleep(pause)
        return n

    @remote_function(dispatch="all", collect="none", timeout=3)
    def stuck(self):
        time.sleep(60)  # the sampler hangs here


@pytest.fixture(scope="module")
def traced(cluster, tmp_path_factory):
    path = tmp_path_factory.mktemp("ray-trace") / "run.json"
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("learn", 2, "cpu"), DeviceGroup("sample", 2, "cpu")],
        trace=str(path),
        name="trace-test",
    )
    try:
        learner = Learner(remote_group="learn")
        sampler = Sampler(remote_group="sample")
        meet_in = str(tmp_path_factory.mktemp("meet"))
        for i in range(2):
            a, b = learner.train(i, meet_in), sampler.sample(i, meet_in=meet_in)  # both at once
            assert a() == [i, i] and b() == [i, i]
        # Each actor's clock offset was measured when its group got its first call.
        from twinkle_ray import tracing as ray_tracing

        deadline = time.monotonic() + 30
        while len(ray_tracing._offsets) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ray_tracing._offsets) == 4
        dumped = _dump_while_stuck(sampler)
        with pytest.raises(CallTimeoutError) as info:
            sampler.stuck()()
        shutdown()
        assert ray_tracing._offsets == {}  # used for the merge, not measured again
    except BaseException:
        shutdown()  # a failure here must not leave the run to the next module
        raise
    return json.loads(path.read_text()), dumped, info.value


def _dump_while_stuck(sampler):
    """twinkle_core.dump_stacks() while the sampler's actors run a method."""
    out = {}

    def dump():
        time.sleep(1.0)
        out["text"] = twinkle_core.dump_stacks(file=open("/dev/null", "w"))

    thread = threading.Thread(target=dump)
    thread.start()
    assert sampler.sample(9, pause=4.0)() == [9, 9]
    thread.join()
    return out["text"]


def test_two_groups_overlap_on_their_own_tracks(traced):
    data, _, _ = traced
    events = data["traceEvents"]
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert {"driver", "group learn", "group sample"} <= set(processes.values())
    pid_of = {v: k for k, v in processes.items()}
    runs = [
        e for e in events if e["ph"] == "X" and e["name"] in ("Learner.train", "Sampler.sample")
    ]
    assert len(runs) == 2 * 2 * 2 + 2  # two rounds on 2 x 2 actors, and the dump's round
    for e in runs:
        group = e["args"]["group"]
        assert e["pid"] == pid_of[f"group {group}"] and e["tid"] == e["args"]["rank"]
        assert e["dur"] >= SLEEP * 1e6 * 0.9 and e["args"]["node"]
        assert e["args"]["driver"] == "driver" and isinstance(e["args"]["call"], int)
    # Each round's calls ran at the same time on both groups (they met: `meet`), so their
    # executions overlap by about SLEEP, less the error of each actor's clock offset.
    for i in range(2):
        learn = [e for e in runs if e["name"] == "Learner.train" and e["args"]["call"] == 2 * i + 1]
        sample = [
            e for e in runs if e["name"] == "Sampler.sample" and e["args"]["call"] == 2 * i + 2
        ]
        assert len(learn) == len(sample) == 2
        start = max(e["ts"] for e in learn + sample)
        end = min(e["ts"] + e["dur"] for e in learn + sample)
        assert end - start > SLEEP * 1e6 * 0.3, (learn, sample)
    # The driver's dispatch, its wait, and flow arrows to every execution.
    driver = [e for e in events if e["ph"] == "X" and e["pid"] == pid_of["driver"]]
    assert {"dispatch Learner.train", "wait Learner.train", "dispatch Sampler.sample"} <= {
        e["name"] for e in driver
    }
    flows = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = [e for e in events if e["ph"] == "f"]
    assert len(ends) >= len(runs)
    assert all(flows[e["id"]]["pid"] == pid_of["driver"] for e in ends)
    dispatch_ts = {e["args"]["call"]: e["ts"] for e in driver if e["cat"] == "dispatch"}
    # An execution starts after its call was dispatched, on the driver's clock: to within
    # 1 ms, plus how far each actor's offset may be off (half the round trip it was measured
    # over, recorded in the file: milliseconds when the machine is busy).
    uncertainty = data["otherData"]["clock_uncertainty_ns"]
    assert len(uncertainty) == 4 and all(v >= 0 for v in uncertainty.values())
    slack_us = 1000 + max(uncertainty.values()) / 1000
    for e in runs:
        assert e["ts"] >= dispatch_ts[e["args"]["call"]] - slack_us
    assert len(data["otherData"]["clock_offsets_ns"]) == 4  # one per actor
    inits = sorted(
        (e["name"], e["tid"]) for e in events if e["ph"] == "X" and e["name"].endswith("__init__")
    )
    assert inits == [(f"{c}.__init__", r) for c in ("Learner", "Sampler") for r in (0, 1)]


def test_dump_stacks_names_the_line_a_busy_actor_is_on(traced):
    _, dumped, _ = traced
    assert "group 'sample' rank 0 (Sampler); group 'sample' rank 1 (Sampler)" in dumped, dumped
    assert "in sample" in dumped and "time.sleep(pause)" in dumped
    # The idle learners say so instead of showing Ray's task loop.
    assert "group 'learn' rank 1 (Learner)\n  (idle: no call running)" in dumped


def test_call_timeout_carries_every_workers_stack(traced):
    _, _, error = traced
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "twinkle: stacks when the call timed out" in notes
    assert "2 x group 'sample' rank 0 (Sampler); group 'sample' rank 1 (Sampler)" in notes
    assert "time.sleep(60)  # the sampler hangs here" in notes


def test_untraced_run_records_nothing_in_its_actors(cluster, traced):
    from twinkle_core import trace as core_trace
    from twinkle_ray import tracing as ray_tracing

    initialize("ray", address=cluster.address, groups=[DeviceGroup("plain", 1, "cpu")])
    try:
        assert core_trace.RECORDER is None
        learner = Learner(remote_group="plain")
        assert learner.train(1)() == [1]
        (handle,) = learner.__dict__["_twinkle_binding"].workers.handles
        info = ray_tracing._probe_info(handle._actor_id.hex())
        assert ray_tracing.ask(info, "trace", 10.0) == {"snapshot": None}
    finally:
        shutdown()


@pytest.mark.parametrize("shape", ["one-node", "branch"])
def test_relayed_calls_link_to_their_executions(cluster, tmp_path, shape):
    """Through relays the driver's refs are the relays' tasks, not the workers': each
    execution is still tied to the driver's call that made it (its call id, and a flow arrow
    from the driver). One node: a relay forced on it. Branch: 4 workers over both nodes, one
    driver task per call to the first node's relay, which hands the second node's relay its
    share (that relay's executions are tied to the driver's task it never saw)."""
    path = tmp_path / "relayed.json"
    workers = 2 if shape == "one-node" else 4
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("relayed", workers, "cpu")],
        trace=str(path),
        name=f"trace-relayed-{shape}",
        relay_min_nodes=1 if shape == "one-node" else 2,
        cpus_per_worker=1 if shape == "one-node" else 2.5,  # branch: 2 workers per node
    )
    try:
        sampler = Sampler(remote_group="relayed")
        route = sampler.__dict__["_twinkle_binding"].workers.route
        assert route is not None and len(route.relays) == (1 if shape == "one-node" else 2)
        for i in range(3):
            lazy = sampler.sample(i, pause=0.01)
            assert len(lazy.source.pending.value_refs.nodes) == 1  # one task from the driver
            assert lazy() == [i] * workers
    finally:
        shutdown()
    events = json.loads(path.read_text())["traceEvents"]
    runs = [e for e in events if e["ph"] == "X" and e["name"] == "Sampler.sample"]
    assert len(runs) == 3 * workers
    dispatched = {
        e["args"]["call"]: e["ts"]
        for e in events
        if e["ph"] == "X" and e.get("cat") == "dispatch" and e["name"] == "dispatch Sampler.sample"
    }
    assert len(dispatched) == 3
    for e in runs:
        assert e["args"].get("driver") == "driver", e["args"]
        assert e["args"]["call"] in dispatched
    calls = sorted({e["args"]["call"] for e in runs})
    assert calls == sorted(dispatched)  # each call's two executions, on its own call id
    assert len([e for e in events if e["ph"] == "f"]) >= len(runs)

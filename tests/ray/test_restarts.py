"""Groups that survive a dead worker (`DeviceGroup(max_restarts=N)`), on a real local Ray
cluster: workers are found through `get_device_placement(detail=True)` and SIGKILLed, idle,
mid-call and until the budget is spent. Each test passes only on a bounded, attributable
error for the calls that were running, the next call succeeding on the new generation with
the right values (the role brought up to date by `on_restart`), one alert per restart, and
nothing left running after `shutdown()`."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
import ray
import ray.cloudpickle
from _support.processes import alive

from twinkle_core import (
    CollectiveBrokenError,
    DeviceGroup,
    WorkerDiedError,
    collective,
    collective_group,
    get_device_placement,
    get_worker_context,
    group_state,
    hookimpl,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugins import plugin_system
from twinkle_core.tools.doctor import diagnose

HERE = os.path.basename(__file__)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests


@remote_class()
class Learner:
    """A role with state a restart would lose: `on_restart` reloads it from a checkpoint."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint
        self.weights = 0.0
        self.restored = None

    @remote_function(dispatch="all", collect="none")
    def train(self, delta):
        self.weights += delta
        with open(f"{self.checkpoint}.{get_worker_context().rank}", "w") as f:
            f.write(repr(self.weights))  # the checkpoint a real trainer would save
        return self.weights

    def on_restart(self, generation):
        with open(f"{self.checkpoint}.{get_worker_context().rank}") as f:
            self.weights = float(f.read())
        self.restored = generation

    @remote_function(dispatch="all", collect="none")
    def state(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.generation, self.weights, self.restored, os.getpid()]

    @remote_function(dispatch="all", collect="none")
    def nap(self, seconds):
        time.sleep(seconds)
        return os.getpid()


@remote_class()
class Counter:
    """A second role colocated with the learner: rebuilt from its constructor."""

    def __init__(self, start):
        self.count = start

    @remote_function(dispatch="all", collect="none")
    def bump(self):
        self.count += 1
        return [self.count, os.getpid()]


class Restarts:
    """Records the `twinkle_group_restarted` hook."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def twinkle_group_restarted(self, group, generation, cause):
        self.seen.append((group, generation, cause))


def _leftovers() -> tuple[list, list]:
    """Placement groups and actors of this module's run that Ray still holds."""
    pgs = [
        p["name"]
        for p in ray.util.placement_group_table().values()
        if p["name"].startswith("restarts-test") and p["state"] != "REMOVED"
    ]
    actors = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("restarts-test")
    ]
    return pgs, actors


def run_hook_seen(hook: Restarts) -> list[tuple[str, int, str]]:
    return list(hook.seen)


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g}s")
        time.sleep(0.1)


def hook_saw(run, expected: list[tuple[str, int]]) -> None:
    """The restart hook saw exactly `expected` (group, generation) pairs. The hook fires on the
    restarting thread just after the group serves again (`GroupHealth.restarted`), so a test
    that already made calls on the new generation may look before it did: wait for it
    (bounded), then compare."""
    wait_until(lambda: len(run["hook"].seen) >= len(expected), timeout=30, what="the hook")
    assert [(g, n) for g, n, _ in run["hook"].seen] == expected


def _pid(group: str, rank: int) -> int:
    """A worker's pid, read from the placement table as a user would."""
    text = get_device_placement(detail=True)
    block = text.split(f"group {group} ", 1)[1]
    line = next(li for li in block.splitlines() if re.search(rf"group rank {rank}\s", li))
    return int(re.search(r"process pid (\d+)", line).group(1))


@pytest.fixture
def run(cluster, tmp_path):
    alerts = []
    hook = Restarts()
    plugin_system().add(hook, name="test-restarts")
    initialize(
        "ray",
        address=cluster.address,
        groups=[
            DeviceGroup("phoenix", 2, "cpu", max_restarts=2),
            DeviceGroup("short", 2, "cpu", max_restarts=1),
        ],
        notifier=lambda text: alerts.append(text.splitlines()[0]),
        name="restarts-test",
        trace=str(tmp_path / "trace.json"),
    )
    pids = []
    try:
        yield {
            "alerts": alerts,
            "hook": hook,
            "ckpt": str(tmp_path / "ckpt"),
            "pids": pids,
            "address": cluster.address,
        }
    finally:
        shutdown()
        plugin_system().pm.unregister(name="test-restarts")
        plugin_system().infos.pop("test-restarts", None)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)], "workers outlived shutdown()"
    # Nor do its placement groups and actors (rebuilt ones included).
    ray.init(address=cluster.address)
    try:
        left = _leftovers()
        while time.monotonic() < deadline and left != ([], []):
            time.sleep(0.2)
            left = _leftovers()
        assert left == ([], []), left
    finally:
        ray.shutdown()
    # Every restart the hook saw is a span of its group's health track in the trace.
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    restarts = [
        (e["args"]["group"], e["args"]["generation"])
        for e in events
        if e.get("cat") == "health" and e["ph"] == "X" and e["name"].startswith("restart ->")
    ]
    assert restarts == [(g, n) for g, n, _ in run_hook_seen(hook)]


def test_a_worker_killed_while_idle_is_rebuilt_and_brought_up_to_date(run):
    learner = Learner(run["ckpt"], remote_group="phoenix")
    counter = Counter(10, remote_group="phoenix")  # colocated: the same processes
    assert learner.train(1.5)() == [1.5, 1.5]
    assert [c for c, _ in counter.bump()()] == [11, 11]
    before = [row[4] for row in learner.state()()]
    run["pids"].extend(before)
    assert _pid("phoenix", 1) == before[1]

    os.kill(before[1], signal.SIGKILL)
    # Nobody calls: the liveness probe notices, and the group restarts on its own.
    wait_until(lambda: group_state(learner).generation == 1, timeout=60, what="the restart")
    state = group_state(learner)
    assert (state.state, state.restarts, state.max_restarts) == ("healthy", 1, 2)
    assert "rank 1 of group 'phoenix'" in state.last_cause and "idle" in state.last_cause

    rows = learner.state()()  # the next call works, on generation 1, weights reloaded
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(0, 1, 1.5, 1), (1, 1, 1.5, 1)]
    after = [r[4] for r in rows]
    run["pids"].extend(after)
    assert not set(after) & set(before) and not any(alive(p) for p in before)
    assert [c for c, _ in counter.bump()()] == [11, 11]  # constructor replayed: from 10 again
    assert "generation 1" in "\n".join(
        li for li in get_device_placement(detail=True).splitlines() if "phoenix" in li
    )
    hook_saw(run, [("phoenix", 1)])
    wait_until(lambda: len(run["alerts"]) == 1, timeout=30, what="the alert")
    assert run["alerts"] == ["twinkle run restarts-test: group phoenix restarted"]


def test_a_worker_killed_mid_call_fails_that_call_and_the_next_runs_on_the_new_generation(run):
    learner = Learner(run["ckpt"], remote_group="phoenix")
    learner.train(2.0)()
    before = [row[4] for row in learner.state()()]
    run["pids"].extend(before)
    lazy = learner.nap(60)  # line below: the call site the error names
    time.sleep(0.5)
    killed_at = time.monotonic()
    os.kill(_pid("phoenix", 0), signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        lazy(timeout=60)
    took = time.monotonic() - killed_at
    text = str(info.value)
    assert took < 15, took  # 0.04 s on a quiet machine; bounded far below the nap
    assert "worker rank 0 of group 'phoenix' (Learner)" in text and HERE in text
    assert "max_restarts=2" in text

    rows = learner.state()()  # waits for the restart, then runs there
    assert [(r[1], r[2], r[3]) for r in rows] == [(1, 2.0, 1), (1, 2.0, 1)]
    run["pids"].extend(r[4] for r in rows)
    # A result of the old generation is gone, and says so instead of mixing generations.
    assert group_state("phoenix").generation == 1


def test_deaths_beyond_the_budget_leave_the_group_dead_with_an_error_saying_so(run):
    learner = Learner(run["ckpt"], remote_group="short")
    learner.train(1.0)()
    first = [row[4] for row in learner.state()()]
    run["pids"].extend(first)
    os.kill(first[0], signal.SIGKILL)
    wait_until(lambda: group_state("short").generation == 1, timeout=60, what="the restart")
    second = [row[4] for row in learner.state()()]
    run["pids"].extend(second)
    os.kill(second[1], signal.SIGKILL)
    wait_until(lambda: group_state("short").state == "dead", timeout=60, what="the teardown")
    state = group_state("short")
    assert (state.restarts, state.generation) == (1, 1)
    # `twinkle doctor --ray` (another process) reads the live run's health from the cluster.
    report = diagnose({"ray": run["address"]}, timeout=60)
    runs = {e["group"]: e for e in report["ray_cluster"]["twinkle_runs"]}
    assert (runs["short"]["state"], runs["short"]["generation"], runs["short"]["live"]) == (
        "dead",
        1,
        True,
    )
    assert "rank 1 of group 'short'" in runs["short"]["last_cause"]
    assert any("group 'short' is dead at generation 1" in w["problem"] for w in report["warnings"])
    assert "    group short: dead, generation 1, restarts 1/1" in "\n".join(
        report["cluster_text"][0]
    )
    with pytest.raises(WorkerDiedError, match="torn down for good: its restarts are spent"):
        learner.state()()
    hook_saw(run, [("short", 1)])  # one restart, one hook
    wait_until(lambda: len(run["alerts"]) >= 2, timeout=30, what="the alerts")
    time.sleep(1.0)
    # one alert for the restart, one for the call that failed on the dead group
    assert sorted(run["alerts"]) == [
        "twinkle run restarts-test: Learner.state failed",
        "twinkle run restarts-test: group short restarted",
    ]


@remote_class()
class SlowToRebuild:
    """Builds at once the first time, slowly when rebuilt (a kill can land in the replay)."""

    def __init__(self):
        if get_worker_context().generation > 0:
            time.sleep(8)

    @remote_function(dispatch="all", collect="none")
    def where(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.generation, os.getpid()]


def test_a_death_during_the_constructor_replay_spends_a_restart_and_the_next_one_succeeds(run):
    obj = SlowToRebuild(remote_group="phoenix")
    first = [row[2] for row in obj.where()()]
    run["pids"].extend(first)
    os.kill(first[0], signal.SIGKILL)
    # The rebuild's processes show in the placement table once they started, while the
    # constructor replay sleeps: kill one of them there.
    wait_until(lambda: _pid("phoenix", 1) not in first, timeout=60, what="the rebuild's processes")
    replaying = _pid("phoenix", 1)
    run["pids"].append(replaying)
    assert group_state(obj).state == "restarting"
    os.kill(replaying, signal.SIGKILL)
    wait_until(lambda: group_state(obj).generation == 1, timeout=120, what="the second attempt")
    state = group_state(obj)
    assert (state.state, state.restarts) == ("healthy", 2)
    assert "restart as generation 1 failed" in state.last_cause
    rows = obj.where()()
    run["pids"].extend(r[2] for r in rows)
    assert [(r[0], r[1]) for r in rows] == [(0, 1), (1, 1)]
    assert replaying not in [r[2] for r in rows]
    hook_saw(run, [("phoenix", 1)])  # one restart done


@remote_class()
class Weights:
    """A role holding weights synced over collective group 'weights' (the policy is member 0)."""

    def __init__(self, value):
        self.w = np.full(4, value, dtype=np.float32)

    @remote_function(dispatch="all", collect="none")
    def sync(self, delay=0.0):
        time.sleep(delay)  # the source arrives late: the receivers wait in the broadcast
        collective("weights").broadcast([self.w], src=0)
        ctx = get_worker_context()
        return [ctx.generation, self.w.tolist(), os.getpid()]

    @remote_function(dispatch="all", collect="none")
    def train(self, value):
        self.w[:] = value
        return os.getpid()


def test_a_worker_killed_mid_broadcast_between_groups_is_rebuilt_and_the_group_formed_again(run):
    """Chaos (c): a sampler worker SIGKILLed while the policy and the sampler are in a broadcast
    of collective group 'weights'. The sampler's call fails with WorkerDiedError, the policy's
    with CollectiveBrokenError (both bounded), the sampler group restarts, the collective group
    is formed again over the new processes, and the next sync delivers the policy's weights."""
    policy = Weights(1.0, remote_group="short")
    sampler = Weights(0.0, remote_group="phoenix")
    collective_group("weights", [policy, sampler], timeout=30)
    got, sent = sampler.sync(), policy.sync()
    sent(timeout=60)
    rows = got(timeout=60)
    assert [r[1] for r in rows] == [[1.0] * 4] * 2
    before = [r[2] for r in rows]
    run["pids"].extend(before + policy.train(2.0)())

    receiving = sampler.sync()  # both sampler ranks wait in the broadcast for the policy
    sending = policy.sync(3.0)  # which arrives 3 s later, after the kill
    time.sleep(1.0)
    killed_at = time.monotonic()
    os.kill(_pid("phoenix", 1), signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as died:
        receiving(timeout=60)
    assert "worker rank 1 of group 'phoenix' (Weights)" in str(died.value)
    assert HERE in str(died.value)
    with pytest.raises(CollectiveBrokenError) as broken:
        sending(timeout=60)
    assert time.monotonic() - killed_at < 45
    assert "collective group 'weights'" in str(broken.value) and HERE in str(broken.value)

    wait_until(lambda: group_state(sampler).generation == 1, timeout=90, what="the restart")
    assert group_state(policy).state == "healthy" and group_state(policy).generation == 0
    got = sampler.sync()
    sent = policy.sync()
    assert [r[1] for r in sent(timeout=60)] == [[2.0] * 4] * 2
    rows = got(timeout=60)
    assert [(r[0], r[1]) for r in rows] == [(1, [2.0] * 4)] * 2  # new generation, policy's weights
    run["pids"].extend(r[2] for r in rows)
    assert not set(r[2] for r in rows) & set(before)
    hook_saw(run, [("phoenix", 1)])
    wait_until(lambda: any("restarted" in a for a in run["alerts"]), timeout=30, what="the alert")
    time.sleep(1.0)
    assert [a for a in run["alerts"] if "restarted" in a] == [
        "twinkle run restarts-test: group phoenix restarted"
    ]

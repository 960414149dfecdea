"""The call timeline in mode 'inprocess': the file's format, its tracks, and `twinkle trace
summary`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

import twinkle_core
from twinkle_core import ConfigurationError, DeviceGroup, remote_class, remote_function
from twinkle_core import trace as trace_mod
from twinkle_core.tools.cli import main as cli_main
from twinkle_core.trace import Recorder

SLEEP = 0.02


@remote_class()
class Producer:
    @remote_function(dispatch="slice", collect="flatten")
    def make(self, items):
        time.sleep(SLEEP)
        return [i * 2 for i in items]


@remote_class()
class Consumer:
    @remote_function(dispatch="slice", collect="sum")
    def use(self, items):
        time.sleep(SLEEP)
        return sum(items)


def _two_group_run(path, **init):
    twinkle_core.initialize(
        "inprocess", groups=[DeviceGroup("prod", 2), DeviceGroup("cons", 2)], **init
    )
    try:
        producer = Producer(remote_group="prod")
        consumer = Consumer(remote_group="cons")
        totals = [consumer.use(producer.make([1, 2, 3, 4]))() for _ in range(3)]
    finally:
        twinkle_core.shutdown()
    assert totals == [20, 20, 20]
    with open(path) as f:
        return json.load(f)


def _meta(events, name):
    return {
        (e["pid"], e["tid"]) if name == "thread_name" else e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == name
    }


def test_two_group_inprocess_trace_has_a_track_per_group_and_rank(tmp_path):
    path = tmp_path / "run.json"
    data = _two_group_run(path, trace=str(path))
    events = data["traceEvents"]
    processes = _meta(events, "process_name")
    threads = _meta(events, "thread_name")
    assert set(processes.values()) == {"driver", "group prod", "group cons"}
    pid_of = {name: pid for pid, name in processes.items()}

    workers = [e for e in events if e["ph"] == "X" and e["cat"] == "worker"]
    inits = [e for e in workers if e["name"].endswith(".__init__")]
    assert sorted((e["name"], e["tid"]) for e in inits) == [
        ("Consumer.__init__", 0),
        ("Consumer.__init__", 1),
        ("Producer.__init__", 0),
        ("Producer.__init__", 1),
    ]
    executions = [e for e in workers if e not in inits]
    assert len(executions) == 3 * 2 * 2  # 3 rounds, 2 groups, 2 ranks
    for e in executions:
        group = e["args"]["group"]
        assert e["name"] == {"prod": "Producer.make", "cons": "Consumer.use"}[group]
        assert e["pid"] == pid_of[f"group {group}"]
        assert e["tid"] == e["args"]["rank"] in (0, 1)
        assert threads[(e["pid"], e["tid"])].startswith(f"rank {e['tid']}")
        assert e["args"]["node"] and isinstance(e["args"]["call"], int)
        assert e["dur"] >= SLEEP * 1e6 * 0.9  # microseconds
    # Each call ran on both ranks of its group, and the ranks of one group never overlap
    # in-process (one worker at a time).
    by_call: dict[int, list] = {}
    for e in executions:
        by_call.setdefault(e["args"]["call"], []).append(e)
    assert sorted(len(v) for v in by_call.values()) == [2] * 6
    for calls in by_call.values():
        a, b = sorted(calls, key=lambda e: e["ts"])
        assert a["ts"] + a["dur"] <= b["ts"] + 1

    driver = [e for e in events if e["ph"] == "X" and e["pid"] == pid_of["driver"]]
    dispatches = {e["args"]["call"]: e for e in driver if e["cat"] == "dispatch"}
    assert set(dispatches) == set(by_call)
    assert {e["name"] for e in dispatches.values()} == {
        "dispatch Producer.make",
        "dispatch Consumer.use",
    }
    for call, calls in by_call.items():
        d = dispatches[call]
        for e in calls:  # in-process, the call runs while it is dispatched
            assert d["ts"] <= e["ts"] and e["ts"] + e["dur"] <= d["ts"] + d["dur"] + 1

    # One flow arrow per execution, from the driver's dispatch to the execution.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == len(executions)  # constructions have no call
    for fid, end in ends.items():
        assert starts[fid]["pid"] == pid_of["driver"]
        assert end["pid"] in (pid_of["group prod"], pid_of["group cons"])


def test_trace_path_from_the_environment_and_nothing_without_it(tmp_path, monkeypatch):
    path = tmp_path / "env.json"
    monkeypatch.setenv("TWINKLE_TRACE", str(path))
    data = _two_group_run(path)
    assert any(e["ph"] == "X" for e in data["traceEvents"])
    assert trace_mod.RECORDER is None  # stopped at shutdown
    assert trace_mod.WORKER_ENV not in os.environ

    monkeypatch.delenv("TWINKLE_TRACE")
    os.remove(path)
    twinkle_core.initialize("inprocess", groups=[DeviceGroup("prod", 2)])
    assert trace_mod.RECORDER is None  # off: nothing is recorded anywhere
    Producer(remote_group="prod").make([1, 2])()
    twinkle_core.shutdown()
    assert not path.exists()


def test_trace_argument_is_checked():
    with pytest.raises(ConfigurationError, match=r"initialize\(trace=\.\.\.\) must be a file path"):
        twinkle_core.initialize("inprocess", trace=42)
    assert not twinkle_core.is_initialized()
    assert trace_mod.RECORDER is None


def test_trace_is_written_at_exit_without_shutdown(tmp_path):
    path = tmp_path / "exit.json"
    script = f"""
import time
import twinkle_core
from twinkle_core import DeviceGroup, remote_class, remote_function

@remote_class()
class W:
    @remote_function
    def f(self):
        return 1

twinkle_core.initialize("inprocess", groups=[DeviceGroup("g", 2)], trace={str(path)!r})
W(remote_group="g").f()()
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    events = json.loads(path.read_text())["traceEvents"]
    names = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "worker"]
    assert sorted(names) == ["W.__init__"] * 2 + ["W.f"] * 2


def test_collection_is_split_into_wait_and_collect_by_the_executions_end():
    rec = Recorder("unused.json")
    ms = 1_000_000
    t = rec.started_ns
    rec.driver.append(
        ("dispatch", "M.f", "g", 1, "MainThread", t, t + 1 * ms, {"call": 1}, "driver")
    )
    rec.executions.append(("M.f", "g", 0, "n", 1, None, t + 1 * ms, t + 9 * ms, "driver"))
    rec.executions.append(("M.f", "g", 1, "n", 1, None, t + 1 * ms, t + 7 * ms, "driver"))
    rec.driver.append(
        ("collect", "M.f", "g", 1, "MainThread", t + 2 * ms, t + 10 * ms, {}, "driver")
    )
    events = rec.to_chrome()["traceEvents"]
    driver = {e["name"]: e for e in events if e["ph"] == "X" and e["pid"] == 1}
    assert driver["wait M.f"]["ts"] == 2000 and driver["wait M.f"]["dur"] == 7000  # until 9 ms
    assert driver["collect M.f"]["ts"] == 9000 and driver["collect M.f"]["dur"] == 1000


def _synthetic_trace(path):
    """A trace with known durations: method A 10 x (1..10 ms) on group g (2 ranks), driver
    waiting 30 of its 100 ms."""
    rec = Recorder(str(path))
    ms = 1_000_000
    t = rec.started_ns
    for i in range(10):
        rank = i % 2
        start = t + i * 10 * ms
        rec.executions.append(
            ("A.run", "g", rank, "n", i + 1, None, start, start + (i + 1) * ms, "driver")
        )
    rec.driver.append(("dispatch", "A.run", "g", 1, "MainThread", t, t + 70 * ms, {}, "driver"))
    rec.driver.append(
        ("collect", "A.run", "g", 99, "MainThread", t + 70 * ms, t + 100 * ms, {}, "driver")
    )
    rec.write()


def test_summary_counts_percentiles_idle_and_waiting(tmp_path, capsys):
    path = tmp_path / "s.json"
    _synthetic_trace(path)
    assert cli_main(["trace", "summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (method,) = out["methods"]
    assert method["name"] == "A.run" and method["count"] == 10
    assert method["total_ms"] == pytest.approx(55.0)
    assert method["p50_ms"] == pytest.approx(5.0) and method["p95_ms"] == pytest.approx(10.0)
    (group,) = out["groups"]
    assert group["ranks"] == 2 and group["busy_ms"] == pytest.approx(55.0)
    assert group["idle_ms"] == pytest.approx(100.0 * 2 - 55.0)  # span 100 ms x 2 ranks
    (driver,) = out["drivers"]
    assert driver["wait_fraction"] == pytest.approx(0.3)  # call 99 has no executions: all wait

    assert cli_main(["trace", "summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "A.run" in text and "     10" in text
    assert "g: 2 rank(s), idle 145.000 ms of 200.000 ms (72.5%)" in text
    assert "driver: waiting 30.0% of 100.000 ms" in text


def test_summary_command_of_a_real_run_and_a_bad_file(tmp_path):
    path = tmp_path / "run.json"
    _two_group_run(path, trace=str(path))
    done = subprocess.run(
        [sys.executable, "-m", "twinkle_core", "trace", "summary", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for method, count in (("Producer.make", 6), ("Consumer.use", 6), ("Producer.__init__", 2)):
        assert re.search(rf"^{re.escape(method)} +{count} ", done.stdout, re.M), done.stdout
    assert "prod: 2 rank(s)" in done.stdout and "cons: 2 rank(s)" in done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"events": []}')
    done = subprocess.run(
        [sys.executable, "-m", "twinkle_core", "trace", "summary", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "'traceEvents'" in done.stderr


def test_group_health_is_a_track_of_its_group_and_the_summary_reports_each_restart(
    tmp_path, capsys
):
    """A restart (restarting at 10 ms, healthy on generation 1 at 2510 ms) and a failed one
    (restarting at 3000 ms, dead at 3500 ms) on group g: instant events and a span per restart
    on g's "health" track, and the summary's "group restarts" lines."""
    from twinkle_core.health import GroupState

    path = tmp_path / "h.json"
    rec = Recorder(str(path))
    ms = 1_000_000
    t = rec.started_ns
    rec.executions.append(("A.run", "g", 0, "n", 1, None, t, t + 5 * ms, "driver"))
    for at, state, gen, restarts, cause in [
        (10, "restarting", 0, 1, "rank 1 died"),
        (2510, "healthy", 1, 1, "rank 1 died"),
        (3000, "restarting", 1, 2, "rank 0 died"),
        (3500, "dead", 1, 2, "rank 0 died; restart as generation 2 failed"),
    ]:
        rec.group_health(GroupState("g", state, gen, restarts, 2, cause))
        rec.health[-1] = (*rec.health[-1][:6], t + at * ms)
    rec.write()
    events = json.loads(path.read_text())["traceEvents"]
    group_pid = {v: k for k, v in _meta(events, "process_name").items()}["group g"]
    assert _meta(events, "thread_name")[(group_pid, trace_mod.HEALTH_TID)] == "health"
    marks = [(e["name"], e["ts"]) for e in events if e.get("cat") == "health" and e["ph"] == "i"]
    assert marks == [
        ("restarting (generation 0)", 10000),
        ("healthy (generation 1)", 2510000),
        ("restarting (generation 1)", 3000000),
        ("dead (generation 1)", 3500000),
    ]
    spans = [
        (e["name"], e["ts"], e["dur"], e["pid"])
        for e in events
        if e.get("cat") == "health" and e["ph"] == "X"
    ]
    assert spans == [
        ("restart -> generation 1", 10000, 2500000, group_pid),
        ("restart failed", 3000000, 500000, group_pid),
    ]

    assert cli_main(["trace", "summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["group"], r["duration_ms"], r["generation"]) for r in out["restarts"]] == [
        ("g", 2500.0, 1),
        ("g", 500.0, None),
    ]
    assert cli_main(["trace", "summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "g: died at 10.000 ms, generation 1 after 2500.000 ms (rank 1 died)" in text
    assert "g: died at 3000.000 ms, failed after 500.000 ms (rank 0 died)" in text


def test_a_run_records_its_groups_health_in_the_trace(tmp_path):
    """The runtime listens to the run's health book: a transition lands in the trace."""
    path = tmp_path / "run.json"
    twinkle_core.initialize(
        "inprocess", groups=[DeviceGroup("g", 1, max_restarts=1)], trace=str(path)
    )
    try:
        from twinkle_core.runtime import current_runtime

        health = current_runtime().config.health.of(DeviceGroup("g", 1, max_restarts=1))
        health.died("a test says so")
        health.restarted()
    finally:
        twinkle_core.shutdown()
    events = json.loads(path.read_text())["traceEvents"]
    assert [e["name"] for e in events if e.get("cat") == "health"] == [
        "restarting (generation 0)",
        "healthy (generation 1)",
        "restart -> generation 1",
    ]

"""The call timeline under torchrun: every rank records, rank 0 writes one merged file."""

from __future__ import annotations

import json

import pytest
from _support import prestart

from .conftest import run_job


@prestart.fixture
def hang_job(tmp_path_factory):
    """One job for the module: the traced run, then an untraced run whose workers hang while
    their processes get SIGUSR1."""
    out = tmp_path_factory.mktemp("trace")
    job = run_job("trace_job.py", out, "hang", timeout=180)
    assert job.returncode == 0, job.output[-4000:]
    return job


@pytest.fixture(scope="module")
def traced_job(hang_job):
    out = hang_job.out_dir
    return json.loads((out / "run.json").read_text()), out


def test_rank_zero_writes_one_merged_trace_with_every_rank(traced_job):
    data, out = traced_job
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".json") == ["run.json"]
    events = data["traceEvents"]
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert set(processes.values()) == {
        "driver rank 0",
        "driver rank 1",
        "group prod",
        "group sync",
    }
    pid_of = {v: k for k, v in processes.items()}
    workers = [e for e in events if e["ph"] == "X" and e["cat"] == "worker"]
    inits = sorted((e["name"], e["tid"]) for e in workers if e["name"].endswith(".__init__"))
    assert inits == [(f"{c}.__init__", r) for c in ("Producer", "Synced") for r in (0, 1)]
    executions = [e for e in workers if not e["name"].endswith(".__init__")]
    # 3 rounds x 2 groups x 2 ranks, each recorded by the process that ran it.
    assert len(executions) == 12
    for e in executions:
        group = e["args"]["group"]
        assert e["pid"] == pid_of[f"group {group}"] and e["tid"] == e["args"]["rank"]
        assert e["name"] == {"prod": "Producer.make", "sync": "Synced.step"}[group]
        assert e["dur"] >= 0.05 * 1e6 * 0.9
        # Rank r's worker ran the call made by rank r's copy of the driver script.
        assert e["args"]["driver"] == f"driver rank {e['args']['rank']}"
    # Both driver copies made the same calls, numbered alike.
    dispatches = [e for e in events if e["ph"] == "X" and e["cat"] == "dispatch"]
    per_driver = {
        name: sorted(e["args"]["call"] for e in dispatches if e["pid"] == pid_of[name])
        for name in ("driver rank 0", "driver rank 1")
    }
    assert (
        per_driver["driver rank 0"] == per_driver["driver rank 1"] and per_driver["driver rank 0"]
    )
    assert "driver rank 1" in data["otherData"]["clock_offsets_ns"]
    # Flow arrows go from each rank's driver to the executions in its own process.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for end in (e for e in events if e["ph"] == "f"):
        worker = next(
            x
            for x in executions
            if x["pid"] == end["pid"] and x["tid"] == end["tid"] and x["ts"] == end["ts"]
        )
        expected = "driver rank 1" if worker["args"]["rank"] == 1 else "driver rank 0"
        assert starts[end["id"]]["pid"] == pid_of[expected]


def test_clocks_are_aligned_across_ranks(traced_job):
    data, _ = traced_job
    steps = [e for e in data["traceEvents"] if e["ph"] == "X" and e["name"] == "Synced.step"]
    by_call: dict[int, dict[int, dict]] = {}
    for e in steps:
        by_call.setdefault(e["args"]["call"], {})[e["args"]["rank"]] = e
    assert len(by_call) == 3
    for ranks in by_call.values():
        r0, r1 = ranks[0], ranks[1]
        # The all-reduce at the end of the method ends both executions at the same moment,
        # although rank 1 reaches it 0.1 s later than rank 0 would (it sleeps 0.15 s, rank 0
        # 0.05 s). Misplaced clocks or spans (an end taken before the all-reduce, offsets of
        # the wrong sign) are 0.1 s off. Rank 0's all-reduce cannot return before rank 1 slept
        # its 0.15 s, whenever each rank's driver copy started the call (rank 0's may start
        # later on a loaded machine: its duration alone is no measure; a bound on it failed
        # so, 137 ms against 140). The ends' bound leaves 60 ms for a process of a loaded
        # 2-core machine to be scheduled again after the all-reduce (20 ms failed once so).
        end0, end1 = r0["ts"] + r0["dur"], r1["ts"] + r1["dur"]
        assert r1["dur"] >= 0.149 * 1e6
        assert end0 >= r1["ts"] + 0.149 * 1e6, (r0, r1)
        assert abs(end0 - end1) < 60_000


def test_summary_of_the_merged_trace(traced_job, tmp_path):
    from twinkle_core.tools.trace_summary import summarize

    data, _ = traced_job
    summary = summarize(data["traceEvents"])
    names = {m.name: m.count for m in summary.methods}
    assert names == {
        "Producer.make": 6,
        "Synced.step": 6,
        "Producer.__init__": 2,
        "Synced.__init__": 2,
    }
    assert {d.name for d in summary.drivers} == {"driver rank 0", "driver rank 1"}


def test_sigusr1_makes_every_rank_dump_its_own_stacks(hang_job):
    job = hang_job
    dumps = job.output.split("twinkle: Python stacks of the driver and workers")
    assert len(dumps) == 3, job.output[-4000:]  # one per rank
    for dump in dumps[1:]:
        assert "trace_job.py" in dump and ", in wait" in dump, dump
        assert "time.sleep(3)  # the worker hangs here" in dump

"""The trace's size stays bounded, and the driver's dispatch spans say how many bytes they sent.

Runs in mode 'inprocess' with real calls; the limit is set low through TWINKLE_TRACE_MAX_EVENTS.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import twinkle_core
from twinkle_core import DeviceGroup, remote_class, remote_function
from twinkle_core.calls import WorkerCall
from twinkle_core.trace import payload_bytes


@remote_class()
class Box:
    @remote_function(dispatch="all", collect="first")
    def size(self, payload, extra=None):
        return int(payload.nbytes)

    @remote_function(dispatch="all", collect="first")
    def plain(self, x):
        return x


def _run(path, calls: int, **env):
    twinkle_core.initialize("inprocess", groups=[DeviceGroup("g", 2)], trace=str(path))
    try:
        box = Box(remote_group="g")
        for _ in range(calls):
            assert box.plain(1)() == 1
        assert box.size(np.zeros(1000, dtype=np.float64), extra={"b": b"x" * 24})() == 8000
    finally:
        twinkle_core.shutdown()
    with open(path) as f:
        return json.load(f)


def test_a_long_run_keeps_the_latest_events_and_says_how_many_were_dropped(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("TWINKLE_TRACE_MAX_EVENTS", "10")
    caplog.set_level(logging.WARNING, logger="twinkle.trace")
    trace = _run(tmp_path / "run.json", calls=20)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    workers = [e for e in spans if e["cat"] == "worker"]
    driver = [e for e in spans if e["cat"] != "worker"]
    # 2 constructions and 21 calls on 2 workers: 44 executions; a dispatch and a collect span
    # per call: 42 driver spans.
    assert len(workers) == 10 and len(driver) <= 10 + 10  # a collect splits into wait+collect
    assert trace["otherData"]["dropped_events"] == (44 - 10) + (42 - 10)
    assert trace["otherData"]["max_events_per_process"] == 10
    assert any(e["name"] == "Box.size" for e in workers), "the latest events were not kept"
    warned = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warned) == 1 and "TWINKLE_TRACE_MAX_EVENTS" in warned[0]


def test_a_short_run_drops_nothing_and_warns_about_nothing(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="twinkle.trace")
    trace = _run(tmp_path / "run.json", calls=3)
    assert trace["otherData"]["dropped_events"] == 0
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "worker"]) == 2 + 8
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]


def test_dispatch_spans_carry_the_bytes_of_array_and_bytes_arguments(tmp_path):
    trace = _run(tmp_path / "run.json", calls=1)
    dispatches = {e["name"]: e["args"] for e in trace["traceEvents"] if e.get("cat") == "dispatch"}
    # dispatch='all': each of the 2 workers is sent the 8000-byte array and 24 bytes.
    assert dispatches["dispatch Box.size"]["bytes"] == 2 * (8000 + 24)
    assert "bytes" not in dispatches["dispatch Box.plain"]  # a plain int: size not known


_leaf = st.one_of(
    st.integers(0, 64).map(lambda n: np.zeros(n, dtype=np.int16)),
    st.binary(max_size=64),
    st.integers(),
    st.text(max_size=5),
)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
    ),
    max_leaves=20,
)


def _naive(value) -> tuple[int, bool]:
    if isinstance(value, (bytes, bytearray)):
        return len(value), True
    if isinstance(value, np.ndarray):
        return value.nbytes, True
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, (list, tuple, dict)):
        parts = [_naive(v) for v in items]
        return sum(p[0] for p in parts), any(p[1] for p in parts)
    return 0, False


@given(
    st.lists(st.tuples(st.lists(_tree, max_size=3), st.dictionaries(st.text(), _tree)), max_size=3)
)
def test_payload_bytes_sums_every_sized_value_in_nested_arguments(workers):
    calls = [WorkerCall(i, tuple(args), kwargs) for i, (args, kwargs) in enumerate(workers)]
    parts = [_naive([list(c.args), c.kwargs]) for c in calls]
    total, found = sum(p[0] for p in parts), any(p[1] for p in parts)
    assert payload_bytes(calls) == (total if found else None)


@pytest.mark.parametrize(
    "where, words",
    [
        ("missing/dir/run.json", "does not exist; create it first"),
        (".", "is a directory"),
    ],
)
def test_a_trace_path_that_cannot_be_written_fails_at_initialize(
    tmp_path, monkeypatch, where, words
):
    """Issue 30, item 7: checked when the run starts, not at shutdown (where the whole trace
    was lost with one stderr line, and missing parents were made silently)."""
    from twinkle_core import ConfigurationError, initialize

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=words):
        initialize("inprocess", trace=where)
    assert not (tmp_path / "missing").exists()  # nothing made on the user's behalf

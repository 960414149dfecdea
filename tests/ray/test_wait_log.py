"""Waits that say what they wait for: a placement Ray cannot make is logged while it waits."""

from __future__ import annotations

import logging
import re
import sys

import pytest
import ray
import ray.cloudpickle
from ray.util.placement_group import placement_group, remove_placement_group

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
from twinkle_ray.resources import ClusterResourceError

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import it


def test_pending_placement_logs_what_it_needs_and_what_is_free(
    cluster, no_runtime, caplog, capfd, monkeypatch
):
    """...and shows on the live status line (forced on: stderr is pytest's capture here)."""
    monkeypatch.setenv("TWINKLE_WAIT_LOG_INTERVAL", "0.5")
    monkeypatch.setenv("TWINKLE_STATUS_LINE", "1")
    ray.init(address=cluster.address)
    try:
        # Another job holds 3 of the 4 GPUs of each node: 8 GPUs exist, but no node has 4 free.
        hog = placement_group([{"GPU": 3}, {"GPU": 3}], strategy="STRICT_SPREAD")
        ray.get(hog.ready(), timeout=30)
        caplog.set_level(logging.INFO, logger="twinkle")
        try:
            with pytest.raises(ClusterResourceError, match=r"placement_timeout=4s"):
                initialize(
                    "ray",
                    groups=[DeviceGroup("model", [0, 1, 2, 3], "cuda")],
                    nproc_per_node=4,
                    placement_timeout=4,
                    name="wait-log-run",
                )
        finally:
            remove_placement_group(hog)
    finally:
        ray.shutdown()
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "twinkle.ray.placement" and r.getMessage().startswith("waiting for")
    ]
    assert len(lines) >= 2, caplog.text  # logged again and again while it waited
    first = lines[0]
    assert first.startswith("waiting for placement of group 'model': need 4 GPU"), first
    assert "on one node" in first
    # What is free on each of the two nodes: 1 GPU each (the other job holds 3).
    free = first.split("free: ", 1)[1]
    assert len(re.findall(r"node \S+ 1 GPU", free)) == 2, first
    assert re.search(r"\(\d+ s of placement_timeout=4 s\)$", lines[-1]), lines[-1]
    err = capfd.readouterr().err
    shown = "\r\x1b[2Ktwinkle: waiting for placement of 'model' (placement_timeout=4 s)"
    assert shown in err, err[-2000:]
    assert err.rindex("\r\x1b[2K") > err.rindex(shown), "the status line was not erased"


@remote_class()
class SlowToBuild:
    def __init__(self, seconds: float) -> None:
        import time

        time.sleep(seconds)

    @remote_function(dispatch="all", collect="none")
    def ping(self):
        return "pong"


def test_slow_constructors_are_logged_while_the_driver_waits(
    cluster, no_runtime, caplog, monkeypatch
):
    monkeypatch.setenv("TWINKLE_WAIT_LOG_INTERVAL", "0.3")
    caplog.set_level(logging.INFO, logger="twinkle.wait")
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("builders", 2, "cpu")],
        cpus_per_worker=0.5,
        name="wait-log-construct",
    )
    try:
        assert SlowToBuild(2.0, remote_group="builders").ping()(60) == ["pong", "pong"]
    finally:
        shutdown()
    lines = [r.getMessage() for r in caplog.records if r.name == "twinkle.wait"]
    assert any(
        "still waiting for SlowToBuild.__init__ on every actor of group 'builders' "
        "(SlowToBuild, 2 actors)" in m
        for m in lines
    ), lines

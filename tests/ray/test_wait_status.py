"""On a terminal, a placement Ray cannot make shows on twinkle's live status line."""

from __future__ import annotations

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from twinkle_core import DeviceGroup, initialize
from twinkle_ray.resources import ClusterResourceError


def test_a_pending_placement_shows_on_the_status_line(cluster, no_runtime, capfd, monkeypatch):
    monkeypatch.setenv("TWINKLE_STATUS_LINE", "1")  # stderr is pytest's capture, not a terminal
    monkeypatch.setenv("TWINKLE_WAIT_LOG_INTERVAL", "600")  # the status line, not the log
    ray.init(address=cluster.address)
    try:
        # Another job holds 3 of the 4 GPUs of each node: no node has 4 free.
        hog = placement_group([{"GPU": 3}, {"GPU": 3}], strategy="STRICT_SPREAD")
        ray.get(hog.ready(), timeout=30)
        try:
            with pytest.raises(ClusterResourceError, match=r"placement_timeout=6s"):
                initialize(
                    "ray",
                    groups=[DeviceGroup("model", [0, 1, 2, 3], "cuda")],
                    nproc_per_node=4,
                    placement_timeout=6,
                    name="wait-status-run",
                )
        finally:
            remove_placement_group(hog)
    finally:
        ray.shutdown()
    err = capfd.readouterr().err
    shown = "twinkle: waiting for placement of 'model' (placement_timeout=6 s)"
    assert "\r\x1b[2K" + shown in err, err[-2000:]
    assert err.rstrip(" ").endswith("\r\x1b[2K") or err.rindex("\r\x1b[2K") > err.rindex(shown), (
        "the status line was not erased when initialize failed"
    )

"""Without an address twinkle starts its own local cluster (loopback, no dashboard, a short temp
dir), keeps the driver's secrets out of it, and stops it at shutdown, repeatably."""

from __future__ import annotations

import os
import sys

import ray
import ray.cloudpickle

import twinkle_core
from twinkle_core import (
    DeviceGroup,
    get_device_placement,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@remote_class()
class Env:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def get(self, names):
        return {n: os.environ.get(n) for n in names}


def test_embedded_cluster_starts_scrubbed_and_stops_repeatably(monkeypatch, no_runtime):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("TW_EMBEDDED_SECRET", "s3cret")
    monkeypatch.setenv("TWINKLE_EMBEDDED_FLAG", "yes")
    temp_dirs = []
    for i in range(2):
        initialize("ray", groups=[DeviceGroup("g", 3, "cpu")], name=f"embedded-{i}")
        try:
            backend = twinkle_core.runtime.current_runtime().backend
            assert backend.connection.started_cluster
            temp_dirs.append(backend.connection._temp_dir)
            assert len(temp_dirs[-1]) < 30 and os.path.isdir(temp_dirs[-1])
            # 3 one-CPU workers fit although this machine may have fewer cores.
            env = Env(remote_group="g").get(["TW_EMBEDDED_SECRET", "TWINKLE_EMBEDDED_FLAG"])()
            assert env == [{"TW_EMBEDDED_SECRET": None, "TWINKLE_EMBEDDED_FLAG": "yes"}] * 3
            assert "(embedded)" in get_device_placement()
            assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())
        finally:
            shutdown()
        assert not ray.is_initialized()
        assert not os.path.exists(temp_dirs[-1])
        # The driver's own environment is intact after the scrubbed start.
        assert os.environ["TW_EMBEDDED_SECRET"] == "s3cret"

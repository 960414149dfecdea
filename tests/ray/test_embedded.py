"""Without an address twinkle starts its own local cluster (loopback, no dashboard, a short temp
dir), keeps the driver's secrets out of it, and stops it at shutdown, repeatably.

It runs in a fresh interpreter: a process that started and stopped a local Ray instance cannot
attach to another cluster afterwards (a Ray limitation), and the session cluster must stay
usable by the other modules.
"""

from __future__ import annotations

import textwrap

from _support.jobs import run_reporting_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import ray, ray.cloudpickle
    import twinkle_core
    from twinkle_core import (DeviceGroup, get_device_placement, initialize, remote_class,
                              remote_function, shutdown)

    @remote_class()
    class Env:
        def __init__(self):
            pass

        @remote_function(dispatch="all", collect="none")
        def get(self, names):
            return {n: os.environ.get(n) for n in names}

    report = []
    for i in range(2):
        initialize("ray", groups=[DeviceGroup("g", 3, "cpu")], name=f"embedded-{i}")
        backend = twinkle_core.runtime.current_runtime().backend
        temp_dir = backend.connection._temp_dir
        env = Env(remote_group="g").get(["TW_EMBEDDED_SECRET", "TWINKLE_EMBEDDED_FLAG"])()
        item = {
            "started": backend.connection.started_cluster,
            "temp_dir": temp_dir,
            "env": env,
            "placement": get_device_placement(),
            "addresses": sorted({n["NodeManagerAddress"] for n in ray.nodes()}),
        }
        shutdown()
        shutdown()
        item["after"] = [ray.is_initialized(), os.path.exists(temp_dir),
                         os.environ.get("TW_EMBEDDED_SECRET")]
        report.append(item)
    print("REPORT " + json.dumps(report), flush=True)
    """
)


def test_embedded_cluster_starts_scrubbed_and_stops_repeatably(tmp_path):
    report = run_reporting_script(
        tmp_path / "embedded.py",
        SCRIPT,
        env_extra={"TW_EMBEDDED_SECRET": "s3cret", "TWINKLE_EMBEDDED_FLAG": "yes"},
    )
    assert len(report) == 2
    for item in report:
        assert item["started"] and len(item["temp_dir"]) < 30
        # 3 one-CPU workers fit although this machine may have fewer cores; the secret stayed
        # on the driver while twinkle's own setting travelled.
        assert item["env"] == [{"TW_EMBEDDED_SECRET": None, "TWINKLE_EMBEDDED_FLAG": "yes"}] * 3
        assert "(embedded)" in item["placement"]
        assert item["addresses"] == ["127.0.0.1"]  # loopback only
        # Disconnected, temp dir removed, the driver's own environment intact.
        assert item["after"] == [False, False, "s3cret"]

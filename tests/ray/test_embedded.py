"""Without an address twinkle starts its own local cluster (loopback, no dashboard, a short temp
dir), keeps the driver's secrets out of it, and stops it at shutdown, repeatably.

It runs in a fresh interpreter: a process that started and stopped a local Ray instance cannot
attach to another cluster afterwards (a Ray limitation), and the session cluster must stay
usable by the other modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


AUTH_SCRIPT = textwrap.dedent(
    """
    import json, os
    import ray
    from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

    @remote_class()
    class Env:
        @remote_function(dispatch="all", collect="first")
        def auth(self):
            return os.environ.get("RAY_AUTH_MODE")

    initialize(mode="ray", groups=[DeviceGroup("g", 1, "cpu")])
    report = {"worker_mode": Env(remote_group="g").auth()()}
    shutdown()
    print("REPORT " + json.dumps(report), flush=True)
    """
)


def test_embedded_cluster_is_authenticated_quietly_without_a_token_in_home(tmp_path):
    """The session's private token (tests/conftest.py, docs/ray.md "Token authentication"):
    the cluster runs in token mode, Ray prints no notice and writes nothing under ~/.ray."""
    home = tmp_path / "home"
    home.mkdir()
    token_path = os.environ["RAY_AUTH_TOKEN_PATH"]
    assert os.stat(token_path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(token_path)).st_mode & 0o777 == 0o700
    script = tmp_path / "auth.py"
    script.write_text(AUTH_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=dict(env, HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'REPORT {"worker_mode": "token"}' in proc.stdout
    assert "Token authentication is enabled" not in proc.stdout + proc.stderr
    assert not (home / ".ray").exists()

"""`twinkle doctor --ray [ADDRESS]` against real Ray clusters.

Two clusters: the suite's simulated two-node cluster (fake GPUs and NPUs, see conftest), and a
one-node cluster this module starts in a child process with `ray.init(address='local', ...)`
(Ray's token authentication on, as Ray 2.60 starts new local clusters), stopped by that child's
own `ray.shutdown()`: nothing else on the machine is touched.

Every `twinkle doctor` run is a subprocess of its own; they run in the background from the
session's start (tests/_support/prestart.py) and the tests read their results.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from _support import prestart
from _support.cli import twinkle
from _support.net import free_port

pytestmark = pytest.mark.slow

MIB = 1024 * 1024

HOLDER = textwrap.dedent(
    """
    import sys
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        _temp_dir=sys.argv[1],
    )
    print("ADDRESS", ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    ray.shutdown()
    """
)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.update(extra)
    return env


@contextlib.contextmanager
def token_cluster():
    """A one-node cluster (2 CPUs) with token authentication, held by a child process."""
    temp_dir = tempfile.mkdtemp(prefix="tw-d-", dir="/tmp")
    env = base_env(RAY_AUTH_MODE="token")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, temp_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        address = None
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("ADDRESS "):
                address = line.split()[1]
                break
        assert address, "the holder process did not start its Ray cluster"
        yield address
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()  # only this test's own child
            proc.wait(timeout=30)
        shutil.rmtree(temp_dir, ignore_errors=True)


@prestart.fixture
def on_token_cluster():
    """`doctor` against the token cluster: with the token, and without it (and how long that
    took); the cluster's address."""
    with token_cluster() as address:
        with_token = twinkle(
            "doctor", "--ray", address, "--json", env=base_env(RAY_AUTH_MODE="token")
        )
        env = base_env()
        env.pop("RAY_AUTH_MODE", None)
        started = time.monotonic()
        refused = twinkle("doctor", "--ray", address, "--json", env=env)
        return address, with_token, refused, time.monotonic() - started


@prestart.fixture
def on_session_cluster(cluster):
    """`doctor --ray ADDRESS --json`, and `doctor --ray` with RAY_ADDRESS set."""
    return (
        twinkle("doctor", "--ray", cluster.address, "--json", env=base_env()),
        twinkle("doctor", "--ray", env=base_env(RAY_ADDRESS=cluster.address)),
    )


@prestart.fixture
def unreachable():
    """`doctor` against a port nobody listens on: the port, the run, how long it took."""
    port = free_port()
    started = time.monotonic()
    result = twinkle("doctor", "--ray", f"127.0.0.1:{port}", "--json", env=base_env())
    return port, result, time.monotonic() - started


@prestart.fixture
def local_refused():
    return twinkle("doctor", "--ray", "local", "--json", env=base_env())


def test_nodes_of_the_two_node_cluster(cluster, on_session_cluster):
    result = on_session_cluster[0]
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == []
    ray_cluster = report["ray_cluster"]
    assert ray_cluster["address"] == cluster.address
    assert ray_cluster["alive_nodes"] == 2
    assert ray_cluster["totals"] == {"CPU": 12.0, "GPU": 8.0, "NPU": 8.0}
    for node in ray_cluster["nodes"]:
        assert node["alive"] is True
        assert node["cpus"] == 6.0
        assert node["accelerators"] == {"GPU": 4.0, "NPU": 4.0}
        assert node["memory_bytes"] > 0
        assert node["object_store_memory_bytes"] == 100 * MIB
        assert len(node["node_id"]) > 8
    assert len({n["node_id"] for n in ray_cluster["nodes"]}) == 2
    import ray

    assert ray_cluster["direct_submission"] is True  # twinkle_ray.submission on this Ray
    assert ray_cluster["driver_ray_version"] == ray.__version__
    assert report["warnings"] == []


def test_a_ray_without_direct_submission_is_a_warning_with_the_fix():
    """What doctor says when this machine's Ray would take calls through `.remote()`."""
    from twinkle_ray.doctor_probe import _submission_warnings, _text

    cluster = {
        "address": "10.0.0.1:6379",
        "alive_nodes": 1,
        "totals": {"CPU": 4.0},
        "nodes": [],
        "direct_submission": False,
        "driver_ray_version": "2.99.0",
    }
    (warning,) = _submission_warnings(cluster)
    assert warning["problem"].startswith("this machine's Ray (2.99.0) takes twinkle's calls")
    assert "ray 2.60" in warning["fix"]
    assert "  calls submitted through Ray's .remote() (Ray 2.99.0)" in _text(cluster)
    assert _submission_warnings({**cluster, "direct_submission": True}) == []


def test_bare_ray_flag_connects_to_RAY_ADDRESS(cluster, on_session_cluster):
    result = on_session_cluster[1]
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ray cluster  {cluster.address}" in result.stdout
    assert "2 live node(s); total CPU=12, GPU=8, NPU=8" in result.stdout
    assert "CPU 6  GPU 4  NPU 4" in result.stdout
    assert "  calls submitted directly to Ray's core worker (Ray " in result.stdout
    assert result.stdout.rstrip().endswith("no problems found")


def test_cluster_started_with_ray_init_local(on_token_cluster):
    result = on_token_cluster[1]
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    [node] = report["ray_cluster"]["nodes"]
    assert node["cpus"] == 2.0 and node["accelerators"] == {}
    assert node["object_store_memory_bytes"] == 100 * MIB
    assert report["problems"] == []
    assert report["environment"]["RAY_AUTH_MODE"] == "token"


def test_cluster_refusing_our_token_names_the_fix(on_token_cluster):
    token_cluster, _, result, took = on_token_cluster
    assert result.returncode == 1
    [problem] = json.loads(result.stdout)["problems"]
    assert token_cluster in problem["problem"]
    assert "authentication token" in problem["problem"]
    assert "RAY_AUTH_MODE=token" in problem["fix"]
    # Stopped on Ray's first refusal, not after the 60 s connect timeout.
    assert took < 55


def test_unreachable_address_fails_fast(unreachable):
    port, result, took = unreachable
    assert result.returncode == 1
    report = json.loads(result.stdout)
    [problem] = report["problems"]
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in problem["problem"]
    assert "ray start --head" in problem["fix"]
    assert report["ray_cluster"]["nodes"] == []
    assert took < 120  # no Ray connection attempt at all


def test_local_is_refused(local_refused):
    result = local_refused
    assert result.returncode == 1
    [problem] = json.loads(result.stdout)["problems"]
    assert "would start a new cluster" in problem["problem"]

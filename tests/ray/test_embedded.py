"""Without an address twinkle starts its own local cluster (loopback, no dashboard, a short temp
dir), keeps the driver's secrets out of it, stops it at shutdown, repeatably, runs it with token
authentication without a token in the user's home, and keeps its files private.

It runs in a fresh interpreter: a process that started and stopped a local Ray instance cannot
attach to another cluster afterwards (a Ray limitation), and the session cluster must stay
usable by the other modules. One script (two embedded runs) serves every test of the module:
each start of an interpreter with an embedded cluster costs 5-10 s here.
"""

from __future__ import annotations

import os
import textwrap

from _support import prestart
from _support.jobs import run_reporting_script

SCRIPT = textwrap.dedent(
    """
    import json, os, stat, sys
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
            print("worker output")
            return {n: os.environ.get(n) for n in names}

        @remote_function(dispatch="all", collect="none")
        def nice(self):
            return os.nice(0)

        @remote_function(dispatch="all", collect="first")
        def auth(self):
            return os.environ.get("RAY_AUTH_MODE")

    def private_files(top):
        entries, secret_in, flag_in = {}, [], []
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                rel = os.path.relpath(path, top)
                entries[rel] = st.st_mode & 0o777
                if stat.S_ISREG(st.st_mode):
                    with open(path, "rb") as f:
                        data = f.read()
                    if b"hunter2-private" in data:
                        secret_in.append(rel)
                    if b"flag-visible" in data:
                        flag_in.append(rel)
        return {"top": top, "top_mode": os.stat(top).st_mode & 0o777, "entries": entries,
                "secret_in": secret_in, "flag_in": flag_in}

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    report = {"runs": []}
    # Workers' niceness: the driver's (3) in run 0, where nothing is exported (the test session
    # exports 0 for its own clusters); in run 1 the user's value (7) is added, as Ray adds it.
    os.environ.pop("RAY_worker_niceness", None)
    os.nice(3)
    for i in range(2):
        if i == 1:
            os.environ["RAY_worker_niceness"] = "7"
        initialize("ray", groups=[DeviceGroup("g", 3, "cpu")], name=f"embedded-{i}")
        backend = twinkle_core.runtime.current_runtime().backend
        temp_dir = backend.connection._temp_dir
        worker = Env(remote_group="g")
        names = ["TW_EMBEDDED_SECRET", "TWINKLE_EMBEDDED_FLAG"]
        env = worker.get(names)()
        item = {
            "started": backend.connection.started_cluster,
            "temp_dir": temp_dir,
            "env": env,
            "placement": get_device_placement(detail=True),
            "addresses": sorted({n["NodeManagerAddress"] for n in ray.nodes()}),
            "nice": worker.nice()(),
            "driver_nice": os.nice(0),
        }
        if i == 0:
            report["worker_mode"] = worker.auth()()
            report["private"] = private_files(temp_dir)
        shutdown()
        shutdown()
        item["after"] = [ray.is_initialized(), os.path.exists(temp_dir),
                         os.environ.get("TW_EMBEDDED_SECRET")]
        item["niceness_var_after"] = os.environ.get("RAY_worker_niceness")
        report["runs"].append(item)
    report["private"]["removed"] = not os.path.exists(report["private"]["top"])
    print("REPORT " + json.dumps(report), flush=True)
    """
)


@prestart.fixture
def embedded(tmp_path_factory):
    """The script's report, its output, and the HOME it ran with (an empty folder); run in
    the background from the session's start (tests/_support/prestart.py)."""
    tmp_path = tmp_path_factory.mktemp("embedded")
    home = tmp_path / "home"
    home.mkdir()
    report, output = run_reporting_script(
        tmp_path / "embedded.py",
        SCRIPT,
        env_extra={
            "HOME": str(home),
            "TW_EMBEDDED_SECRET": "s3cret",
            "TWINKLE_EMBEDDED_FLAG": "yes",
            "TW_PRIVATE_SECRET": "hunter2-private",
            "TWINKLE_PRIVATE_FLAG": "flag-visible",
        },
    )
    return report, output, home


def test_embedded_cluster_starts_scrubbed_and_stops_repeatably(embedded):
    report = embedded[0]["runs"]
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


def test_embedded_cluster_is_authenticated_quietly_without_a_token_in_home(embedded):
    """The session's private token (tests/conftest.py, docs/ray.md "Token authentication"):
    the cluster runs in token mode, Ray prints no notice and writes nothing under ~/.ray."""
    report, output, home = embedded
    token_path = os.environ["RAY_AUTH_TOKEN_PATH"]
    assert os.stat(token_path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(token_path)).st_mode & 0o777 == 0o700
    assert report["worker_mode"] == "token"
    assert "Token authentication is enabled" not in output
    assert not (home / ".ray").exists()


def test_embedded_cluster_temp_dir_is_private(embedded):
    report = embedded[0]["private"]
    # The one directory twinkle creates is its user's alone; Ray's (0777 dirs, 0644 logs, by
    # Ray's design) lives inside it, so no other user can reach any of it.
    assert report["top_mode"] == 0o700
    assert report["entries"], "Ray wrote nothing under twinkle's temp dir?"
    assert all(rel.split(os.sep)[0] == "r" for rel in report["entries"])
    assert report["secret_in"] == []  # the scrubbed driver secret is in no file
    assert report["removed"]


def test_embedded_cluster_runs_workers_at_the_drivers_niceness_unless_the_user_says(embedded):
    """Ray's default (15) would starve the workers beside any other busy program at nice 0."""
    report, _, _ = embedded
    first, second = report["runs"]
    assert first["driver_nice"] == 3 and first["nice"] == [3, 3, 3]
    assert first["niceness_var_after"] is None  # the driver's environment is left as it was
    assert second["nice"] == [10, 10, 10] and second["niceness_var_after"] == "7"

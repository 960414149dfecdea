"""One simulated two-node Ray cluster for the whole tests/ray session.

Each node declares fake GPUs and an NPU-like custom resource (absent hardware is the only thing
faked); twinkle connects to it by address in each test module and disconnects at shutdown, so
the cluster, started once, serves every module. The NOSET variables are exported before the
nodes start, as a cluster admin would, so Ray never overrides the visibility twinkle sets.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from _support import prestart

# Fixtures declared with `prestart.fixture` (driver subprocesses with clusters of their own,
# `twinkle doctor` runs) are made in the background from the session's start, one at a time
# beside the in-process tests (which keep a core busy themselves): see tests/_support/prestart.py.
_prestart = prestart.session_fixture(slots=1)

os.environ.pop("RAY_ADDRESS", None)  # never attach to another cluster on this machine
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_DEDUP_LOGS"] = "0"
# Ray starts workers at nice 15 unless told otherwise: beside any other CPU-heavy job at nice 0
# (CI shares this machine) an actor then gets about 3% of a core, and a 60 s Ray Direct
# Transport fetch or a start-up bound fails. Clusters twinkle starts itself run their workers at
# the driver's niceness (twinkle_ray/cluster.py); the clusters these tests start are configured
# the same way, as docs/ray.md tells an operator to.
os.environ["RAY_worker_niceness"] = "0"
# Ray gives a Ray Direct Transport fetch 60 s before it calls the transfer failed; the RDT tests
# wait 120 s for their calls, so a transfer slowed by load gets that long too.
os.environ["RAY_rdt_fetch_fail_timeout_milliseconds"] = "150000"
for _var in (
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
):
    os.environ[_var] = "1"

GPUS_PER_NODE = 4
CPUS_PER_NODE = 6


@pytest.fixture(scope="session")
def cluster():
    """Two nodes, each with 6 CPUs, 4 fake GPUs and 4 fake NPUs (100 MiB object store)."""
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="tw-t-", dir="/tmp")
    # Cluster records its address in /tmp/ray/ray_current_cluster; removed again at the end.
    os.makedirs("/tmp/ray", exist_ok=True)
    address_file = Path("/tmp/ray/ray_current_cluster")
    previous = address_file.read_text() if address_file.exists() else None
    node_args = {
        "num_cpus": CPUS_PER_NODE,
        "num_gpus": GPUS_PER_NODE,
        "resources": {"NPU": GPUS_PER_NODE},
        "object_store_memory": 100 * 1024 * 1024,
    }
    c = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "include_dashboard": False, "temp_dir": temp_dir},
    )
    c.add_node(**node_args)
    c.wait_for_nodes(timeout=60)
    try:
        yield c
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if previous is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(previous)


@pytest.fixture(scope="session")
def conformance():
    """The shared conformance driver, pickled by value so Ray workers need not import it."""
    import ray.cloudpickle
    from _support import conformance as module

    ray.cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture
def no_runtime():
    """Fail the test if it leaves twinkle initialized."""
    import twinkle_core

    yield
    still = twinkle_core.is_initialized()
    twinkle_core.shutdown()
    assert not still, "the test left twinkle initialized"

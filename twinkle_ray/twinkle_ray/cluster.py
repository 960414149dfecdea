"""Connecting to a Ray cluster, or starting an embedded one, and listing its live nodes."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from .envvars import NODE_ESSENTIALS, scrubbed_environ

log = logging.getLogger("twinkle")

#: Mode of the directories twinkle creates: only their owner may list or enter them.
PRIVATE_DIR_MODE = 0o700


@dataclass(frozen=True)
class NodeInfo:
    """One live node: its id, address and total resources."""

    node_id: str
    ip: str
    resources: dict[str, float] = field(hash=False)

    @property
    def label(self) -> str:
        """How the node is named in placements and errors: `ip/first-8-of-id`."""
        return f"{self.ip}/{self.node_id[:8]}"

    def amount(self, resource: str) -> float:
        return float(self.resources.get(resource, 0.0))


def live_nodes() -> list[NodeInfo]:
    """Alive nodes in a stable order (address, then node id)."""
    nodes = [
        NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})))
        for n in ray.nodes()
        if n.get("Alive")
    ]
    return sorted(nodes, key=lambda n: (n.ip, n.node_id))


def describe_nodes(nodes: list[NodeInfo], resources: tuple[str, ...] = ()) -> str:
    """One line per node with its CPUs, accelerators and any `resources` asked about."""
    shown = ("CPU", "GPU", "NPU", *resources)
    lines = []
    for node in nodes:
        parts = [f"{r}={node.amount(r):g}" for r in dict.fromkeys(shown) if r in node.resources]
        lines.append(f"  node {node.label}: {', '.join(parts) or 'no resources'}")
    return "\n".join(lines) or "  (no live nodes)"


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Make an embedded cluster listen on 127.0.0.1 only.

    Ray resolves `127.0.0.1` to the machine's reachable address unless its single-machine mode
    (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) is on: set for the processes the start spawns (they
    read the variable) and for this process's own resolution while it starts them.
    """
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        # A Ray without this private switch: start as Ray decides (it may bind a non-loopback
        # address) rather than fail.
        log.warning(
            "twinkle: this Ray cannot be kept on loopback; the embedded cluster may "
            "listen on the machine's address"
        )
        yield
        return
    saved = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


#: Ray's setting for its workers' niceness, which Ray adds to the niceness they inherit from the
#: node's processes (from the driver, for a cluster the driver starts). Ray's default is 15, so
#: a node's control processes stay responsive under busy workers; but beside any other
#: CPU-heavy program at nice 0 a worker then gets about 3% of a core (measured: an actor's
#: start-up went from 3 s to over 100 s while two busy loops ran). A cluster twinkle starts
#: for the driver adds 0, so its workers run at the driver's own niceness (as Ray's job
#: submission does for the process that runs a submitted driver); a value the user exported
#: wins, and clusters started elsewhere keep their operator's setting.
WORKER_NICENESS = "RAY_worker_niceness"


class ClusterConnection:
    """This run's connection to Ray: who started what, so shutdown undoes exactly that."""

    def __init__(self) -> None:
        self.started_cluster = False
        self.connected_here = False
        self.address = ""
        self._temp_dir: str | None = None

    def open(
        self,
        address: str | None,
        *,
        runtime_env: dict[str, Any],
        namespace: str | None,
        num_cpus: int | None,
        num_gpus: int | None,
        resources: dict[str, float],
        object_store_memory: int | None,
        keep_env: tuple[str, ...],
    ) -> None:
        """Connect to `address`, reuse a connection the caller made, or start a local cluster."""
        if ray.is_initialized():
            # The caller connected already (e.g. a test fixture): use it, never shut it down.
            self.address = ray.get_runtime_context().gcs_address
            log.info("twinkle: using the Ray connection this process already has")
            return
        kwargs: dict[str, Any] = {
            "namespace": namespace,
            "log_to_driver": True,
            "logging_level": logging.WARNING,
        }
        if address is not None:
            # Workers of a cluster started elsewhere get the variables through the job's
            # runtime environment; an empty one is left out (any runtime_env, even env_vars
            # only, makes Ray prepare every worker process through its agent: seconds).
            if runtime_env.get("env_vars") or set(runtime_env) - {"env_vars"}:
                kwargs["runtime_env"] = runtime_env
            ray.init(address=address, **kwargs)
            self.connected_here = True
            self.address = address
            return
        # Ray's socket paths must stay under 107 bytes: a short directory of our own, private
        # to this user (mkdtemp makes it 0700). Ray makes its temp dir world-writable (0777)
        # and its logs world-readable, so it gets a subdirectory: nobody else can reach it.
        self._temp_dir = tempfile.mkdtemp(prefix="tw-ray-", dir="/tmp")
        os.chmod(self._temp_dir, PRIVATE_DIR_MODE)
        options = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "resources": resources or None,
            "object_store_memory": object_store_memory,
            "include_dashboard": False,
            "_node_ip_address": "127.0.0.1",
            "_temp_dir": os.path.join(self._temp_dir, "r"),
        }
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            # The cluster's processes inherit this environment, and so every worker: keep only
            # what a node needs and what is meant to travel, never the driver's secrets. That
            # inheritance carries `runtime_env`'s variables too, so no runtime_env is given:
            # with one, Ray starts each worker through its runtime-env agent (measured here:
            # 4 actors in 3-7 s instead of about 1 s).
            with scrubbed_environ(keep_env, NODE_ESSENTIALS), _loopback_only():
                os.environ.setdefault(WORKER_NICENESS, "0")
                ray.init(
                    address="local",  # never attach to some other cluster found on the machine
                    **kwargs,
                    **{k: v for k, v in options.items() if v is not None},
                )
        except BaseException:
            self._remove_temp_dir()
            raise
        self.started_cluster = True
        self.connected_here = True
        self.address = ray.get_runtime_context().gcs_address

    def close(self) -> None:
        """Disconnect if this run connected, which also stops a cluster it started."""
        if self.connected_here and ray.is_initialized():
            ray.shutdown()
        self.connected_here = False
        self.started_cluster = False
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

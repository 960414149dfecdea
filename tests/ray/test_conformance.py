"""The shared conformance driver gives the in-process reference's values on a real Ray cluster."""

from __future__ import annotations

import ray


def test_ray_mode_reproduces_the_inprocess_reference(cluster, conformance):
    reference = conformance.run("inprocess")
    result = conformance.run("ray", address=cluster.address)
    assert result == reference
    # shutdown() disconnected the run's own connection and left the cluster it did not start up.
    assert not ray.is_initialized()
    assert cluster.head_node.remaining_processes_alive()

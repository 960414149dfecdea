"""The conformance kit against mode 'ray' on the session's two-node cluster.

`python -m twinkle_core.testing --mode ray --option address=...` runs every check in one driver
process, the dp=2 x tp=2 ones included (four CPU workers).
"""

from __future__ import annotations

import os

import pytest

from twinkle_core.testing import conformance_checks, run_kit

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1200)
def test_ray_passes_every_check(cluster, tmp_path):
    env = dict(os.environ)
    env.pop("TWINKLE_MODE", None)
    run = run_kit("ray", options={"address": cluster.address}, cwd=tmp_path, env=env, timeout=1080)
    assert run.returncode == 0, run.output
    assert run.passed >= 20 and run.failed == 0 and run.errors == 0, run.output
    assert run.not_applicable == 0, run.output
    assert run.passed == len(conformance_checks())
    for name in ("mesh_dp2_tp2_slice_dp", "mesh_dp2_tp2_reductions", "mesh_accessors"):
        assert name not in run.failed_checks and name not in run.not_applicable_checks
    assert f"{run.passed} passed, 0 failed" in run.output.splitlines()


@pytest.mark.timeout(1200)
def test_ray_through_per_node_relays_passes_every_check(cluster, tmp_path):
    """The same kit with every group's calls through relays (`relay_min_nodes=1`: a relay
    even for a group on one node), so the relayed path meets every check the direct one does."""
    env = dict(os.environ)
    env.pop("TWINKLE_MODE", None)
    run = run_kit(
        "ray",
        options={"address": cluster.address, "relay_min_nodes": 1},
        cwd=tmp_path,
        env=env,
        timeout=1080,
    )
    assert run.returncode == 0, run.output
    assert run.failed == 0 and run.errors == 0 and run.not_applicable == 0, run.output
    assert run.passed == len(conformance_checks())

"""DeviceGroup and DeviceMesh: validation and the rank arithmetic dispatch relies on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import ConfigurationError, DeviceGroup, DeviceMesh


def test_device_group_aliases_come_from_the_platforms_and_counts():
    """Aliases are declared by the platform that owns them, so a third party can add its own."""
    from twinkle_core import hookimpl
    from twinkle_core.plugin import CpuPlatform
    from twinkle_core.plugins import plugin_system, reset_plugins

    class TestAccel(CpuPlatform):
        device_type = "testaccel"
        aliases = ("Metal-Test", "tpu-test")

    class Provides:
        @hookimpl
        def register_platforms(self, register):
            register("testaccel", TestAccel)

    reset_plugins()
    plugin_system().add(Provides(), name="testaccel-plugin")
    try:
        g = DeviceGroup("model", ranks=[4, 5, 6, 7], device_type="METAL-test", gpus_per_worker=2)
        assert g.device_type == "testaccel"
        assert g.num_workers == 2
        assert g.worker_ranks(1) == (6, 7)
        assert DeviceGroup("t", 1, "tpu-test").device_type == "testaccel"
        assert DeviceGroup("p", 3, "CPU").rank_list == (0, 1, 2)
        assert DeviceGroup("u", 1, "Unknown-Kind").device_type == "unknown-kind"
    finally:
        reset_plugins()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(name="", ranks=2), "name"),
        (dict(name="g", ranks=0), "ranks as a count must be >= 1"),
        (dict(name="g", ranks=[]), "must not be empty"),
        (dict(name="g", ranks=[0, 0]), "duplicates"),
        (dict(name="g", ranks=[-1]), "integers from 0 to 65535"),
        (dict(name="g", ranks="01"), "ranks"),
        (dict(name="g", ranks=[0, 1, 2], gpus_per_worker=2), "multiple"),
        (dict(name="g", ranks=2, gpus_per_worker=0), "gpus_per_worker"),
        (dict(name="g", ranks=2, device_type=""), "device_type"),
        (dict(name="g", ranks=2, visible_devices=[0]), "visible_devices"),
    ],
)
def test_device_group_rejects_bad_input(kwargs, needle):
    with pytest.raises(ConfigurationError, match=needle):
        DeviceGroup(**kwargs)


def test_mesh_from_sizes_layout():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2, pp_size=2)
    assert mesh.world_size == 8
    assert mesh.parallelism() == {"pp": 2, "dp": 2, "tp": 2}
    # tp is innermost: ranks 0 and 1 are tp peers sharing data rank 0
    assert [mesh.data_rank_of(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert mesh.pp_last_ranks() == [4, 5, 6, 7]
    assert mesh.collect_ranks() == [4, 6]
    assert mesh.data_world_size == 2
    assert mesh.coordinate(5, "pp") == 1
    assert mesh.dim_size("cp") == 1


def test_mesh_fsdp_counts_as_data():
    mesh = DeviceMesh.from_sizes(dp_size=2, fsdp_size=2)
    assert mesh.data_world_size == 4
    assert [mesh.data_rank_of(r) for r in range(4)] == [0, 1, 2, 3]


def test_mesh_equality_and_pickle():
    import pickle

    a = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    assert pickle.loads(pickle.dumps(a)) == a
    assert a != DeviceMesh.from_sizes(dp_size=4)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: DeviceMesh.from_sizes(dp_size=0), "dp_size"),
        (lambda: DeviceMesh.from_sizes(dp_size=2, ranks=[0, 1, 2]), "need 2 ranks"),
        (lambda: DeviceMesh.from_sizes(bogus=2), "unexpected argument"),
        (lambda: DeviceMesh(np.array([0, 0]), ("dp",)), "distinct"),
        (lambda: DeviceMesh(np.arange(4).reshape(2, 2), ("dp",)), "names"),
        (lambda: DeviceMesh.from_sizes(dp_size=2).data_rank_of(5), "not in this mesh"),
    ],
)
def test_mesh_rejects_bad_input(call, needle):
    with pytest.raises(ConfigurationError, match=needle):
        call()


def test_mesh_extra_dimension():
    mesh = DeviceMesh.from_sizes(dp_size=2, sp_size=2)
    assert mesh.dim_size("sp") == 2
    assert mesh.data_world_size == 2
    assert mesh.collect_ranks() == [0, 2]


@given(total=st.integers(0, 200), shards=st.integers(1, 16))
def test_get_slice_partitions_the_batch(total, shards):
    mesh = DeviceMesh.from_sizes(dp_size=shards)
    slices = [mesh.get_slice(total, d) for d in range(shards)]
    covered = [i for s in slices for i in range(total)[s]]
    assert covered == list(range(total))
    lengths = [s.stop - s.start for s in slices]
    assert max(lengths) - min(lengths) <= 1

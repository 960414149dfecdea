"""`Collector.used_results`: the results a collector reads, which backends move and no others.

Both backends move only these to the caller or to another group (torchrun: only the used
results travel; Ray: a consumer fetches only them), so a collector that reads a result it did
not name would combine a missing value. Checked on every built-in collector over meshes of
every shape, with the ranks in any order (a mesh's ranks need not be 0..n-1 in order).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import DeviceMesh
from twinkle_core.collect import BUILTIN_COLLECTORS, Collector


def _plain(value):
    """Arrays as lists, so that results compare with `==`."""
    return value.tolist() if isinstance(value, np.ndarray) else value


@st.composite
def meshes(draw) -> DeviceMesh:
    sizes = {
        "dp_size": draw(st.integers(1, 3)),
        "tp_size": draw(st.integers(1, 2)),
        "pp_size": draw(st.integers(1, 3)),
        "cp_size": draw(st.integers(1, 2)),
    }
    n = 1
    for size in sizes.values():
        n *= size
    ranks = draw(st.permutations(range(n)))
    return DeviceMesh.from_sizes(**sizes, ranks=ranks)


@given(mesh=meshes(), name=st.sampled_from(sorted(BUILTIN_COLLECTORS)), data=st.data())
def test_a_collector_reads_only_the_results_it_names(mesh, name, data):
    collector = BUILTIN_COLLECTORS[name]
    n = mesh.world_size
    used = collector.used_results(mesh, n)
    assert len(set(used)) == len(used) and all(0 <= i < n for i in used)
    results = [float(i) for i in range(n)]
    others = data.draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))
    changed = [results[i] if i in used else others[i] for i in range(n)]
    assert _plain(collector.collect(changed, mesh)) == _plain(collector.collect(results, mesh))


@given(mesh=meshes(), name=st.sampled_from(["flatten", "concat", "last_pp", "none"]))
def test_used_results_come_in_the_order_the_collector_combines_them(mesh, name):
    collector = BUILTIN_COLLECTORS[name]
    n = mesh.world_size
    picked = collector.collect([[i] for i in range(n)], mesh)
    flat = [x for item in picked for x in item] if name in ("last_pp", "none") else list(picked)
    assert flat == collector.used_results(mesh, n)


def test_first_reads_one_result_and_a_custom_collector_every_one():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    assert BUILTIN_COLLECTORS["first"].used_results(mesh, 4) == [0]

    class Custom(Collector):
        def collect(self, results, device_mesh):
            return results

    assert Custom().used_results(mesh, 4) == [0, 1, 2, 3]
    assert Custom().used_results(None, 3) == [0, 1, 2]

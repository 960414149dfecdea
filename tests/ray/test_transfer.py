"""Data-shaping code of the Ray transfer path, checked without a cluster."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import DeviceMesh
from twinkle_core.dispatch import SliceDPDispatcher
from twinkle_ray.transfer import RemoteArray


def _materialize(remote: RemoteArray, results: dict[str, np.ndarray]) -> np.ndarray:
    pieces = [results[ref][a:b] for ref, a, b in remote.parts]
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    start=st.integers(0, 80),
    stop=st.integers(0, 80),
)
def test_slicing_a_remote_array_equals_slicing_the_concatenation(lengths, start, stop):
    results, offset = {}, 0
    for i, n in enumerate(lengths):
        results[f"r{i}"] = np.arange(offset, offset + n)
        offset += n
    remote = RemoteArray([(f"r{i}", 0, n) for i, n in enumerate(lengths)], "ndarray")
    whole = np.concatenate(list(results.values()))
    assert len(remote) == len(whole) and remote.shape == (len(whole),)
    part = remote[start:stop]
    assert _materialize(part, results).tolist() == whole[start:stop].tolist()
    # Slicing again (a dispatcher of a dispatcher) still matches.
    assert _materialize(part[1:], results).tolist() == whole[start:stop][1:].tolist()


@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4), dp=st.integers(1, 4))
def test_slice_dp_over_a_remote_array_gives_each_worker_its_rows(lengths, dp):
    results, offset = {}, 0
    for i, n in enumerate(lengths):
        results[f"r{i}"] = np.arange(offset, offset + n)
        offset += n
    whole = np.concatenate(list(results.values()))
    if len(whole) < dp:
        return
    remote = RemoteArray([(f"r{i}", 0, n) for i, n in enumerate(lengths)], "ndarray")
    mesh = DeviceMesh.from_sizes(dp_size=dp)
    real = SliceDPDispatcher().dispatch((whole,), {}, dp, mesh)
    placeheld = SliceDPDispatcher().dispatch((remote,), {}, dp, mesh)
    starts = np.cumsum([0, *lengths])
    for d, ((r_args, _), (p_args, _)) in enumerate(zip(real, placeheld, strict=True)):
        assert _materialize(p_args[0], results).tolist() == r_args[0].tolist()
        # Each worker fetches exactly the producer results its rows come from.
        rows = mesh.get_slice(len(whole), d)
        overlapping = {
            f"r{i}"
            for i, n in enumerate(lengths)
            if max(starts[i], rows.start) < min(starts[i] + n, rows.stop)
        }
        assert {ref for ref, _, _ in p_args[0].parts} == overlapping


@given(total=st.integers(1, 64), start=st.integers(0, 64), length=st.integers(0, 64))
def test_numpy_views_travel_with_only_their_own_bytes(total, start, length):
    base = np.arange(total * 4, dtype=np.float64).reshape(total, 4)
    view = base[start : start + length]
    buffers: list = []
    pickle.dumps(view, protocol=5, buffer_callback=buffers.append)  # what Ray does
    assert sum(memoryview(b).nbytes for b in buffers) == view.nbytes

"""Data-shaping code of the Ray transfer path, checked without a cluster."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
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


# ------------------------------------------------------------------ placeholders vs collectors
def _value_of(kind: str, rank: int, n: int):
    import torch

    base = np.arange(n * 2, dtype=np.float64).reshape(n, 2) + 100 * rank
    if kind == "ndarray":
        return base
    if kind == "tensor":
        return torch.from_numpy(base.astype(np.float32))
    if kind == "dict":
        return {"w": torch.from_numpy(base), "b": base[:, 0].astype(np.int64), "step": rank + 1}
    if kind == "tuple":
        return (torch.from_numpy(base), [f"r{rank}i{i}" for i in range(n)])
    if kind == "records":
        return [{"ids": base[i], "tag": f"r{rank}"} for i in range(n)]
    if kind == "strings":
        return [f"r{rank}s{i}" for i in range(n)]
    return float(rank) + 0.5


def _plain(value):
    """A value as nested lists and tagged leaves, for exact comparison."""
    import torch

    if isinstance(value, dict):
        return {"dict": {k: _plain(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_plain(v) for v in value]]
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), value.tolist()]
    if isinstance(value, np.ndarray):
        return ["ndarray", str(value.dtype), value.tolist()]
    return [type(value).__name__, value]


MESHES = {
    "dp2": lambda: DeviceMesh.from_sizes(dp_size=2),
    "dp2tp2": lambda: DeviceMesh.from_sizes(dp_size=2, tp_size=2),
    "pp2": lambda: DeviceMesh.from_sizes(pp_size=2),
}


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["ndarray", "tensor", "dict", "tuple", "records", "strings", "number"]),
    collect=st.sampled_from(["none", "first", "last_pp", "flatten", "concat", "mean", "sum"]),
    mesh_name=st.sampled_from(sorted(MESHES)),
    dispatch=st.sampled_from(["all", "slice", "slice_dp"]),
    n=st.integers(2, 12),
)
def test_a_placeholder_dispatches_and_fetches_like_the_collected_value(
    kind, collect, mesh_name, dispatch, n
):
    """For every built-in collector and result structure: build the placeholder from the
    results (as the driver does from replies), dispatch it to two consumers, fetch each share;
    each consumer gets what it would have got from the collected value (or the placeholder is
    refused, and the driver collects, exactly when the collector itself fails)."""
    from twinkle_core.collect import BUILTIN_COLLECTORS
    from twinkle_core.dispatch import BUILTIN_DISPATCHERS
    from twinkle_ray.placeholders import build_placeholder
    from twinkle_ray.transfer import _replace

    mesh = MESHES[mesh_name]()
    results = [_value_of(kind, rank, n) for rank in range(mesh.world_size)]
    collector = BUILTIN_COLLECTORS[collect]
    refs = [f"ref{i}" for i in range(len(results))]
    fetched = dict(zip(refs, results, strict=True))
    try:
        real = collector.collect(results, mesh)
    except Exception:
        real = None
    placeholder = build_placeholder(collector, mesh, refs, results)
    if real is None:
        assert placeholder is None  # the driver collects, and raises the collector's error
        return
    assert placeholder is not None, (kind, collect)
    consumers = DeviceMesh.from_sizes(dp_size=2)
    dispatcher = BUILTIN_DISPATCHERS[dispatch]
    try:
        want = dispatcher.dispatch((real,), {}, 2, consumers)
    except Exception as exc:
        with pytest.raises(type(exc)):
            dispatcher.dispatch((placeholder,), {}, 2, consumers)
        return
    got = dispatcher.dispatch((placeholder,), {}, 2, consumers)
    for (w_args, _), (g_args, _) in zip(want, got, strict=True):
        assert _plain(_replace(g_args[0], fetched)) == _plain(w_args[0])
    # Knowing the dispatcher (dispatch='all' needs no structure) changes nothing either.
    named = build_placeholder(collector, mesh, refs, results, dispatcher)
    got = dispatcher.dispatch((named,), {}, 2, consumers)
    for (w_args, _), (g_args, _) in zip(want, got, strict=True):
        assert _plain(_replace(g_args[0], fetched)) == _plain(w_args[0])


def test_large_received_tensors_share_the_buffer_and_small_ones_are_copies():
    import torch

    from twinkle_ray.transfer import ZERO_COPY_BYTES, tensor_from_numpy, writable_copies

    for numel, shared in ((ZERO_COPY_BYTES // 4, True), (1000, False)):
        data = np.arange(numel, dtype=np.float32).view(np.uint8)
        data.flags.writeable = False  # as Ray hands out object-store buffers
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch's non-writable warning is handled
            t = tensor_from_numpy((data, "float32", (numel,), "cpu", False))
        assert (t.data_ptr() == data.ctypes.data) is shared
        assert t[-1].item() == numel - 1
        copy = writable_copies({"t": [t]})["t"][0]
        assert (copy.data_ptr() != t.data_ptr()) is shared and torch.equal(copy, t)
    writable = np.arange(4, dtype=np.float32).view(np.uint8)
    t = tensor_from_numpy((writable, "float32", (4,), "cpu", False))
    assert t.data_ptr() == writable.ctypes.data  # a writable buffer needs no copy either


def test_an_in_place_write_into_a_received_view_is_reported_once_per_method():
    from twinkle_ray.transfer import ZERO_COPY_BYTES, WriteGuard, tensor_from_numpy, transfer_guard

    guard = WriteGuard()
    with transfer_guard(guard):
        data = np.zeros(ZERO_COPY_BYTES, dtype=np.uint8)
        data.flags.writeable = False
        small = np.zeros(16, dtype=np.uint8)
        small.flags.writeable = False
        big = tensor_from_numpy((data, "float32", (ZERO_COPY_BYTES // 4,), "cpu", False))
        tensor_from_numpy((small, "float32", (4,), "cpu", False))  # a private copy
    seen = guard.start()
    assert [t for t, _ in seen] == [big]  # only the shared view is watched
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.finish(seen, "Model.read")  # reading is fine
    big[:8].add_(1)  # a write through a view of it counts too
    with pytest.warns(RuntimeWarning, match="Model.write wrote in place"):
        guard.finish(seen, "Model.write")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.finish([(big, 0)], "Model.write")  # once per method
    assert guard.start() == []  # drained

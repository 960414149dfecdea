"""11. Tensor transfer: a 64 MiB and a 512 MiB float32 batch sliced to 4 Ray workers
(was ray_tensor_transfer.py).

Runs in a child process whose whole cluster has `RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1`, so raw
Ray sends CPU tensors zero-copy (its fastest path, off by default). Variants, alternating:
- twinkle: `sink.touch(tensor)()` with dispatch='slice_dp', collect='sum' (twinkle's own
  tensor serializer active in the driver);
- twinkle numpy: the same batch as a numpy array through twinkle;
- raw: the tensor split by hand into 4 views, `actor.touch.remote(view)` each, `ray.get`,
  summed, with Ray's zero-copy tensor reducer active in the driver (the suite swaps the
  driver's reducer for torch.Tensor between twinkle and raw rounds, both on one cluster);
- memcpy: `np.copyto` of the whole batch in the driver: what moving the bytes once costs here.
The object store is warmed first (filled to 2.5 GiB once, then freed), and rounds over twice
their variant's median are reported in the table's notes (`harness.slow_rounds`).
Each worker reads every 4096th element (nothing lazily skipped) and returns a float. Fair
because both send the same bytes to the same actors through the same object store; the ratio
is twinkle vs Ray's best path, and each figure over memcpy says how far from copying speed.
"""

from __future__ import annotations

import os
import sys
import warnings

from harness import BENCH_DIR, Context, Row, child_env, emit, interleave, median, run_child

NUMBER, NAME, QUICK, SESSION = "11", "ray-tensor", False, ()

WORKERS = 4
SIZES = (("11a", 64), ("11b", 512))
#: The store is warmed with WARM_PUTS objects of WARM_MIB each (2.5 GiB of its 3 GiB).
WARM_MIB, WARM_PUTS = 512, 5


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 11
    result = run_child(
        [sys.executable, str(BENCH_DIR / "cases" / "ray_tensor.py"), str(rounds)],
        timeout=900,
        env=child_env({"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}),
    )
    rows = []
    for row_id, mib in SIZES:
        s = result[str(mib)]
        med = {k: median(v) for k, v in s.items()}
        gbs = {k: mib * 1024 * 1024 / v / 1e9 for k, v in med.items()}
        rows.append(
            Row(
                row_id,
                f"Ray: {mib} MiB torch tensor, slice_dp to {WORKERS} workers vs raw zero-copy",
                med["twinkle"],
                med["raw"],
                unit="per batch",
                note=(
                    f"GB/s: twinkle {gbs['twinkle']:.1f}, twinkle numpy "
                    f"{gbs['twinkle-numpy']:.1f}, raw {gbs['raw']:.1f}, memcpy "
                    f"{gbs['memcpy']:.1f}; twinkle/memcpy x{med['twinkle'] / med['memcpy']:.0f}; "
                    f"tensor at {gbs['twinkle'] / gbs['twinkle-numpy']:.2f}x the numpy speed"
                ),
                extra={
                    "median_s": med,
                    "gb_per_s": gbs,
                    "over_memcpy": {k: v / med["memcpy"] for k, v in med.items()},
                    "tensor_over_numpy_speed": gbs["twinkle"] / gbs["twinkle-numpy"],
                    "twinkle_replaces_ray_tensor_reducer": result["twinkle_replaces_reducer"],
                },
                samples=s,
            )
        )
    return rows


def child(rounds: int) -> None:
    warnings.filterwarnings("ignore", message=".*[Zz]ero-copy.*")
    import numpy as np
    import ray
    import torch
    from bench_ops import Bench, Ops
    from harness import start_ray, stop_ray
    from ray import cloudpickle

    from twinkle_core import DeviceGroup, initialize, shutdown

    assert os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS") == "1"
    dispatch = cloudpickle.CloudPickler.dispatch
    temp_dir = start_ray(num_cpus=4, object_store_mib=3 * 1024)
    try:
        # Ray builds its serialization context (which installs its zero-copy reducer for
        # torch.Tensor, from the environment variable) on first use: use it once, then keep it.
        ray.get(ray.put(torch.zeros(1)))
        zero_copy = dispatch.get(torch.Tensor)
        assert zero_copy is not None and "zero_copy" in getattr(zero_copy, "__name__", ""), (
            f"Ray's zero-copy tensor reducer is not active: {zero_copy!r}"
        )
        initialize(mode="ray", groups=[DeviceGroup("sink", WORKERS)], cpus_per_worker=0.5)
        twinkle_reducer = dispatch.get(torch.Tensor)
        sink = Bench(remote_group="sink")
        actors = [ray.remote(num_cpus=0.5)(Ops).remote() for _ in range(WORKERS)]
        ray.get([a.noop.remote() for a in actors], timeout=300)
        sink.noop()(300)

        def use(reducer) -> None:
            dispatch[torch.Tensor] = reducer

        # Warm the object store: Ray's store grows into shared memory nobody touched yet, and
        # a round that first touches it is several times slower (raw and twinkle alike), so
        # the medians depended on whether the store was warm. Fill most of it once, free it.
        warm = [ray.put(np.ones(WARM_MIB * 1024 * 1024, dtype=np.uint8)) for _ in range(WARM_PUTS)]
        del warm
        out: dict = {"twinkle_replaces_reducer": twinkle_reducer is not zero_copy}
        if twinkle_reducer is None:
            twinkle_reducer = zero_copy
        for _, mib in SIZES:
            n = mib * 1024 * 1024 // 4
            tensor = torch.rand(n)
            array = tensor.numpy().copy()
            target = np.empty_like(array)
            shard = n // WORKERS
            expected: list[float] = []

            def twinkle(tensor=tensor, expected=expected) -> None:
                use(twinkle_reducer)
                expected.append(sink.touch(tensor)(300))

            def twinkle_numpy(array=array) -> None:
                use(twinkle_reducer)
                sink.touch(array)(300)

            def raw(tensor=tensor, shard=shard, expected=expected) -> None:
                use(zero_copy)
                views = [tensor[i * shard : (i + 1) * shard] for i in range(WORKERS)]
                refs = [a.touch.remote(v) for a, v in zip(actors, views, strict=True)]
                got = sum(ray.get(refs, timeout=300))
                if expected:
                    assert abs(got - expected[-1]) <= 1e-6 * abs(got), (got, expected[-1])

            def memcpy(array=array, target=target) -> None:
                np.copyto(target, array)

            out[str(mib)] = interleave(
                {"twinkle": twinkle, "raw": raw, "twinkle-numpy": twinkle_numpy, "memcpy": memcpy},
                rounds,
                warmup=1,
            )
            del tensor, array, target
        use(twinkle_reducer)
        shutdown()
        emit(out)
    finally:
        stop_ray(temp_dir)


if __name__ == "__main__":
    child(int(sys.argv[1]))

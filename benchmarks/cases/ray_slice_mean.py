"""4. Slice a batch of floats over 4 Ray workers and average their means (1024 and 100k floats).

twinkle: `bench.mean(batch)()` with dispatch='slice_dp', collect='mean' on 4 workers.
raw: the batch split by hand into 4 equal slices, one `actor.mean.remote(slice)` each,
`ray.get`, `np.mean` of the 4 results. Fair because both send the same slices (views of the
same array) to the same number of actors and combine the same 4 floats; the ratio is twinkle's
dispatch and collection around that.
"""

from __future__ import annotations

import numpy as np
import ray
from harness import Context, Row, interleave, row_from_samples

NUMBER, NAME, QUICK, SESSION = "4", "ray-slice-mean", True, ("four",)

SIZES = (("4a", 1024, "1024 floats"), ("4b", 100_000, "100k floats"))


def run(ctx: Context) -> list[Row]:
    bench, actors = ctx.ray.twinkle("four"), ctx.ray.raw("four")
    calls, rounds = (1, 60) if ctx.quick else (1, 250)
    rows = []
    for row_id, size, label in SIZES:
        batch = np.random.default_rng(0).normal(size=size)
        shard = size // len(actors)
        expected = float(np.mean(batch))

        def twinkle(batch=batch, expected=expected) -> None:
            for _ in range(calls):
                value = bench.mean(batch)(60)
            assert abs(value - expected) < 1e-9, (value, expected)

        def raw(batch=batch, shard=shard, expected=expected) -> None:
            for _ in range(calls):
                refs = [
                    a.mean.remote(batch[i * shard : (i + 1) * shard]) for i, a in enumerate(actors)
                ]
                value = float(np.mean(ray.get(refs, timeout=60)))
            assert abs(value - expected) < 1e-9, (value, expected)

        samples = interleave({"twinkle": twinkle, "raw": raw}, rounds, per=calls)
        rows.append(
            row_from_samples(row_id, f"Ray: slice_dp + mean of {label} on 4 workers", samples)
        )
    return rows

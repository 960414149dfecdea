"""20. Calls with the arguments real calls carry, against raw Ray passing the same values.

The headline cases call methods without arguments; real calls carry a config dict, token ids,
a small array. On the 4-worker group, `dispatch='all'` (every worker gets the value), the
method returns a constant: twinkle `four.take(value)`, raw `[a.take.remote(value) for a in
actors]` on 4 actors of the same class. Arguments: a 2-key dict, a list of 10 ints, an
8-float array, 1 KiB and 64 KiB of bytes. Rows: one call waited for (per call); 1000 calls
issued then resolved (per call) with the dict and with 64 KiB; the same with the dict on the
1-worker group. Fair: the same values, methods, workers and cluster; raw Ray inlines such
values in each task up to 100 KiB, which twinkle now does too (`shipping.INLINE_BYTES`).
"""

from __future__ import annotations

import numpy as np
import ray
from harness import Context, Row, interleave, row_from_samples

NUMBER, NAME, QUICK, SESSION = "20", "ray-args", False, ("four", "one")

VALUES = {
    "a 2-key dict": {"lr": 1e-4, "step": 3},
    "a list of 10 ints": list(range(10)),
    "an 8-float array": np.zeros(8),
    "1 KiB of bytes": b"x" * 1024,
    "64 KiB of bytes": b"x" * 65536,
}


def run(ctx: Context) -> list[Row]:
    four, actors = ctx.ray.twinkle("four"), ctx.ray.raw("four")
    one, (actor,) = ctx.ray.twinkle("one"), ctx.ray.raw("one")
    rows = []
    rounds = 10 if ctx.quick else 40
    for i, (what, value) in enumerate(VALUES.items()):

        def twinkle(value=value) -> None:
            four.take(value)(120)

        def raw(value=value) -> None:
            ray.get([a.take.remote(value) for a in actors], timeout=120)

        samples = interleave({"twinkle": twinkle, "raw": raw}, rounds, warmup=3)
        rows.append(
            row_from_samples(
                f"20{'abcde'[i]}",
                f"Ray: one call on 4 workers with {what} (dispatch='all')",
                samples,
            )
        )
    calls, rounds = (200, 3) if ctx.quick else (1000, 7)
    for row_id, what, group, handles in (
        ("20f", "a 2-key dict", four, actors),
        ("20g", "64 KiB of bytes", four, actors),
        ("20h", "a 2-key dict", one, [actor]),
    ):
        value = VALUES[what]

        def twinkle_many(value=value, group=group) -> None:
            lazies = [group.take(value) for _ in range(calls)]
            for lazy in lazies:
                lazy(120)

        def raw_many(value=value, handles=handles) -> None:
            refs = [a.take.remote(value) for _ in range(calls) for a in handles]
            ray.get(refs, timeout=120)

        samples = interleave(
            {"twinkle": twinkle_many, "raw": raw_many}, rounds, per=calls, warmup=1
        )
        n = len(handles)
        rows.append(
            row_from_samples(
                row_id,
                f"Ray: {calls} calls with {what} issued then resolved, {n} worker(s)",
                samples,
            )
        )
    return rows

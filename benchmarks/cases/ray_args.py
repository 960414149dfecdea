"""20. Calls with the arguments real calls carry, against raw Ray passing the same values.

The headline cases call methods without arguments; real calls carry a config dict, token ids,
a small array. On the 4-worker group, `dispatch='all'` (every worker gets the value), the
method returns a constant: twinkle `four.take(value)`, raw `[a.take.remote(value) for a in
actors]` on 4 actors of the same class. Arguments: a 2-key dict, a list of 10 ints, an
8-float array, 1 KiB and 64 KiB of bytes. Rows: one call waited for (per call); 1000 calls
issued then resolved (per call) with the dict and with 64 KiB; the same with the dict on the
1-worker group; and 1000 calls with the dict issued while every worker is busy (blocked until a
file appears: only issuing is timed, per call, as case 3 does), on 4 and on 1 worker, with the
issue cost per call at 2000 pending over that at 500 in the note. Fair: the same values,
methods, workers and cluster; raw Ray inlines such values in each task up to 100 KiB, which
twinkle now does too (`shipping.INLINE_BYTES`). Rounds: 100 of each one-call row, 12 of the
4-worker 1000-call rows and 40 of the 1-worker one, 7 of 20i and 15 of 20j, as a round varies
by +-40% on a shared 2-core machine (with 7, 20h's ratio moved by 0.15 between runs).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time

import numpy as np
import ray
from harness import Context, Row, interleave, issue_while_busy, median, row_from_samples

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
    rounds = 10 if ctx.quick else 100
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
    calls = 200 if ctx.quick else 1000
    # One worker's rounds are short (0.25 s), so 20h takes 40 of them: its ratio then moves by
    # about 0.02 between runs, where with 7-12 it moved by up to 0.15 (4 workers: 12 rounds).
    for row_id, what, group, handles, rounds in (
        ("20f", "a 2-key dict", four, actors, 3 if ctx.quick else 12),
        ("20g", "64 KiB of bytes", four, actors, 3 if ctx.quick else 12),
        ("20h", "a 2-key dict", one, [actor], 3 if ctx.quick else 40),
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
    return rows + _busy_rows(ctx, four, actors, one, actor)


def _busy_rows(ctx: Context, four, actors, one, actor) -> list[Row]:
    """20i/20j: calls with a 2-key dict issued while the workers are busy (issue cost)."""
    value = VALUES["a 2-key dict"]
    sizes = (200, 400) if ctx.quick else (500, 1000, 2000)
    # With 7 rounds 20j's ratio moved between 0.92 and 1.28 across runs of the same code; one
    # worker's rounds are short (about 1 s), so it takes 15. 4 workers: 7 (4 s each).
    rounds_of = {"20i": 7, "20j": 15} if not ctx.quick else {"20i": 2, "20j": 2}
    folder = tempfile.mkdtemp(prefix="twb-args-busy-", dir="/tmp")
    counter = itertools.count()

    def variant(kind: str, group, handles, n: int):
        def go() -> float:
            path = os.path.join(folder, f"release-{next(counter)}")
            if kind == "twinkle":
                issued = issue_while_busy(group, path, lambda: group.take(value), n)
            else:
                blockers = [a.block.remote(path) for a in handles]
                start = time.perf_counter()
                pending = [a.take.remote(value) for _ in range(n) for a in handles]
                issued = time.perf_counter() - start
                open(path, "w").close()
                ray.get(blockers, timeout=300)
                ray.get(pending, timeout=300)
            return issued

        return go

    rows = []
    try:
        for row_id, group, handles in (("20i", four, actors), ("20j", one, [actor])):
            variants = {
                f"{kind}-{n}": variant(kind, group, handles, n)
                for n in sizes
                for kind in ("twinkle", "raw")
            }
            samples = interleave(
                variants,
                rounds_of[row_id],
                per={k: int(k.split("-")[1]) for k in variants},
                warmup=1,
            )
            med = {k: median(v) for k, v in samples.items()}
            low, mid, high = sizes[0], sizes[len(sizes) // 2], sizes[-1]
            growth = {k: med[f"{k}-{high}"] / med[f"{k}-{low}"] for k in ("twinkle", "raw")}
            rows.append(
                Row(
                    row_id,
                    f"Ray: {mid} calls with a 2-key dict issued while {len(handles)} worker(s) "
                    "are busy (issue cost)",
                    med[f"twinkle-{mid}"],
                    med[f"raw-{mid}"],
                    note=(
                        f"per call at {high} vs {low} pending: twinkle x{growth['twinkle']:.2f}, "
                        f"raw x{growth['raw']:.2f}"
                    ),
                    extra={"issue_per_call_s": med, "growth": growth},
                    samples=samples,
                )
            )
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    return rows

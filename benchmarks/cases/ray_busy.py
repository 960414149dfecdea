"""3. Ray calls issued while the worker is busy: cost per call, and whether it grows with the
number of calls pending.

The worker is first given a blocking call (it waits for a file to appear); then N no-op calls
are issued and timed (none can run yet, so all N are pending), the file is created and
everything is resolved. twinkle: `one.block(path)` then N `one.noop()` on a one-worker group;
raw: `actor.block.remote(path)` then N `actor.noop.remote()` on a plain actor. The figure is
the issuing time per call at N=1000; the same at N=500 and N=2000 shows whether a call gets
dearer the more calls are pending (a per-call cost that scans pending calls would). Fair
because both queue the same tasks behind the same blocked worker.

"raw, 5 us between calls" (extra, in the note): the raw loop with a 5 us busy-wait before each
`.remote()`, timed without the waits: Ray serves submissions issued back to back faster than
ones with anything between them, and this shows how much of the ratio that is (see
docs/performance.md, cases 1-3).
"""

from __future__ import annotations

import os
import tempfile
import time

import ray
from harness import Context, Row, interleave, median

NUMBER, NAME, QUICK, SESSION = "3", "ray-busy", False, ("one",)

SIZES = (500, 1000, 2000)
GAP_S = 5e-6


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(ctx: Context) -> list[Row]:
    one, (actor,) = ctx.ray.twinkle("one"), ctx.ray.raw("one")
    rounds = 2 if ctx.quick else 11  # rounds vary widely on a shared machine (see case 2)
    folder = tempfile.mkdtemp(prefix="twb-busy-", dir="/tmp")
    counter = iter(range(10**9))
    resolve: dict[str, list[float]] = {}

    def variant(kind: str, n: int):
        def go() -> float:
            path = os.path.join(folder, f"release-{next(counter)}")
            if kind == "twinkle":
                blocker = one.block(path)
                start = time.perf_counter()
                pending = [one.noop() for _ in range(n)]
                issued = time.perf_counter() - start
                open(path, "w").close()
                start = time.perf_counter()
                blocker(300)
                for lazy in pending:
                    lazy(300)
            else:  # raw, or raw with GAP_S of work before each call ("gap")
                blocker = actor.block.remote(path)
                start = time.perf_counter()
                if kind == "raw":
                    pending = [actor.noop.remote() for _ in range(n)]  # the tight loop
                    issued = time.perf_counter() - start
                else:
                    pending = []
                    for _ in range(n):
                        _spin(GAP_S)
                        pending.append(actor.noop.remote())
                    issued = time.perf_counter() - start - n * GAP_S
                open(path, "w").close()
                start = time.perf_counter()
                ray.get(blocker, timeout=300)
                ray.get(pending, timeout=300)
            resolve.setdefault(f"{kind}-{n}", []).append((time.perf_counter() - start) / n)
            return issued

        return go

    variants = {f"{k}-{n}": variant(k, n) for n in SIZES for k in ("twinkle", "raw")}
    variants["gap-1000"] = variant("gap", 1000)
    try:
        samples = interleave(
            variants, rounds, per={k: int(k.split("-")[1]) for k in variants}, warmup=1
        )
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    med = {k: median(v) for k, v in samples.items()}
    growth_t = med["twinkle-2000"] / med["twinkle-500"]
    growth_r = med["raw-2000"] / med["raw-500"]
    return [
        Row(
            NUMBER,
            "Ray: 1000 calls issued while the worker is busy (issue cost)",
            med["twinkle-1000"],
            med["raw-1000"],
            note=(
                f"per call at 2000 vs 500 pending: twinkle x{growth_t:.2f}, raw "
                f"x{growth_r:.2f}; raw with 5 us between calls: "
                f"{med['gap-1000'] * 1e6:.0f} us beyond the 5 us "
                f"(twinkle x{med['twinkle-1000'] / med['gap-1000']:.2f} of it)"
            ),
            extra={
                "issue_per_call_s": med,
                # the first sample of each is the warm-up round's
                "resolve_per_call_s": {k: median(v[1:]) for k, v in resolve.items()},
                "growth_2000_vs_500": {"twinkle": growth_t, "raw": growth_r},
            },
            samples=samples,
        )
    ]

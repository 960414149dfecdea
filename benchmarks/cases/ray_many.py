"""2. 1000 Ray calls issued, then resolved: cost per call (500 in quick mode).

twinkle: 1000 `one.noop()` on a one-worker group (each returns a LazyCollect at once), then
every LazyCollect resolved. raw: 1000 `actor.noop.remote()`, then `ray.get` of the list.
Fair because both queue the same 1000 actor tasks on one worker and fetch every result; the
ratio is what twinkle adds per call when calls are pipelined rather than waited for one by one.
"""

from __future__ import annotations

import ray
from harness import Context, Row, interleave, row_from_samples

NUMBER, NAME, QUICK, SESSION = "2", "ray-many", True, ("one",)


def run(ctx: Context) -> list[Row]:
    one, (actor,) = ctx.ray.twinkle("one"), ctx.ray.raw("one")
    # Rounds of 1000 calls vary by +-40% on a shared 2-core machine: 25 of them (about 8 s)
    # keep the medians, and so the ratio, steady from run to run.
    calls, rounds = (500, 3) if ctx.quick else (1000, 25)

    def twinkle() -> None:
        lazies = [one.noop() for _ in range(calls)]
        for lazy in lazies:
            lazy(120)

    def raw() -> None:
        refs = [actor.noop.remote() for _ in range(calls)]
        ray.get(refs, timeout=120)

    samples = interleave({"twinkle": twinkle, "raw": raw}, rounds, per=calls, warmup=1)
    return [row_from_samples(NUMBER, f"Ray: {calls} calls issued then resolved", samples)]

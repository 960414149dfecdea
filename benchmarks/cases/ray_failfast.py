"""7. Time from one rank's failure to the caller while the other ranks still run (Ray).

Rank 0 of 4 raises at once, ranks 1-3 sleep 2 s. twinkle: `bench.fail_or_sleep(2.0)()` on a
group of 4, timed from the call until it raises. raw: the same 4 actor calls, then fail-fast by
hand: `ray.wait(num_returns=1)` in a loop and `ray.get` of each ready ref until one raises. Fair
because both learn of the same failure through the same cluster; a caller that waited for all
ranks would take 2 s, so anything well below 2 s fails fast. Between rounds every worker is
allowed to finish its sleep (not timed).
"""

from __future__ import annotations

import ray
from harness import Context, Row, interleave, raw_fail_fast, row_from_samples

NUMBER, NAME, QUICK, SESSION = "7", "ray-failfast", False, ("four",)

SLEEP = 2.0


def run(ctx: Context) -> list[Row]:
    bench, actors = ctx.ray.twinkle("four"), ctx.ray.raw("four")
    rounds = 2 if ctx.quick else 5

    def twinkle() -> float:
        import time

        bench.noop()(60)  # every worker idle again (actor calls run in order)
        start = time.perf_counter()
        try:
            bench.fail_or_sleep(SLEEP)(60)
        except Exception as exc:  # the rank-0 failure, whatever type twinkle raises it as
            elapsed = time.perf_counter() - start
            if "rank 0 fails" not in str(exc):
                raise
            return elapsed
        raise AssertionError("twinkle did not raise")

    def raw() -> float:
        import time

        ray.get([a.noop.remote() for a in actors], timeout=60)
        start = time.perf_counter()
        raw_fail_fast([a.fail_or_sleep.remote(rank, SLEEP) for rank, a in enumerate(actors)])
        return time.perf_counter() - start

    samples = interleave({"twinkle": twinkle, "raw": raw}, rounds, warmup=1)
    # let the sleeping ranks finish, so later cases start with idle workers
    bench.noop()(60)
    ray.get([a.noop.remote() for a in actors], timeout=60)
    return [
        row_from_samples(
            NUMBER,
            "Ray: rank 0 fails, 3 ranks sleep 2 s: failure reaches the caller",
            samples,
            unit="once",
        )
    ]

"""1. A no-op call to 4 Ray workers, resolved.

twinkle: `bench.noop()()` on a group of 4 workers (dispatch to each, collect='none').
raw: the same method on 4 plain actors, `ray.get([a.noop.remote() for a in actors])`.
Fair because both make the same 4 actor calls on the same cluster and wait for all 4 results;
what is left is twinkle's dispatch, bookkeeping and collection.

"hosted" (extra, in the note): twinkle's own actors called with raw Ray, `ray.get([h.noop.remote()
for h in handles])`: what the worker side (twinkle's actor class around the user's object)
costs, apart from the driver's path.
"""

from __future__ import annotations

import ray
from harness import Context, Row, interleave, median, row_from_samples

NUMBER, NAME, QUICK, SESSION = "1", "ray-call", True, ("four",)


def run(ctx: Context) -> list[Row]:
    bench, actors = ctx.ray.twinkle("four"), ctx.ray.raw("four")
    calls, rounds = (1, 150) if ctx.quick else (1, 600)

    def twinkle() -> None:
        for _ in range(calls):
            bench.noop()(60)

    def raw() -> None:
        for _ in range(calls):
            ray.get([a.noop.remote() for a in actors], timeout=60)

    handles = bench.__dict__["_twinkle_binding"].workers.handles  # a diagnostic reaches in

    def hosted() -> None:
        for _ in range(calls):
            ray.get([h.noop.remote() for h in handles], timeout=60)

    samples = interleave({"twinkle": twinkle, "raw": raw, "hosted": hosted}, rounds, per=calls)
    ratio = median(samples["hosted"]) / median(samples["raw"])
    return [
        row_from_samples(
            NUMBER,
            "Ray: no-op call to 4 workers, resolved",
            samples,
            note=f"twinkle's actors called with raw Ray: x{ratio:.2f} of raw (the worker side)",
            extra={"hosted_s": median(samples["hosted"])},
        )
    ]

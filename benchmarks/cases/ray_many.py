"""2. 1000 Ray calls issued, then resolved: cost per call (150 in quick mode), with a small
config dict (the headline), with an 8x8 array, and with no argument.

On a one-worker group against one plain actor of the same class (`bench_ops.Ops`):
- dict (the row's twinkle and raw figures): twinkle issues 1000 `one.take(CONFIG)` (each
  returns a LazyCollect at once; `dispatch='all'` hands the worker the dict), then resolves
  every LazyCollect; raw issues 1000 `actor.take.remote(CONFIG)`, then `ray.get` of the list.
  `CONFIG` is case 1's `{"step": 3, "lr": 1e-4, "tags": ["a", "b"]}`.
- array (in the note and `extra`): the same with case 1's `ARRAY`, an 8x8 float32 numpy array.
- no argument (in the note and `extra`): 1000 `one.noop()` against 1000 `actor.noop.remote()`.
- dict resolved with `twinkle_core.get` (in the note and `extra`): the same 1000 calls as the
  headline's, resolved with one `get(lazies)` (one `ray.get` of every call's refs), against
  the headline's raw figure: the very idiom raw Ray uses.
- raw Ray on twinkle's own actor (in the note and `extra`, "hosted"): 1000
  `handle.take.remote(CONFIG)` on the actor twinkle's worker runs in, then `ray.get` of the
  list, against the headline's twinkle figure: the same worker process on both sides, so what
  remains is the driver's part (the plain actor of the headline is another process).
Fair because in every variant both sides queue the same 1000 actor tasks, with the very same
argument object (sent inline with each task by both), on one worker running the same method,
and fetch every result; the ratio is what twinkle adds per call when calls are pipelined
rather than waited for one by one. The eight variants run in the same interleaved rounds.
"""

from __future__ import annotations

import ray
from harness import Context, Row, interleave, median, row_from_samples

from cases.ray_call import CONFIG, argument_variants, side_figures, side_note
from twinkle_core import get

NUMBER, NAME, QUICK, SESSION = "2", "ray-many", True, ("one",)


def run(ctx: Context) -> list[Row]:
    one, (actor,) = ctx.ray.twinkle("one"), ctx.ray.raw("one")
    # Rounds of 1000 calls vary by +-40% on a shared 2-core machine, so the more the steadier
    # the medians: with 50 rounds the same calls gave 1.08-1.10 in four runs, with 6-10 rounds
    # 1.05-1.25. 30 rounds of the 8 variants take about 80 s (quick mode: 3 of 150 calls).
    calls, rounds = (150, 3) if ctx.quick else (1000, 30)

    def twinkle_with(value):
        def go() -> None:
            lazies = [one.take(value) for _ in range(calls)]
            for lazy in lazies:
                lazy(120)

        return go

    def raw_with(value):
        def go() -> None:
            refs = [actor.take.remote(value) for _ in range(calls)]
            ray.get(refs, timeout=120)

        return go

    def twinkle_none() -> None:
        lazies = [one.noop() for _ in range(calls)]
        for lazy in lazies:
            lazy(120)

    def raw_none() -> None:
        refs = [actor.noop.remote() for _ in range(calls)]
        ray.get(refs, timeout=120)

    def twinkle_get() -> None:
        get([one.take(CONFIG) for _ in range(calls)], 120)

    hosted = one.__dict__["_twinkle_binding"].workers.handles[0]  # a diagnostic reaches in

    def raw_hosted() -> None:
        ray.get([hosted.take.remote(CONFIG) for _ in range(calls)], timeout=120)

    variants = argument_variants(twinkle_with, raw_with, twinkle_none, raw_none)
    variants["twinkle-get"] = twinkle_get
    variants["raw-hosted"] = raw_hosted
    samples = interleave(variants, rounds, per=calls, warmup=1)
    figures = side_figures(samples, ("array", "none"))
    with_get, raw = median(samples["twinkle-get"]), median(samples["raw"])
    figures["get"] = {"twinkle_s": with_get, "raw_s": raw, "ratio": with_get / raw}
    twinkle, on_own = median(samples["twinkle"]), median(samples["raw-hosted"])
    figures["hosted"] = {"twinkle_s": twinkle, "raw_s": on_own, "ratio": twinkle / on_own}
    return [
        row_from_samples(
            NUMBER,
            f"Ray: {calls} calls with a small dict issued then resolved",
            samples,
            note=side_note(figures),
            extra=figures,
        )
    ]

"""1. One call to 4 Ray workers, resolved: with a small config dict (the headline), with an 8x8
array, and with no argument.

Real calls carry arguments, so the headline figure is a call with one:
- dict (the row's twinkle and raw figures): twinkle `bench.take(CONFIG)(60)` on a group of 4
  workers (`dispatch='all'`: every worker gets the dict; collect='none'), `CONFIG` being
  `{"step": 3, "lr": 1e-4, "tags": ["a", "b"]}`; raw: `ray.get([a.take.remote(CONFIG) for a in
  actors])` on 4 plain actors of the same class.
- array (in the note and `extra`): the same with `ARRAY`, an 8x8 float32 numpy array (256
  bytes), in place of the dict.
- no argument (in the note and `extra`): twinkle `bench.noop()(60)`, raw `ray.get([a.noop.remote()
  for a in actors])`: the call path alone.
`take` returns a constant and `noop` None, so each call's cost is the trip, the arguments and
the result, not the method. Fair because in every variant both sides run the same user code
(`bench_ops.Ops`) on the same cluster, make the same 4 actor calls with the very same argument
object (which Ray and twinkle both send inline with each task: it is far below 100 KiB) and
wait for all 4 results; what is left is twinkle's dispatch, bookkeeping and collection. The six
variants, and "hosted", run in the same interleaved rounds.

"hosted" (extra, in the note): twinkle's own actors called with raw Ray and the dict,
`ray.get([h.take.remote(CONFIG) for h in handles])`: what the worker side (twinkle's actor
class around the user's object) costs, apart from the driver's path, against raw with the dict.
"""

from __future__ import annotations

import numpy as np
import ray
from harness import Context, Row, fmt_time, interleave, median, row_from_samples

NUMBER, NAME, QUICK, SESSION = "1", "ray-call", True, ("four",)

#: The realistic small arguments of cases 1-3 (case 2 and 3 import them from here).
CONFIG = {"step": 3, "lr": 1e-4, "tags": ["a", "b"]}
ARRAY = np.arange(64, dtype=np.float32).reshape(8, 8)


def argument_variants(twinkle_with, raw_with, twinkle_none, raw_none) -> dict:
    """The six variants of cases 1-3, by the names `side_figures` reads: the dict (headline),
    the array and no argument, each for twinkle and raw."""
    return {
        "twinkle": twinkle_with(CONFIG),
        "raw": raw_with(CONFIG),
        "twinkle-array": twinkle_with(ARRAY),
        "raw-array": raw_with(ARRAY),
        "twinkle-none": twinkle_none,
        "raw-none": raw_none,
    }


def side_figures(samples: dict[str, list[float]], kinds: tuple[str, ...]) -> dict[str, dict]:
    """Per variant kind other than the headline ('array', 'none'): twinkle's and raw's medians
    (variants `twinkle-<kind>`, `raw-<kind>`) and their ratio."""
    out = {}
    for kind in kinds:
        t, r = median(samples[f"twinkle-{kind}"]), median(samples[f"raw-{kind}"])
        out[kind] = {"twinkle_s": t, "raw_s": r, "ratio": t / r if r > 0 else float("inf")}
    return out


def side_note(figures: dict[str, dict]) -> str:
    """The note's part for `side_figures`: '8x8 array: 2.1 ms vs 2.0 ms (x1.05); ...'."""
    label = {
        "array": "8x8 float32 array",
        "none": "no argument",
        "get": "dict, resolved with twinkle_core.get",
        "hosted": "dict, raw Ray on twinkle's own actor",
    }
    return "; ".join(
        f"{label[k]}: {fmt_time(f['twinkle_s'])} vs {fmt_time(f['raw_s'])} (x{f['ratio']:.2f})"
        for k, f in figures.items()
    )


def run(ctx: Context) -> list[Row]:
    bench, actors = ctx.ray.twinkle("four"), ctx.ray.raw("four")
    # 7 variants of one call each, calls with arguments dearer than without: 210 rounds (60
    # quick) take about what 600 (150) rounds of the former 3 no-argument variants did.
    rounds = 60 if ctx.quick else 210
    handles = bench.__dict__["_twinkle_binding"].workers.handles  # a diagnostic reaches in

    def twinkle_with(value):
        def go() -> None:
            bench.take(value)(60)

        return go

    def raw_with(value):
        def go() -> None:
            ray.get([a.take.remote(value) for a in actors], timeout=60)

        return go

    def twinkle_none() -> None:
        bench.noop()(60)

    def raw_none() -> None:
        ray.get([a.noop.remote() for a in actors], timeout=60)

    def hosted() -> None:
        ray.get([h.take.remote(CONFIG) for h in handles], timeout=60)

    variants = {
        **argument_variants(twinkle_with, raw_with, twinkle_none, raw_none),
        "hosted": hosted,
    }
    samples = interleave(variants, rounds)
    figures = side_figures(samples, ("array", "none"))
    hosted_ratio = median(samples["hosted"]) / median(samples["raw"])
    return [
        row_from_samples(
            NUMBER,
            "Ray: call with a small dict to 4 workers (dispatch='all'), resolved",
            samples,
            note=(
                f"{side_note(figures)}; twinkle's actors called with raw Ray (dict): "
                f"x{hosted_ratio:.2f} of raw (the worker side)"
            ),
            extra={**figures, "hosted_s": median(samples["hosted"])},
        )
    ]

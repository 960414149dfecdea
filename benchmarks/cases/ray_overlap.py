"""10. Overlap: two groups each running a 50 ms call at once, on Ray.

twinkle: `a = left.sleep(0.05); b = right.sleep(0.05); a(); b()` on two groups of 2 workers
(both LazyCollects issued before either is resolved). Baseline: a single 50 ms call, raw
(`ray.get` of `sleep(0.05)` on 2 plain actors). The ratio is ~1.0 when the two groups really
run at the same time, ~2.0 when calls to different groups are serialized. Extra figures: one
twinkle group alone, and two raw groups at once. The in-process backend is left out: it runs
calls one after another by design.
"""

from __future__ import annotations

import ray
from harness import Context, Row, interleave, median, row_from_samples

NUMBER, NAME, QUICK, SESSION = "10", "ray-overlap", False, ("left", "right")

SECONDS = 0.05


def run(ctx: Context) -> list[Row]:
    left, right = ctx.ray.twinkle("left"), ctx.ray.twinkle("right")
    raw_left, raw_right = ctx.ray.raw("left"), ctx.ray.raw("right")
    rounds = 5 if ctx.quick else 20

    def twinkle_both() -> None:
        a, b = left.sleep(SECONDS), right.sleep(SECONDS)
        a(60)
        b(60)

    def twinkle_one() -> None:
        left.sleep(SECONDS)(60)

    def raw_one() -> None:
        ray.get([h.sleep.remote(SECONDS) for h in raw_left], timeout=60)

    def raw_both() -> None:
        ray.get([h.sleep.remote(SECONDS) for h in (*raw_left, *raw_right)], timeout=60)

    samples = interleave(
        {
            "twinkle": twinkle_both,
            "raw": raw_one,
            "twinkle-one-group": twinkle_one,
            "raw-two-groups": raw_both,
        },
        rounds,
    )
    one = median(samples["twinkle-one-group"])
    return [
        row_from_samples(
            NUMBER,
            "Ray: two groups run a 50 ms call at once vs one raw 50 ms call (ideal 1.0)",
            samples,
            unit="wall",
            note=f"one twinkle group alone: {one * 1e3:.1f} ms",
            extra={
                "twinkle_one_group_s": one,
                "raw_two_groups_s": median(samples["raw-two-groups"]),
            },
        )
    ]

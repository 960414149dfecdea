"""3. Ray calls issued while the worker is busy: cost per call, with a small config dict (the
headline), with an 8x8 array and with no argument, and whether it grows with the number of
calls pending.

The worker is first given a blocking call (it waits for a file to appear); then N calls are
issued and timed (none can run yet, so all N are pending), the file is created and everything
is resolved. On a one-worker group against one plain actor of the same class (`bench_ops.Ops`):
- dict (the row's twinkle and raw figures): twinkle `one.block(path)` then N `one.take(CONFIG)`
  (`dispatch='all'` hands the worker the dict); raw `actor.block.remote(path)` then N
  `actor.take.remote(CONFIG)`. `CONFIG` is case 1's `{"step": 3, "lr": 1e-4, "tags": ["a",
  "b"]}`. The figure is the issuing time per call at N=1000; the same at N=500 and N=2000 shows
  whether a call gets dearer the more calls are pending (a per-call cost that scans pending
  calls would).
- array (in the note and `extra`): N=1000 calls with case 1's `ARRAY`, an 8x8 float32 numpy
  array, in place of the dict.
- no argument (in the note and `extra`): N=1000 `one.noop()` against `actor.noop.remote()`.
Fair because in every variant both sides queue the same tasks, with the very same argument
object (sent inline with each task by both), behind the same blocked worker running the same
methods. All variants run in the same interleaved rounds.

"raw, 5 us between calls" (extra, in the note): the raw dict loop with a 5 us busy-wait before
each `.remote()`, timed without the waits: Ray serves submissions issued back to back faster
than ones with anything between them, and this shows how much of the ratio that is (see
docs/performance.md, cases 1-3).
"""

from __future__ import annotations

import os
import tempfile
import time

import ray
from harness import Context, Row, interleave, median

from cases.ray_call import ARRAY, CONFIG, side_figures, side_note

NUMBER, NAME, QUICK, SESSION = "3", "ray-busy", False, ("one",)

SIZES = (500, 1000, 2000)  # of the dict variant; the others issue 1000
GAP_S = 5e-6
#: The argument of each variant kind: `take(value)`, or `noop()` for "none".
ARGS = {"dict": CONFIG, "array": ARRAY, "none": None}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(ctx: Context) -> list[Row]:
    one, (actor,) = ctx.ray.twinkle("one"), ctx.ray.raw("one")
    # Rounds vary by +-40% on a shared 2-core machine (see case 2): with 5 rounds (of 12000
    # calls each) the ratio moved between 0.92 and 1.29 across runs of the same code; with 15,
    # one run in three still had a raw median 15% below its own 500- and 2000-call medians
    # (session 31: 108 us against 127 and 128). 25 rounds (about 80 s; 1 in quick mode, plus
    # the warm-up round).
    rounds = 1 if ctx.quick else 25
    folder = tempfile.mkdtemp(prefix="twb-busy-", dir="/tmp")
    counter = iter(range(10**9))
    resolve: dict[str, list[float]] = {}

    def variant(kind: str, arg: str, n: int):
        """(name, timed function) of `kind` twinkle, raw or gap, issuing `n` calls with `arg`."""
        value = ARGS[arg]
        name = f"{kind}-{n}" if arg == "dict" else f"{kind}-{arg}-{n}"

        def go() -> float:
            path = os.path.join(folder, f"release-{next(counter)}")
            if kind == "twinkle":
                blocker = one.block(path)
                start = time.perf_counter()
                if arg == "none":
                    pending = [one.noop() for _ in range(n)]
                else:
                    pending = [one.take(value) for _ in range(n)]
                issued = time.perf_counter() - start
                open(path, "w").close()
                start = time.perf_counter()
                blocker(300)
                for lazy in pending:
                    lazy(300)
            else:  # raw, or raw with GAP_S of work before each call ("gap")
                blocker = actor.block.remote(path)
                start = time.perf_counter()
                if kind == "raw" and arg == "none":
                    pending = [actor.noop.remote() for _ in range(n)]  # the tight loop
                    issued = time.perf_counter() - start
                elif kind == "raw":
                    pending = [actor.take.remote(value) for _ in range(n)]  # the tight loop
                    issued = time.perf_counter() - start
                else:
                    pending = []
                    for _ in range(n):
                        _spin(GAP_S)
                        pending.append(actor.take.remote(value))
                    issued = time.perf_counter() - start - n * GAP_S
                open(path, "w").close()
                start = time.perf_counter()
                ray.get(blocker, timeout=300)
                ray.get(pending, timeout=300)
            resolve.setdefault(name, []).append((time.perf_counter() - start) / n)
            return issued

        return name, go

    specs = [(k, "dict", n) for n in SIZES for k in ("twinkle", "raw")]
    specs += [(k, arg, 1000) for arg in ("array", "none") for k in ("twinkle", "raw")]
    specs.append(("gap", "dict", 1000))
    variants = dict(variant(*spec) for spec in specs)
    try:
        samples = interleave(
            variants, rounds, per={k: int(k.rsplit("-", 1)[1]) for k in variants}, warmup=1
        )
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    med = {k: median(v) for k, v in samples.items()}
    growth_t = med["twinkle-2000"] / med["twinkle-500"]
    growth_r = med["raw-2000"] / med["raw-500"]
    figures = side_figures(
        {k.removesuffix("-1000"): v for k, v in samples.items() if k.endswith("-1000")},
        ("array", "none"),
    )
    return [
        Row(
            NUMBER,
            "Ray: 1000 calls with a small dict issued while the worker is busy (issue cost)",
            med["twinkle-1000"],
            med["raw-1000"],
            note=(
                f"{side_note(figures)}; "
                f"per call at 2000 vs 500 pending (dict): twinkle x{growth_t:.2f}, raw "
                f"x{growth_r:.2f}; raw with 5 us between calls: "
                f"{med['gap-1000'] * 1e6:.0f} us beyond the 5 us "
                f"(twinkle x{med['twinkle-1000'] / med['gap-1000']:.2f} of it)"
            ),
            extra={
                **figures,
                "issue_per_call_s": med,
                # the first sample of each is the warm-up round's
                "resolve_per_call_s": {k: median(v[1:]) for k, v in resolve.items()},
                "growth_2000_vs_500": {"twinkle": growth_t, "raw": growth_r},
            },
            samples=samples,
        )
    ]

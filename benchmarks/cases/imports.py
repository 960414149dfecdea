"""9. Import cost: `import twinkle_core` plus the first backend lookup, in a fresh process.

twinkle: `import twinkle_core; twinkle_core.plugins.get_plugin('backends', 'inprocess')` (the
lookup loads every installed plugin's entry point); raw: `import pluggy, numpy`, the two
libraries twinkle_core itself needs. Each sample is a fresh interpreter, timed inside it
(interpreter start-up excluded) in CPU time, which a busy machine does not inflate (the wall
time is in the note), twinkle and raw alternating. Fair because a program using
twinkle needs at least its dependencies; the ratio is the cost of twinkle's own modules and
plugin loading. The note says whether the lookup pulled in torch or ray.
"""

from __future__ import annotations

import sys

from harness import Context, Row, interleave, median, row_from_samples, run_child

NUMBER, NAME, QUICK, SESSION = "9", "imports", True, ()

TWINKLE = """
import sys, time
start, cpu = time.perf_counter(), time.process_time()
import twinkle_core
try:
    from twinkle_core.plugins import get_plugin
except ImportError:  # moved
    from twinkle_core.plugin import get_plugin
get_plugin("backends", "inprocess")
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
from harness import emit
emit({"s": elapsed, "cpu": cpu, "torch": "torch" in sys.modules, "ray": "ray" in sys.modules})
"""

RAW = """
import sys, time
start, cpu = time.perf_counter(), time.process_time()
import pluggy, numpy
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
from harness import emit
emit({"s": elapsed, "cpu": cpu})
"""


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 15
    heavy: set[str] = set()
    wall: dict[str, list[float]] = {"twinkle": [], "raw": []}

    def twinkle() -> float:
        result = run_child([sys.executable, "-c", TWINKLE], timeout=120)
        heavy.update(k for k in ("torch", "ray") if result[k])
        wall["twinkle"].append(result["s"])
        return result["cpu"]

    def raw() -> float:
        result = run_child([sys.executable, "-c", RAW], timeout=120)
        wall["raw"].append(result["s"])
        return result["cpu"]

    samples = interleave({"twinkle": twinkle, "raw": raw}, rounds, warmup=1)
    return [
        row_from_samples(
            NUMBER,
            "import twinkle_core + first backend lookup vs import pluggy, numpy",
            samples,
            unit="once, CPU time",
            note=(
                f"wall: {median(wall['twinkle'][1:]) * 1e3:.0f} ms vs "
                f"{median(wall['raw'][1:]) * 1e3:.0f} ms; imports "
                + (" and ".join(sorted(heavy)) if heavy else "neither torch nor ray")
            ),
            extra={
                "heavy_modules_imported": sorted(heavy),
                "wall_s": {k: median(v[1:]) for k, v in wall.items()},
            },
        )
    ]

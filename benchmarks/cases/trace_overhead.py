"""13. What the call timeline costs: off (13a) and on (13b), per in-process call.

The call: a no-op method on 2 workers in mode 'inprocess' with `isolate=False` (the cheapest
call twinkle makes, so any fixed cost of tracing shows at its largest).

- 13a, tracing off. twinkle: the call as it runs today, with tracing off. raw: the same call
  minus the measured cost of the statements tracing adds to the off path (one global read and
  `is None` test in the call pipeline and one per worker execution, the same code timed on
  its own in a loop of a million). The ratio is how much slower a call is because tracing
  exists; "nothing measurable" means it stays within noise of 1.00.
- 13b, tracing on. twinkle: the call while `initialize(trace=...)` records; raw: the same call
  with tracing off. The ratio is the price of recording (events, call ids, flow links); the
  file is written at shutdown, outside the timed calls.

Both timed in CPU time of the calling thread (all the work of both variants happens there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from harness import Context, Row, interleave, median, row_from_samples

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
from twinkle_core import trace as _trace

NUMBER, NAME, QUICK, SESSION = "13", "trace", True, ()


@remote_class()
class Noop:
    @remote_function(dispatch="all", collect="none")
    def ping(self):
        return None


def _off_path_cost(workers: int) -> float:
    """Seconds per call of the off-path statements tracing adds (1 + one per worker)."""
    n = 1_000_000
    mod = _trace

    def hooks() -> None:
        for _ in range(n):
            rec = mod.RECORDER
            if rec is not None:
                raise AssertionError("tracing is on")

    def empty() -> None:
        for _ in range(n):
            pass

    samples = interleave({"hooks": hooks, "empty": empty}, 5, per=n, clock=time.thread_time)
    per_check = max(median(samples["hooks"]) - median(samples["empty"]), 0.0)
    return per_check * (1 + workers)


def _calls(remote: Noop, count: int) -> None:
    for _ in range(count):
        remote.ping()()


def run(ctx: Context) -> list[Row]:
    rounds, per = (60, 50) if ctx.quick else (300, 100)
    rows = []
    initialize("inprocess", groups=[DeviceGroup("g", 2)], isolate=False)
    try:
        remote = Noop(remote_group="g")
        samples = interleave(
            {"twinkle": lambda: _calls(remote, per)}, rounds, per=per, clock=time.thread_time
        )
    finally:
        shutdown()
    hook = _off_path_cost(2)
    samples["raw"] = [s - hook for s in samples["twinkle"]]
    rows.append(
        row_from_samples(
            "13a",
            "trace off: in-process no-op call, 2 workers, vs the same without the off-path checks",
            samples,
            unit="per call, CPU time",
            note=f"off-path checks {hook * 1e9:.0f} ns per call",
            extra={"off_path_ns": hook * 1e9},
        )
    )

    directory = tempfile.mkdtemp(prefix="tw-bench-trace-")
    path = os.path.join(directory, "bench.json")
    initialize("inprocess", groups=[DeviceGroup("g", 2)], isolate=False)
    plain = Noop(remote_group="g")
    try:
        on = {}

        def traced() -> float:
            # Switch the recorder on only around the timed calls: one run, both variants.
            _trace.RECORDER = on["rec"]
            start = time.thread_time()
            _calls(plain, per)
            took = time.thread_time() - start
            _trace.RECORDER = None
            return took

        def untraced() -> None:
            _calls(plain, per)

        on["rec"] = _trace.Recorder(path)
        samples = interleave(
            {"twinkle": traced, "raw": untraced}, rounds, per=per, clock=time.thread_time
        )
        events = len(on["rec"].executions)
    finally:
        _trace.RECORDER = None
        shutdown()
        shutil.rmtree(directory, ignore_errors=True)
    rows.append(
        row_from_samples(
            "13b",
            "trace on: in-process no-op call, 2 workers, recorded vs not recorded",
            samples,
            unit="per call, CPU time",
            extra={"executions_recorded": events},
        )
    )
    return rows

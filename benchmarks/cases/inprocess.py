"""8. The in-process backend per call vs calling the plain objects (was inprocess_overhead.py).

A `slice_dp` + `mean` method on 4 workers with a 4096 x 64 batch. twinkle: the call through
mode 'inprocess'; raw: the same method called on 4 plain instances with the same 4 slices,
averaged by hand. 8a with the default `isolate=True` (arguments and results deep-copied, as a
transport would), 8b with `isolate=False`. Fair because the work per worker is identical; the
ratio is the in-process backend's dispatch, per-worker random-generator swapping, copying and
collection. The in-process backend is for tests and debugging, not a fast path. Timed in CPU
time of the calling thread (all the work of both variants happens there), so preemption by
other processes on a busy machine does not inflate the longer twinkle call more than the raw one.
"""

from __future__ import annotations

import time

import numpy as np
from harness import Context, Row, interleave, row_from_samples

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

NUMBER, NAME, QUICK, SESSION = "8", "inprocess", True, ()

WORKERS, ROWS = 4, 4096


@remote_class()
class Worker:
    def __init__(self) -> None:
        self.w = np.ones(64)

    @remote_function(dispatch="slice_dp", collect="mean")
    def step(self, batch):
        return float((batch @ self.w).mean())


def run(ctx: Context) -> list[Row]:
    calls, rounds = (1, 200) if ctx.quick else (1, 1000)
    batch = np.random.default_rng(0).normal(size=(ROWS, 64))
    plain = [Worker() for _ in range(WORKERS)]
    shard = ROWS // WORKERS

    def baseline() -> float:
        return sum(p.step(batch[i * shard : (i + 1) * shard]) for i, p in enumerate(plain)) / 4

    def raw() -> None:
        for _ in range(calls):
            baseline()

    rows = []
    for row_id, isolate in (("8a", True), ("8b", False)):
        initialize("inprocess", groups=[DeviceGroup("g", WORKERS)], isolate=isolate)
        try:
            remote = Worker(remote_group="g")
            assert abs(remote.step(batch)() - baseline()) < 1e-9

            def twinkle(remote=remote) -> None:
                for _ in range(calls):
                    remote.step(batch)()

            samples = interleave(
                {"twinkle": twinkle, "raw": raw}, rounds, per=calls, clock=time.thread_time
            )
        finally:
            shutdown()
        label = "isolate=True (default)" if isolate else "isolate=False"
        rows.append(
            row_from_samples(
                row_id,
                f"inprocess: slice_dp + mean on 4 workers, {label}",
                samples,
                unit="per call, CPU time",
            )
        )
    return rows

"""What one twinkle call costs on the in-process backend, as a ratio to calling plain objects.

The baseline calls the same method directly on N plain instances and combines the results by
hand; the twinkle run does the same through dispatch/execute/collect. Both are timed in this
run, so the ratio does not depend on how fast the machine is.

    python benchmarks/inprocess_overhead.py
"""

from __future__ import annotations

import time

import numpy as np

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

WORKERS, ROWS, REPEAT = 4, 4096, 300


@remote_class()
class Worker:
    def __init__(self) -> None:
        self.w = np.ones(64)

    @remote_function(dispatch="slice_dp", collect="mean")
    def step(self, batch):
        return float((batch @ self.w).mean())


def best_of(fn, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(REPEAT):
            fn()
        times.append((time.perf_counter() - start) / REPEAT)
    return min(times)


def main() -> None:
    batch = np.random.default_rng(0).normal(size=(ROWS, 64))
    plain = [Worker() for _ in range(WORKERS)]
    shard = ROWS // WORKERS

    def baseline():
        return sum(p.step(batch[i * shard : (i + 1) * shard]) for i, p in enumerate(plain)) / 4

    results = {}
    for isolate in (False, True):
        initialize("inprocess", groups=[DeviceGroup("g", WORKERS)], isolate=isolate)
        remote = Worker(remote_group="g")
        assert abs(remote.step(batch)() - baseline()) < 1e-9
        results[isolate] = best_of(lambda r=remote: r.step(batch)())
        shutdown()
    base = best_of(baseline)
    print(f"baseline (plain objects)        {base * 1e6:8.1f} us/call")
    print(
        f"twinkle inprocess, isolate=False {results[False] * 1e6:8.1f} us/call  "
        f"ratio {results[False] / base:5.2f}"
    )
    print(
        f"twinkle inprocess, isolate=True  {results[True] * 1e6:8.1f} us/call  "
        f"ratio {results[True] / base:5.2f}"
    )


if __name__ == "__main__":
    main()

"""Where a colocated role's call costs more than the first role's: the worker's CPU per call by
route, and the generator switch inside the actor.

Not a suite case (case 24 is): a look inside. One Ray cluster, a group of one worker holding
two `bench_ops.Bench` objects (slots 0 and 1 of one actor), 1000 `sample(CONFIG)` calls per
round (each draws one number from numpy's and one from python's generators).

1. Wall time, the worker process's CPU and the driver process's CPU per call (psutil; its
   clock ticks are 10 ms, so 10 us per call of 1000), in alternating rounds: raw Ray on
   twinkle's actor through the direct method ("direct"), through `_tw_call` for slot 0 (no
   switch) and slot 1 ("call0", "call1"); twinkle's first and second roles ("first",
   "second"). call0 over direct is what the call by name costs Ray; call1 over call0 the
   switch; second over call1 twinkle's driver side.
2. Inside the actor (`timeit` through `_tw_apply`): `_tw_run` of the method for slot 0 and
   slot 1, and one `WorkerState.activate()` of slot 1 around nothing.

    cd benchmarks && python ab_colocated_calls.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import psutil
import ray
from cases.ray_call import CONFIG
from harness import ab_session

CALLS, WARMUP = 1000, 2


def _inside(sample_arg: Any) -> dict[str, float]:
    """Run in the actor (`_tw_apply`): microseconds per `_tw_run` of slot 0 and 1, and per
    activation of slot 1's worker state."""
    import gc
    import timeit

    from twinkle_ray.actor import TwinkleActor

    actor = next(o for o in gc.get_objects() if isinstance(o, TwinkleActor))
    state = actor._tw_slots[1][2]

    def activate() -> None:
        with state.activate():
            pass

    def run(slot: int):
        return lambda: actor._tw_run("sample", (sample_arg,), {}, slot)

    n = 5000
    best = {
        name: min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6
        for name, fn in (("run slot 0", run(0)), ("run slot 1", run(1)), ("activate", activate))
    }
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds of every variant (30)")
    rounds = parser.parse_args().rounds
    from bench_ops import Bench

    from twinkle_ray.actor import call_key

    with ab_session(CONFIG, 1) as (first, _):
        second = Bench(remote_group="ab")  # colocated: slot 1 of the same actor
        second.take(CONFIG)()
        handle = first.__dict__["_twinkle_binding"].workers.handles[0]  # a diagnostic
        worker = psutil.Process(ray.get(handle._tw_apply.remote(os.getpid)))
        driver = psutil.Process()

        def raw(method: str, *lead: Any):
            def go() -> None:
                bound = getattr(handle, method)
                ray.get([bound.remote(*lead, CONFIG) for _ in range(CALLS)])

            return go

        def role(obj: Any):
            def go() -> None:
                for lazy in [obj.sample(CONFIG) for _ in range(CALLS)]:
                    lazy(120)

            return go

        variants = {
            "direct": raw("sample"),
            "call0": raw("_tw_call", call_key(0, "sample", False)),
            "call1": raw("_tw_call", call_key(1, "sample", False)),
            "first": role(first),
            "second": role(second),
        }
        samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in variants}
        for r in range(-WARMUP, rounds):
            order = list(variants.items()) if r % 2 == 0 else list(variants.items())[::-1]
            for name, go in order:
                w0, d0 = sum(worker.cpu_times()[:2]), sum(driver.cpu_times()[:2])
                start = time.perf_counter()
                go()
                wall = time.perf_counter() - start
                w1, d1 = sum(worker.cpu_times()[:2]), sum(driver.cpu_times()[:2])
                if r >= 0:
                    samples[name].append((wall, w1 - w0, d1 - d0))
        for name, rows in samples.items():
            wall, w, d = (statistics.median(x[i] for x in rows) / CALLS * 1e6 for i in range(3))
            print(f"{name:7s} wall {wall:6.1f} us, worker CPU {w:6.1f} us, driver CPU {d:6.1f} us")
        inside = ray.get(handle._tw_apply.remote(_inside, CONFIG))
        print("inside the actor: " + ", ".join(f"{k} {v:.1f} us" for k, v in inside.items()))


if __name__ == "__main__":
    sys.exit(main())

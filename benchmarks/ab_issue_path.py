"""Where a pipelined call's driver time goes, in one process: twinkle's own Python per call,
what it adds once it runs between Ray's submissions, and the garbage collections that calls in
flight bring.

Not a suite case: a look inside twinkle's issue path against Ray's own. One Ray cluster, a
group of one worker (or `--workers N`) and as many plain actors, 1000 calls with case 1's
config dict per round (`dispatch='all'`: every worker gets the dict).

1. The driver thread's CPU per issued call (`time.thread_time`), in alternating rounds:
   "ray", 1000 calls' `.remote()` of twinkle's actor method, one per worker (Ray's
   submission alone); "own", 1000 twinkle calls with that submission replaced by a finished
   ref (twinkle's Python alone); "both", the two interleaved (a stubbed twinkle call, then
   its `.remote()`s); "twinkle", 1000 twinkle calls. "both" over "ray" + "own" is what
   running between submissions adds.
2. Python's garbage collections (`gc.callbacks`) while 1000 calls are issued then resolved,
   twinkle against raw Ray, counted per generation, with their time.
3. Collecting 1000 calls that all finished (driver thread CPU per call): twinkle's
   LazyCollects one by one in a loop (the finished ones behind each are fetched together:
   `twinkle_ray/read_ahead.py`), the same with that look-ahead turned off (one `ray.get` per
   call), and with one `twinkle_core.get`; raw Ray's `ray.get` of each ref in a loop, and of
   the list.
4. The two phases of 1000 calls issued then resolved (case 2's shape), with case 1's dict and
   with no argument: wall time and driver thread CPU per call of issuing and of resolving,
   twinkle's LazyCollects one by one against raw Ray's `ray.get` of the list.
5. Raw Ray alone, 1000 calls issued then resolved with `BURST_WORK_S` of Python work per call
   (a stand-in for what a library does per call): the work between every two `.remote()`s,
   or done for `k` calls and their `.remote()`s then made back to back ("burst k"), against
   the tight loop without the work. What submitting in bursts would win back; twinkle
   submits each call as it is made.
6. Where the CPU goes, by process and thread: 1000 calls issued then resolved (case 2's
   shape, case 1's dict), twinkle's LazyCollects one by one against raw Ray's `ray.get` of
   the list, in alternating rounds; per call, the CPU of the driver's main thread, of the
   driver's other (Ray's) threads, and of the worker process that ran the calls (twinkle's
   actor, or the plain one), read from each thread's `/proc/<pid>/task/<tid>/schedstat`
   (nanoseconds on the CPU; psutil's clock ticks where the kernel keeps no schedstat).
   On a 2-core machine the processes share the cores, so every microsecond of CPU in any of
   them is about half a microsecond of wall time.
7. What work between two submissions costs the next one: 1000 `.remote()`s of twinkle's actor
   method, each after some work, in alternating rounds; per call, the driver thread's CPU of
   the work and of the `.remote()` after it (`time.thread_time` around each, so about 0.6 us
   of each figure is the clock's own). The work: none ("tight"), making 8 small dicts, walking
   256 KiB or 4 MiB of memory (every 64th byte: one read per cache line), and a twinkle call
   with Ray's submission stubbed (twinkle's own Python, as in part 1).

    cd benchmarks && python ab_issue_path.py [--workers 4]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from typing import Any

import ray
from cases.ray_call import CONFIG
from harness import ab_session, interleave

CALLS, ROUNDS, WARMUP = 1000, 15, 2


class _Finished:
    """Stands in for Ray's actor method: `.remote()` returns a finished ref at once."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.ref


class _AllStub(dict):
    """Stands in for the group's cache of actor methods: every method is the stub."""

    def __init__(self, stub: _Finished) -> None:
        super().__init__()
        self.stub = stub

    def __missing__(self, key: Any) -> Any:
        return self.stub


def _issue_cpu(one: Any, methods: list[Any]) -> dict[str, float]:
    """Part 1: median driver-thread CPU per call, microseconds, of each variant."""
    group = one.__dict__["_twinkle_binding"].workers  # a diagnostic reaches in
    stub = _Finished(methods[0].remote(CONFIG))
    ray.get(stub.ref)

    def submit() -> list:
        return [m.remote(CONFIG) for m in methods]

    def stubbed(fn):
        def run() -> list:
            # The group's actor methods, and their cache `_send` reads inline: undone below.
            cached, group._methods = group._methods, _AllStub(stub)
            group.actor_method = lambda rank, name: stub  # instance attribute
            try:
                return fn()
            finally:
                del group.actor_method
                group._methods = cached

        return run

    variants = {
        "ray": lambda: [x for _ in range(CALLS) for x in submit()],
        "own": stubbed(lambda: [one.take(CONFIG) for _ in range(CALLS)]),
        "both": stubbed(lambda: [x for _ in range(CALLS) for x in (one.take(CONFIG), *submit())]),
        "twinkle": lambda: [one.take(CONFIG) for _ in range(CALLS)],
    }
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(ROUNDS + WARMUP):
        for name in variants if r % 2 else reversed(variants):
            start = time.thread_time()
            out = variants[name]()
            took = time.thread_time() - start
            ray.get([x for x in out if isinstance(x, ray.ObjectRef)], timeout=300)
            [x(300) for x in out if not isinstance(x, ray.ObjectRef)]
            del out  # freed here, not inside the next round's time
            if r >= WARMUP:
                samples[name].append(took / CALLS * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def _collections(one: Any, actors: list[Any]) -> dict[str, list[float]]:
    """Part 2: per variant, collections of generations 0, 1, 2 and their seconds, in all."""
    counts = {"twinkle": [0.0, 0.0, 0.0, 0.0], "raw": [0.0, 0.0, 0.0, 0.0]}
    current = ["twinkle"]
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            row = counts[current[0]]
            row[info["generation"]] += 1
            row[3] += time.perf_counter() - started[0]

    def twinkle() -> None:
        for lazy in [one.take(CONFIG) for _ in range(CALLS)]:
            lazy(300)

    def raw() -> None:
        ray.get([a.take.remote(CONFIG) for _ in range(CALLS) for a in actors], timeout=300)

    gc.callbacks.append(on_gc)
    try:
        for _ in range(ROUNDS):
            for name, fn in (("twinkle", twinkle), ("raw", raw)):
                current[0] = name
                fn()
    finally:
        gc.callbacks.remove(on_gc)
    return counts


def _collect_finished(one: Any, actors: list[Any]) -> dict[str, float]:
    """Part 3: median driver-thread CPU per call, microseconds, of collecting 1000 calls
    that all finished (waited for with a `ray.wait` that fetches nothing, untimed)."""
    from twinkle_core import get

    def finished(refs: list[Any]) -> None:
        ray.wait(refs, num_returns=len(refs), timeout=300, fetch_local=False)

    def twinkle_calls() -> list[Any]:
        lazies = [one.take(CONFIG) for _ in range(CALLS)]
        finished([r for lazy in lazies for r in lazy.source.pending.value_refs])
        return lazies

    def raw_refs() -> list[Any]:
        refs = [a.take.remote(CONFIG) for _ in range(CALLS) for a in actors]
        finished(refs)
        return refs

    from twinkle_ray.read_ahead import ReadAhead

    looking = ReadAhead.after_fetch

    def without_look_ahead(lazies: list[Any]) -> list[Any]:
        ReadAhead.after_fetch = lambda self, settled, ask: None  # type: ignore[method-assign]
        try:
            return [lazy(300) for lazy in lazies]
        finally:
            ReadAhead.after_fetch = looking  # type: ignore[method-assign]

    variants = {
        "twinkle, one by one": (twinkle_calls, lambda lazies: [lazy(300) for lazy in lazies]),
        "twinkle, one by one, no look-ahead": (twinkle_calls, without_look_ahead),
        "twinkle, get": (twinkle_calls, lambda lazies: get(lazies, timeout=300)),
        "raw, one by one": (raw_refs, lambda refs: [ray.get(r, timeout=300) for r in refs]),
        "raw, list": (raw_refs, lambda refs: ray.get(refs, timeout=300)),
    }

    def timed(make: Any, collect: Any) -> Any:
        def run() -> float:  # the calls made and finished untimed; their collecting timed
            made = make()
            start = time.thread_time()
            collect(made)
            return time.thread_time() - start

        return run

    samples = interleave(
        {name: timed(*pair) for name, pair in variants.items()}, ROUNDS, per=CALLS, warmup=WARMUP
    )
    return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def _phases(one: Any, actor: Any) -> dict[str, list[float]]:
    """Part 4: per variant, medians of (issue wall, issue CPU, resolve wall, resolve CPU), us
    per call, of 1000 calls issued then resolved on one worker."""

    def each(lazies: list[Any]) -> None:
        for lazy in lazies:
            lazy(300)

    variants = {
        "twinkle, dict": (lambda: [one.take(CONFIG) for _ in range(CALLS)], each),
        "raw, dict": (
            lambda: [actor.take.remote(CONFIG) for _ in range(CALLS)],
            lambda refs: ray.get(refs, timeout=300),
        ),
        "twinkle, no argument": (lambda: [one.noop() for _ in range(CALLS)], each),
        "raw, no argument": (
            lambda: [actor.noop.remote() for _ in range(CALLS)],
            lambda refs: ray.get(refs, timeout=300),
        ),
    }
    samples: dict[str, list[list[float]]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(ROUNDS + WARMUP):
        for name in names if r % 2 else names[::-1]:
            issue, resolve = variants[name]
            wall, cpu = time.perf_counter(), time.thread_time()
            made = issue()
            issued, issued_cpu = time.perf_counter(), time.thread_time()
            resolve(made)
            end, end_cpu = time.perf_counter(), time.thread_time()
            if r >= WARMUP:
                row = [issued - wall, issued_cpu - cpu, end - issued, end_cpu - issued_cpu]
                samples[name].append([x / CALLS * 1e6 for x in row])
    return {k: [statistics.median(col) for col in zip(*v, strict=True)] for k, v in samples.items()}


#: Python work per call in part 5, about what twinkle's own issue path takes.
BURST_WORK_S = 10e-6


def _bursts(actor: Any) -> dict[str, tuple[float, float]]:
    """Part 5: per variant, medians of (wall, driver thread CPU while issuing), us per call."""

    def spin() -> None:
        end = time.perf_counter() + BURST_WORK_S
        while time.perf_counter() < end:
            pass

    def tight() -> list[Any]:
        return [actor.take.remote(CONFIG) for _ in range(CALLS)]

    def between() -> list[Any]:
        refs = []
        for _ in range(CALLS):
            spin()
            refs.append(actor.take.remote(CONFIG))
        return refs

    def burst(k: int) -> Any:
        def go() -> list[Any]:
            refs: list[Any] = []
            for _ in range(CALLS // k):
                made = []
                for _ in range(k):
                    spin()
                    made.append((CONFIG,))
                refs.extend([actor.take.remote(*args) for args in made])
            return refs

        return go

    variants = {
        "tight loop (no work)": tight,
        "work between submissions": between,
        "burst 16": burst(16),
        "burst 64": burst(64),
    }
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(2 * ROUNDS + WARMUP):  # rounds of 1000 raw calls are short
        for name in names if r % 2 else names[::-1]:
            wall, cpu = time.perf_counter(), time.thread_time()
            refs = variants[name]()
            issued_cpu = time.thread_time() - cpu
            ray.get(refs, timeout=300)
            if r >= WARMUP:
                samples[name].append(((time.perf_counter() - wall) / CALLS, issued_cpu / CALLS))
    return {
        k: (statistics.median(w for w, _ in v) * 1e6, statistics.median(c for _, c in v) * 1e6)
        for k, v in samples.items()
    }


def _thread_cpu(pid: int) -> dict[int, float]:
    """Seconds on the CPU of each thread of process `pid`, by thread id."""
    folder = f"/proc/{pid}/task"
    out: dict[int, float] = {}
    try:
        tids = os.listdir(folder)
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"{folder}/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    if not out:  # no schedstat in this kernel: psutil's per-thread user + system ticks
        import psutil

        for t in psutil.Process(pid).threads():
            out[t.id] = t.user_time + t.system_time
    return out


def _cpu_by_thread(one: Any, actor: Any) -> dict[str, dict[str, float]]:
    """Part 6: per variant, median us of CPU per call of the driver's main thread, its other
    threads, and the worker process that ran the calls."""
    hosted = one.__dict__["_twinkle_binding"].workers.handles[0]  # a diagnostic reaches in
    worker_pid = {
        "twinkle": ray.get(hosted.__ray_call__.remote(lambda self: os.getpid()), timeout=60),
        "raw": ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60),
    }
    driver, main_tid = os.getpid(), threading.get_native_id()  # run from the main thread

    def twinkle() -> None:
        for lazy in [one.take(CONFIG) for _ in range(CALLS)]:
            lazy(300)

    def raw() -> None:
        ray.get([actor.take.remote(CONFIG) for _ in range(CALLS)], timeout=300)

    variants = {"twinkle": twinkle, "raw": raw}
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for r in range(2 * ROUNDS + WARMUP):
        for name in variants if r % 2 else reversed(variants):
            before_d, before_w = _thread_cpu(driver), _thread_cpu(worker_pid[name])
            start = time.perf_counter()
            variants[name]()
            wall = time.perf_counter() - start
            after_d, after_w = _thread_cpu(driver), _thread_cpu(worker_pid[name])
            if r < WARMUP:
                continue
            spent = {t: after_d[t] - before_d.get(t, 0.0) for t in after_d}
            main = spent.pop(main_tid, 0.0)
            worker = sum(after_w[t] - before_w.get(t, 0.0) for t in after_w)
            row = {"wall": wall, "driver main": main, "driver other": sum(spent.values())}
            row["worker"] = worker
            samples[name].append({k: v / CALLS * 1e6 for k, v in row.items()})
    return {
        name: {k: statistics.median(s[k] for s in rows) for k in rows[0]}
        for name, rows in samples.items()
    }


#: Part 7's memory walks: bytes, and a buffer as large as the largest.
WALKS = {"walk 256 KiB": 256 * 1024, "walk 4 MiB": 4 * 1024 * 1024}


def _work_then_submit(one: Any, method: Any) -> dict[str, tuple[float, float]]:
    """Part 7: per kind of work, medians of (CPU of the work, CPU of the `.remote()` after
    it), us per call."""
    group = one.__dict__["_twinkle_binding"].workers  # a diagnostic reaches in
    stub = _Finished(method.remote(CONFIG))
    ray.get(stub.ref)
    memory = bytearray(max(WALKS.values()))
    cached = group._methods

    def walk(size: int):
        return lambda: sum(memory[:size:64])

    works = {
        "tight": lambda: None,
        "8 small dicts": lambda: [{"a": i, "b": i, "c": (i, i)} for i in range(8)],
        **{name: walk(size) for name, size in WALKS.items()},
        "twinkle, stubbed": lambda: one.take(CONFIG),
    }
    clock = time.thread_time
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in works}
    names = list(works)
    for r in range(ROUNDS + WARMUP):
        for name in names if r % 2 else names[::-1]:
            work, stubbed = works[name], name.startswith("twinkle")
            refs, kept, spent, submitted = [], [], 0.0, 0.0
            for _ in range(CALLS):
                if stubbed:
                    group.actor_method = lambda rank, method: stub  # undone below
                    group._methods = _AllStub(stub)
                start = clock()
                kept.append(work())
                mid = clock()
                if stubbed:
                    del group.actor_method
                    group._methods = cached
                between = clock()
                refs.append(method.remote(CONFIG))
                spent, submitted = spent + mid - start, submitted + clock() - between
            ray.get(refs, timeout=300)
            [x(300) for x in kept if callable(x)]
            if r >= WARMUP:
                samples[name].append((spent / CALLS * 1e6, submitted / CALLS * 1e6))
    return {
        k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
        for k, v in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="workers of the group (1)")
    workers = parser.parse_args().workers
    with ab_session(CONFIG, workers) as (one, actors):
        group = one.__dict__["_twinkle_binding"].workers
        methods = [group.actor_method(rank, "take") for rank in range(workers)]
        cpu = _issue_cpu(one, methods)
        print(
            "driver thread CPU per issued call: "
            + ", ".join(f"{k} {v:.1f} us" for k, v in cpu.items())
            + f"; both - (ray + own) = {cpu['both'] - cpu['ray'] - cpu['own']:.1f} us"
        )
        collect = _collect_finished(one, actors)
        print(
            f"collecting {CALLS} finished calls, driver thread CPU per call: "
            + ", ".join(f"{k} {v:.1f} us" for k, v in collect.items())
        )
        for name, row in _phases(one, actors[0]).items():
            print(
                f"{name}: issue {row[0]:.1f} us (driver thread CPU {row[1]:.1f}), resolve "
                f"{row[2]:.1f} us (CPU {row[3]:.1f}), in all {row[0] + row[2]:.1f} us per call"
            )
        bursts = _bursts(actors[0])
        print(
            f"raw Ray, {BURST_WORK_S * 1e6:.0f} us of work per call, issued then resolved, per "
            "call: " + ", ".join(f"{k} {v[0]:.1f} us (CPU {v[1]:.1f})" for k, v in bursts.items())
        )
        calls = ROUNDS * CALLS
        for name, (g0, g1, g2, seconds) in _collections(one, actors).items():
            print(
                f"{name}: {calls} calls issued then resolved: collections of generation 0/1/2 "
                f"{g0:.0f}/{g1:.0f}/{g2:.0f}, {seconds * 1e3:.0f} ms "
                f"({seconds / calls * 1e6:.1f} us per call)"
            )
        for name, (work, submit) in _work_then_submit(one, methods[0]).items():
            print(
                f"{name}: the work {work:.1f} us of driver thread CPU, the .remote() after it "
                f"{submit:.1f} us"
            )
        for name, row in _cpu_by_thread(one, actors[0]).items():
            print(
                f"{name}: CPU per call issued then resolved: "
                + ", ".join(f"{k} {v:.1f} us" for k, v in row.items() if k != "wall")
                + f" (wall {row['wall']:.1f} us)"
            )


if __name__ == "__main__":
    sys.exit(main())

"""Shared helpers of the benchmark suite: interleaved timing, medians, result rows, child
processes, and the one Ray cluster the in-process Ray cases share.

Every case times twinkle and its raw baseline *alternately* (round 1: A then B, round 2: B then
A, ...), so a machine that slows down or speeds up during the run affects both the same way,
and reports medians: a ratio twinkle/raw measured this way does not depend on how fast or how
busy the machine is, only on what twinkle adds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
#: Marks the line of a child process's output that carries its JSON result.
JSON_MARK = "BENCH-JSON "


# ------------------------------------------------------------------------------- timing
def interleave(
    variants: dict[str, Callable[[], float | None]],
    rounds: int,
    *,
    per: int | dict[str, int] = 1,
    warmup: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Run every variant once per round, alternating the order; return seconds per unit.

    Rounds are kept short (one call each where a call is short) so that preemption by other
    processes on a busy machine hits single samples, which the median then ignores, rather
    than every long block of the slower variant.

    A variant that returns a number reports its own elapsed seconds (it timed only part of
    what it did, e.g. issuing calls but not waiting for them); otherwise its wall time counts.
    Each sample is divided by `per` (the number of calls a round makes), so samples are per
    call. The first `warmup` rounds are not recorded. `clock` is wall time by default;
    `time.thread_time` (CPU time of this thread) suits work done entirely in this thread, and
    keeps a ratio honest on an overloaded machine, where a long call is far more likely than a
    short one to be preempted.
    """
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(-warmup, rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            start = clock()
            got = variants[name]()
            elapsed = clock() - start if got is None else float(got)
            if r >= 0:
                n = per[name] if isinstance(per, dict) else per
                samples[name].append(elapsed / n)
    return samples


def median(values: list[float]) -> float:
    return float(statistics.median(values))


#: A round slower than this many times its variant's median is a slow round.
SLOW_FACTOR = 2.0


def slow_rounds(samples: dict[str, list[float]], factor: float = SLOW_FACTOR) -> dict[str, Any]:
    """Per variant with slow rounds (over `factor` x its median, at least 3 rounds): how many
    of how many, and the slowest as a multiple of the median. A median hides such rounds (the
    object store growing into untouched memory, another job preempting); the table shows them
    instead."""
    out: dict[str, Any] = {}
    for name, values in samples.items():
        if len(values) < 3:
            continue
        mid = median(values)
        if mid <= 0:
            continue
        slow = [v for v in values if v > factor * mid]
        if slow:
            out[name] = {"slow": len(slow), "rounds": len(values), "worst_x": max(slow) / mid}
    return out


def fmt_value(value: float | None, unit: str) -> str:
    """A row's figure: a time, or a count or size when the row measures one."""
    if value is not None and unit == "bytes":
        return f"{value / 2**20:.0f} MiB"
    if value is not None and unit == "count":
        return f"{value:g}"
    return fmt_time(value)


def fmt_time(seconds: float | None) -> str:
    """Seconds as a short human figure: 812 us, 3.21 ms, 1.52 s."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us" if seconds >= 1e-5 else f"{seconds * 1e6:.2f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


@contextlib.contextmanager
def ab_session(value: Any, workers: int = 1) -> Iterator[tuple[Any, list[Any]]]:
    """For the A/B scripts beside the suite (`ab_*.py`): an embedded Ray cluster started as
    the suite starts its own (`start_ray`: workers at the driver's niceness, as in a cluster
    twinkle starts), a twinkle group `ab` of `workers` running `bench_ops.Bench` and as many
    plain actors of `bench_ops.Ops`, all warmed up with one `take(value)`; yields (the
    twinkle object, the actors) and shuts both down after.

    Before session 28 this called `ray.init` itself, so its workers ran at Ray's default
    niceness of 15 under a driver at 0, unlike the suite's and twinkle's own clusters (nice
    0): the scheduler then favoured the driver over the worker it competes with for the two
    cores, and figures measured here differed from the suite's (`ab_issue_path.py`)."""
    import ray
    from bench_ops import Bench, Ops

    from twinkle_core import DeviceGroup, initialize, shutdown

    temp_dir = start_ray(num_cpus=4)
    cpus = 1 if workers == 1 else 0.5
    try:
        initialize(mode="ray", groups=[DeviceGroup("ab", workers)], cpus_per_worker=cpus)
        group = Bench(remote_group="ab")
        actors = [ray.remote(num_cpus=cpus)(Ops).remote() for _ in range(workers)]
        group.take(value)()
        ray.get([a.take.remote(value) for a in actors])
        yield group, actors
    finally:
        shutdown()
        stop_ray(temp_dir)


def issue_while_busy(group: Any, path: str, call: Callable[[], Any], n: int) -> float:
    """Seconds twinkle takes to issue `n` calls (`call()` each, returning a LazyCollect) while
    `group`'s workers are held busy in `block(path)`; then releases them (creates `path`) and
    resolves every call. The issue side of the "issued while busy" cases."""
    blocker = group.block(path)
    start = time.perf_counter()
    pending = [call() for _ in range(n)]
    issued = time.perf_counter() - start
    open(path, "w").close()
    blocker(300)
    for lazy in pending:
        lazy(300)
    return issued


def raw_fail_fast(refs: list[Any], timeout: float = 60.0) -> None:
    """Fail-fast by hand in plain Ray, the baseline of the fail-fast cases: wait for one of
    `refs` at a time and `ray.get` it, until one raises (returns then); AssertionError when
    none does."""
    import ray

    remaining = list(refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1, timeout=timeout)
        try:
            ray.get(ready)
        except ray.exceptions.RayTaskError:
            return
    raise AssertionError("no rank failed")


@dataclass
class Row:
    """One line of the results table: twinkle's median against the raw baseline's."""

    id: str  # "1", "4a", ...: the key of the limit table in run.py
    title: str  # what is measured, short
    twinkle: float  # median seconds (per call unless `unit` says otherwise)
    raw: float  # median seconds of the raw baseline, same unit
    unit: str = "per call"
    note: str = ""  # one short remark shown in the table
    extra: dict[str, Any] = field(default_factory=dict)  # further figures, JSON only
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.twinkle / self.raw if self.raw > 0 else float("inf")

    @property
    def slow(self) -> dict[str, Any]:
        """The variants' slow rounds (`slow_rounds`)."""
        return slow_rounds(self.samples)

    def slow_note(self) -> str:
        """The slow rounds for the table's notes ('' when none)."""
        parts = [
            f"{name} {s['slow']}/{s['rounds']} (up to {s['worst_x']:.1f}x)"
            for name, s in self.slow.items()
        ]
        return (
            f"slow rounds (over {SLOW_FACTOR:g}x the median): {', '.join(parts)}" if parts else ""
        )

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = round(self.ratio, 4)
        out["slow_rounds"] = self.slow
        out["samples"] = {k: [round(v, 9) for v in vs] for k, vs in self.samples.items()}
        return out


def row_from_samples(
    id: str,
    title: str,
    samples: dict[str, list[float]],
    twinkle: str = "twinkle",
    raw: str = "raw",
    **kwargs: Any,
) -> Row:
    return Row(
        id,
        title,
        median(samples[twinkle]),
        median(samples[raw]),
        samples=samples,
        **kwargs,
    )


# ------------------------------------------------------------------------------- children
def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark child process: this one, plus the suite on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Raw Ray clusters run their workers at the niceness twinkle's embedded cluster uses (the
    # driver's, 0 here), so neither side is starved by other load on the machine.
    env.setdefault("RAY_worker_niceness", "0")
    env.pop("RAY_ADDRESS", None)  # never attach to some other cluster on the machine
    env.update(extra or {})
    return env


def run_child(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a child process and return the JSON it printed after `JSON_MARK`.

    The child runs in its own process group, killed as a whole on timeout.
    """
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or child_env(),
        cwd=str(BENCH_DIR),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise RuntimeError(
            f"{' '.join(cmd[:4])}... did not finish in {timeout:g}s; stderr tail:\n{err[-2000:]}"
        ) from None
    found = [line[len(JSON_MARK) :] for line in out.splitlines() if line.startswith(JSON_MARK)]
    if proc.returncode != 0 or not found:
        raise RuntimeError(
            f"{' '.join(cmd[:4])}... exited {proc.returncode} without a result; output tail:\n"
            f"{out[-1500:]}\n{err[-3000:]}"
        )
    return json.loads(found[-1])


def emit(result: dict[str, Any]) -> None:
    """Print a child's result for `run_child`."""
    print(JSON_MARK + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------- Ray
def start_ray(num_cpus: int = 4, object_store_mib: int = 256) -> str:
    """Start an embedded Ray cluster for this process (never attach to another); returns its
    temp dir, which `stop_ray` removes.

    The benchmarks directory goes on PYTHONPATH first, so workers import the benchmark classes
    by module name like the driver does.
    """
    import ray

    kept = ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED", "RAY_worker_niceness")
    os.environ.update({k: v for k, v in child_env().items() if k in kept})
    os.environ.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="twb-", dir="/tmp")  # Ray's socket paths must be short
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=object_store_mib * 1024 * 1024,
        _temp_dir=temp_dir,
        log_to_driver=False,
        logging_level="ERROR",
    )
    return temp_dir


def stop_ray(temp_dir: str | None) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if temp_dir:
        remove_soon(temp_dir)


def remove_soon(path: str) -> None:
    """Remove a Ray temp dir; again a moment later, as exiting Ray processes may still write."""
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(0.5)
        if not os.path.exists(path):
            return


class RaySession:
    """One Ray cluster shared by every Ray case this process runs, twinkle included.

    The raw baseline starts the cluster with `ray.init(address='local', ...)`; twinkle's
    `initialize(mode='ray')` then adopts that connection (it does so whenever Ray is already
    initialized in the process, and leaves it running at shutdown), so twinkle and raw Ray run
    on the very same cluster, side by side in this process. Each group's twinkle workers and
    raw actors are started on first use and reused by later cases.
    """

    #: Worker count of every group the Ray cases use.
    GROUPS = {"four": 4, "one": 1, "left": 2, "right": 2}
    #: Logical CPUs per twinkle worker and per raw actor: 18 processes fit a 4-CPU cluster.
    CPUS = 0.2

    def __init__(self) -> None:
        self.temp_dir: str | None = None
        self.started = False
        self.timings: dict[str, float] = {}
        self._twinkle: dict[str, Any] = {}
        self._raw: dict[str, list[Any]] = {}

    def start(self) -> None:
        if self.started:
            return
        from twinkle_core import DeviceGroup, initialize

        start = time.perf_counter()
        self.temp_dir = start_ray(num_cpus=4, object_store_mib=256)
        self.timings["ray.init"] = time.perf_counter() - start
        start = time.perf_counter()
        initialize(
            mode="ray",
            groups=[DeviceGroup(name, n) for name, n in self.GROUPS.items()],
            cpus_per_worker=self.CPUS,
        )
        self.timings["twinkle initialize (adopting the cluster)"] = time.perf_counter() - start
        self.started = True

    def prepare(self, groups: set[str]) -> None:
        """Start the raw actors and twinkle workers of `groups` (raw ones in the background
        while twinkle's start), so the cases find them running."""
        import ray
        from bench_ops import Ops

        self.start()
        start = time.perf_counter()
        cls = ray.remote(num_cpus=self.CPUS)(Ops)
        for group in sorted(groups - set(self._raw)):
            self._raw[group] = [cls.remote() for _ in range(self.GROUPS[group])]
        for group in sorted(groups):
            self.twinkle(group)
        ray.get([a.noop.remote() for g in groups for a in self._raw[g]], timeout=300)
        self.timings["workers and actors started"] = time.perf_counter() - start

    def twinkle(self, group: str) -> Any:
        """The twinkle `Bench` object on `group` (its workers started and warmed up)."""
        from bench_ops import Bench

        self.start()
        if group not in self._twinkle:
            start = time.perf_counter()
            obj = Bench(remote_group=group)
            obj.noop()(120)
            self._twinkle[group] = obj
            self.timings[f"twinkle workers '{group}'"] = time.perf_counter() - start
        return self._twinkle[group]

    def raw(self, group: str) -> list[Any]:
        """Plain Ray actors of the same class, as many as `group` has workers."""
        import ray
        from bench_ops import Ops

        self.start()
        if group not in self._raw:
            start = time.perf_counter()
            cls = ray.remote(num_cpus=self.CPUS)(Ops)
            actors = [cls.remote() for _ in range(self.GROUPS[group])]
            ray.get([a.noop.remote() for a in actors], timeout=120)
            self._raw[group] = actors
            self.timings[f"raw actors '{group}'"] = time.perf_counter() - start
        return self._raw[group]

    def close(self) -> None:
        """Stop twinkle's run and the cluster (also after a start that failed half-way)."""
        if self.temp_dir is None:
            return
        import ray

        from twinkle_core import shutdown

        try:
            shutdown()
            for actors in self._raw.values():
                for actor in actors:
                    ray.kill(actor)
        finally:
            self._twinkle, self._raw = {}, {}
            stop_ray(self.temp_dir)
            self.temp_dir = None
            self.started = False


@dataclass
class Context:
    """What a case gets: the mode and the shared Ray session."""

    quick: bool
    ray: RaySession = field(default_factory=RaySession)

    def log(self, message: str) -> None:
        print(f"    {message}", file=sys.stderr, flush=True)

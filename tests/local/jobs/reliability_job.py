"""A torchrun job for the control plane's cost and reliability: usage `reliability_job.py OUT_DIR`.

Every rank writes `OUT_DIR/rank<r>.json` with one entry per section:
- `collectives`: torch.distributed collectives (an `all_gather_object` counts as the collectives
  it makes) and python/numpy random-generator state copies per call, counted by wrapping the
  process group's methods and the libraries' functions;
- `timeouts`: a method whose `timeout=` rank 1 outlives, and a LazyCollect timeout;
- `divergence`: the same method from two call sites, and an extra call on one rank;
- `threads_distinct`: 4 driver threads calling one line with different arguments;
- `threads`: 8 driver threads calling one group, against one thread making the same calls;
- `shutdown`: calls after `shutdown()`, and a call collected after it.
Lines marked SITE-... are located by the test.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from _support.threads import from_threads

from twinkle_core import (
    CallTimeoutError,
    DeviceGroup,
    NotInitializedError,
    TwinkleError,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_local.node_sockets import SocketMesh

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])
RESULTS: dict = {}

# ----------------------------------------------------------------------------- counting
COUNTS: Counter = Counter()


def _counting(name, fn):
    def wrapper(*args, **kwargs):
        COUNTS[name] += 1
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn
    return wrapper


def _patch(owner, name, key):
    fn = getattr(owner, name, None)
    if fn is not None and not hasattr(fn, "__wrapped__"):
        setattr(owner, name, _counting(key, fn))


# Every collective of torch.distributed goes through one of the process group's methods.
for _name in dir(dist.ProcessGroup):
    if _name.startswith("__") or _name in ("abort", "shutdown", "boxed", "unbox"):
        continue
    if any(
        word in _name
        for word in (
            "gather",
            "reduce",
            "scatter",
            "broadcast",
            "barrier",
            "all_to",
            "alltoall",
            "send",
            "recv",
        )
    ):
        _patch(dist.ProcessGroup, _name, "collective")
# ... and so does the slot gather over Unix sockets of a one-machine job (node_sockets.py).
_patch(SocketMesh, "start_gather", "collective")
_patch(np.random, "get_state", "rng state copy")
_patch(np.random, "set_state", "rng state copy")
_patch(random.Random, "getstate", "rng state copy")
_patch(random.Random, "setstate", "rng state copy")


def per_call(fn, calls: int = 20) -> dict:
    """Collectives and generator state copies per call of `fn` (after one warm-up call)."""
    fn()
    dist.barrier()
    COUNTS.clear()
    for _ in range(calls):
        fn()
    out = {k: v / calls for k, v in COUNTS.items()}
    dist.barrier()
    return out


# ----------------------------------------------------------------------------- classes
@remote_class()
class Worker:
    def __init__(self) -> None:
        self.value = 0.5

    @remote_function(dispatch="all", collect="mean")
    def scalar(self):
        return self.value

    @remote_function(dispatch="all", collect="none")
    def nothing(self):
        return None

    @remote_function(dispatch="all", collect="mean")
    def metrics(self):
        return {"loss": self.value + get_worker_context().rank, "tokens": 7}

    @remote_function(dispatch="all", collect="sum")
    def dropout_sum(self):
        return float(torch.rand(1))  # draws from torch only

    @remote_function(dispatch="all", collect="none")
    def big(self):
        return list(range(2000))  # about 6 KB pickled: more than a slot holds

    @remote_function(dispatch="all", collect="none")
    def huge(self):
        return list(range(40000))  # about 120 KB: more than may follow a slot

    @remote_function(dispatch="all", collect="none")
    def echo(self, x):
        return [get_worker_context().rank, x]

    @remote_function(dispatch="all", collect="none")
    def interrupt_on_rank1(self):
        if get_worker_context().rank == 1:
            raise KeyboardInterrupt("stop here")
        return "ran"

    @remote_function(dispatch="all", collect="none")
    def other(self):
        return "other"

    @remote_function(dispatch="all", collect="none")
    def ok(self):
        return get_worker_context().rank

    @remote_function(dispatch="all", collect="none", timeout=3)
    def hang_on_rank1(self):
        if get_worker_context().rank == 1:
            time.sleep(300)  # SITE-HANG
        return get_worker_context().rank

    @remote_function(dispatch="all", collect="none")
    def slow_on_rank1(self, seconds):
        if get_worker_context().rank == 1:
            time.sleep(seconds)  # SITE-SLOW
        return get_worker_context().rank


@remote_class()
class Drawer:
    def __init__(self) -> None:
        self.calls = 0

    @remote_function(dispatch="all", collect="none")
    def draw(self):
        self.calls += 1
        return [
            self.calls,
            int(np.random.randint(0, 10**9)),
            random.random(),
            float(torch.rand(1)),
        ]


def _error(exc: BaseException) -> list:
    return [type(exc).__name__, str(exc)]


# ----------------------------------------------------------------------------- sections
def collectives(w: Worker) -> dict:
    return {
        "mean": per_call(lambda: w.scalar()()),
        "none": per_call(lambda: w.nothing()()),
        "dict_mean": per_call(lambda: w.metrics()()),
        "torch_draws": per_call(lambda: w.dropout_sum()()),
        "big": per_call(lambda: w.big()()),
        "huge": per_call(lambda: w.huge()(), calls=5),
        "values": [w.scalar()(), w.metrics()(), w.nothing()()],
    }


def timeouts(w: Worker) -> dict:
    out: dict = {}
    start = time.monotonic()
    try:
        out["method"] = ["value", w.hang_on_rank1()()]
    except CallTimeoutError as exc:
        out["method"] = _error(exc)
    out["method_took"] = time.monotonic() - start
    out["after_method"] = w.ok()()

    lazy = w.slow_on_rank1(6)
    start = time.monotonic()
    try:
        out["lazy"] = ["value", lazy(timeout=2)]
    except CallTimeoutError as exc:
        out["lazy"] = _error(exc)
    out["lazy_took"] = time.monotonic() - start
    out["lazy_again"] = lazy()  # a timed-out wait is not final
    out["after_lazy"] = w.ok()()
    return out


def divergence(w: Worker) -> dict:
    out: dict = {}
    try:
        if RANK == 0:
            out["sites"] = ["value", w.echo(1)()]  # SITE-C1-A
        else:
            out["sites"] = ["value", w.echo(99)()]  # SITE-C1-B
    except TwinkleError as exc:
        out["sites"] = _error(exc)
    try:
        if RANK == 0:
            w.echo(2)()  # SITE-C2-EXTRA
        out["extra"] = ["value", w.other()()]  # SITE-C2-NEXT
    except TwinkleError as exc:
        out["extra"] = _error(exc)
    out["after"] = w.ok()()
    return out


def draws(threads: int, per_thread: int) -> tuple[list, bool]:
    initialize("local", seed=3, groups=[DeviceGroup("g", 2, "cpu")], timeout=120)
    try:
        drawer = Drawer(remote_group="g")
        before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        out = from_threads(lambda: drawer.draw()(), threads, per_thread)
        untouched = (
            random.getstate() == before[0]
            and bool((np.random.get_state()[1] == before[1]).all())
            and bool(torch.equal(torch.get_rng_state(), before[2]))
        )
        return out, untouched
    finally:
        shutdown()


def threads() -> dict:
    concurrent, untouched = draws(threads=8, per_thread=25)
    serial, _ = draws(threads=1, per_thread=200)
    return {
        "concurrent": sorted(concurrent),
        "serial": sorted(serial),
        "untouched": untouched,
        "distinct": len({json.dumps(v) for v in concurrent}),
    }


def interrupted(w: Worker) -> dict:
    """A method raising KeyboardInterrupt on rank 1 only: every process raises the same
    WorkerExitError for that call, and the next calls work on both (still in step)."""
    from twinkle_core import WorkerExitError

    out: dict = {}
    try:
        out["call"] = ["value", w.interrupt_on_rank1()()]
    except WorkerExitError as exc:
        out["call"] = _error(exc)
    out["next"] = [w.echo(5)(), w.ok()()]
    return out


def threads_distinct(w: Worker) -> dict:
    """4 driver threads x 10 calls of one line with different arguments, each thread waiting a
    rank-dependent random while between calls, so the processes interleave them differently:
    every call gets its own arguments' results or a divergence error, never another's."""
    import threading

    from twinkle_core import TwinkleError

    counts = {"ok": 0, "diverged": 0, "wrong": 0}
    lock = threading.Lock()

    def work(t: int) -> None:
        jitter = random.Random(RANK * 100 + t)
        for i in range(10):
            time.sleep(jitter.random() * 0.003)
            try:
                got = w.echo([t, i])()
                key = "ok" if got == [[0, [t, i]], [1, [t, i]]] else "wrong"
            except TwinkleError as exc:
                key = "diverged" if "diverged" in str(exc) else "wrong"
            with lock:
                counts[key] += 1

    pool = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
    return counts


def section(name: str, fn, *args) -> None:
    """Run one section; its result (or its error) is written at once."""
    try:
        RESULTS[name] = fn(*args)
    except Exception as exc:
        RESULTS[name] = {"error": _error(exc)}
    (OUT / f"rank{RANK}.json").write_text(json.dumps(RESULTS, sort_keys=True))


def after_shutdown(w: Worker) -> dict:
    pending = w.ok()  # made before shutdown, collected after it
    shutdown()
    after: dict = {"pending": pending()}
    try:
        w.ok()
        after["call"] = None
    except NotInitializedError as exc:
        after["call"] = _error(exc)
    return after


def main() -> None:
    initialize("local", seed=1, groups=[DeviceGroup("g", 2, "cpu")], timeout=120)
    w = Worker(remote_group="g")
    section("collectives", collectives, w)
    section("timeouts", timeouts, w)
    section("divergence", divergence, w)
    section("interrupted", interrupted, w)
    section("threads_distinct", threads_distinct, w)
    section("shutdown", after_shutdown, w)
    shutdown()
    section("threads", threads)


if __name__ == "__main__":
    main()

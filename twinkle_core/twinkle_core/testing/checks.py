# `remote_class()` is typed as returning the class unchanged, so mypy rejects the remote_group=
# and device_mesh= keywords its constructor takes; they are what this module is about.
# mypy: disable-error-code="call-arg"
"""The conformance checks: short driver programs with their expected values written down.

Every expected value below is a literal worked out from the documented semantics (docs/concepts.md),
never a value computed by another backend in the same run, so a backend and a reference broken
the same way still fail. Each check declares the device groups it needs and runs in a session
(`runner.Session`: one `initialize` ... `shutdown` span serving consecutive checks, built anew
after a failure); remote classes live at module level so every backend's workers can import them.
"""

from __future__ import annotations

import io
import os
import random
import re
import threading
import time
import types
from typing import Any

import numpy as np

from twinkle_core import (
    CallTimeoutError,
    CollectError,
    ConfigurationError,
    DeviceMesh,
    collective,
    collective_group,
    get,
    get_worker_context,
    remote_class,
    remote_function,
    wait,
)

from ..plugin import Dispatcher, ExecutionBackend, get_plugin
from .runner import (
    Check,
    CheckFailed,
    NotApplicable,
    Session,
    expect,
    expect_raises,
    expect_true,
    notes_of,
    same,
    show,
)

# ----------------------------------------------------------------------------- call sites
# Core names the user's own line in a failure (`[twinkle driver caller: FILE:LINE]`) and skips
# every frame of twinkle's own packages, this kit included. Calls whose call site a check looks
# at are therefore made from this two-line driver module, compiled under a name of its own:
# the expected tag is a literal.
DRIVER_FILE = "twinkle-conformance-driver"
_DRIVER_SOURCE = """\
def call(method, *args, **kwargs):
    return method(*args, **kwargs)
"""
_driver: dict[str, Any] = {"__name__": "twinkle_conformance_driver"}
exec(compile(_DRIVER_SOURCE, DRIVER_FILE, "exec"), _driver)
driver_call = _driver["call"]

#: The tag core puts on failures of calls made through `driver_call` (line 2 above).
CALLER_TAG = "[twinkle driver caller: twinkle-conformance-driver:2]"


def _rank() -> int:
    ctx = get_worker_context()
    if ctx is None:
        raise RuntimeError("a remote method ran without a worker context")
    return ctx.rank


# ----------------------------------------------------------------------------- strategies
def stride_dispatch(args: tuple, kwargs: dict, n_workers: int, device_mesh: DeviceMesh) -> list:
    """A callable dispatcher: worker i gets every n-th item from i, and the worker count."""
    items = args[0]
    return [((items[i::n_workers],), {"n": n_workers}) for i in range(n_workers)]


class OneShareDispatcher(Dispatcher):
    """A broken dispatcher object (a `Dispatcher` subclass, as a dispatcher plugin registers):
    one share, whatever the number of workers."""

    name = "one_share"

    def dispatch(self, args: tuple, kwargs: dict, n_workers: int, device_mesh: DeviceMesh) -> list:
        return [(args, kwargs)]


def spread_collect(results: list, device_mesh: DeviceMesh | None) -> dict:
    """A callable collector: the spread of the results and what it was given."""
    return {
        "min": min(results),
        "max": max(results),
        "n": len(results),
        "world": None if device_mesh is None else device_mesh.world_size,
    }


# ----------------------------------------------------------------------------- remote classes
@remote_class()
class Probe:
    """Reports what each worker received; one method per dispatch/execute/collect setting."""

    def __init__(self) -> None:
        # One counter per method whose runs a check counts: each check runs once per session.
        self.first_only_runs = 0
        self.one_share_runs = 0

    @remote_function(dispatch="all", collect="none")
    def all_args(self, items, scale, name=None):
        return [_rank(), items, scale, name]

    @remote_function(dispatch="all", collect="none")
    def made_here(self, k):
        """Objects made in the call itself: a closure and an instance of a local class,
        which only travel by value (nothing importable names them)."""
        rank = _rank()

        class Point:
            def __init__(self, x: int) -> None:
                self.x = x

        return {"scale": lambda x: x * k + rank, "point": Point(rank)}

    @remote_function(dispatch="slice", collect="none")
    def slice_args(self, items, scale, pair):
        return [_rank(), items, scale, list(pair)]

    @remote_function(dispatch="slice_dp", collect="none")
    def dp_args(self, batch):
        ctx = get_worker_context()
        return [
            ctx.rank,
            ctx.data_rank,
            list(batch["x"]),
            [int(v) for v in batch["y"]],
            list(batch["z"]),
            batch["tag"],
        ]

    @remote_function(dispatch=stride_dispatch, collect="none")
    def strided(self, items, n):
        return [_rank(), items, n]

    @remote_function(dispatch=OneShareDispatcher(), collect="none")
    def one_share(self, x):
        self.one_share_runs += 1
        return x

    @remote_function(dispatch="all", collect="none")
    def identity(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.world_size, ctx.group_name, ctx.data_rank, ctx.data_world_size]

    @remote_function(dispatch="all", execute="first", collect="none")
    def first_only(self, x):
        self.first_only_runs += 1
        return [_rank(), x]

    @remote_function(dispatch="all", collect="none")
    def run_counts(self):
        return {"first_only": self.first_only_runs, "one_share": self.one_share_runs}

    @remote_function(dispatch="all", collect="none")
    def record(self):
        r = _rank()
        return {"rank": r, "square": r * r}

    @remote_function(dispatch="slice", collect="flatten")
    def times_ten(self, xs):
        return [x * 10 for x in xs]

    @remote_function(dispatch="slice_dp", collect="flatten")
    def shard_items(self, batch):
        return list(batch)

    @remote_function(dispatch="slice_dp", collect="mean")
    def shard_mean(self, batch):
        return float(sum(batch))

    @remote_function(dispatch="slice_dp", collect="mean")
    def shard_size_mean(self, batch):
        return len(batch)

    @remote_function(dispatch="slice_dp", collect="sum")
    def shard_sum(self, batch):
        return float(sum(batch))

    @remote_function(dispatch="slice_dp", collect="sum")
    def shard_size_sum(self, batch):
        return len(batch)

    @remote_function(dispatch="all", collect="sum")
    def rows_sum(self):
        """Rank r returns r+1 rows of 3 zeros: shapes that differ, which numpy would broadcast."""
        return np.zeros((_rank() + 1, 3), dtype=np.float32)

    @remote_function(dispatch="all", collect="sum")
    def list_sum(self):
        """Rank r returns [r]: lists, which `+` would join."""
        return [_rank()]

    @remote_function(dispatch="slice_dp", collect="mean")
    def tp_skewed_mean(self, batch):
        # tp peers of one data shard return different values: only the collect rank counts.
        ctx = get_worker_context()
        return float(sum(batch)) + 100.0 * ctx.device_mesh.coordinate(ctx.rank, "tp")

    @remote_function(dispatch="slice_dp", collect="sum")
    def tp_skewed_sum(self, batch):
        ctx = get_worker_context()
        return float(sum(batch)) + 100.0 * ctx.device_mesh.coordinate(ctx.rank, "tp")

    @remote_function(dispatch="all", collect="first")
    def rank_code(self):
        return _rank() * 100 + 7

    @remote_function(dispatch="slice_dp", collect="concat")
    def doubled(self, values):
        return np.asarray(values) * 2

    @remote_function(dispatch="slice_dp", collect="concat")
    def plus_thousand(self, values):
        return np.asarray(values) + 1000

    @remote_function(dispatch="all", collect=spread_collect)
    def tens(self):
        return (_rank() + 1) * 10

    @remote_function(dispatch="slice_dp", collect="mean")
    def shard_stats(self, batch):
        return {"loss": float(sum(batch)), "count": len(batch)}

    @remote_function(dispatch="slice_dp", collect="sum")
    def shard_pair(self, batch):
        return (len(batch), float(batch[0]))

    @remote_function(dispatch="all", collect="first")
    def number(self, x):
        return x

    @remote_function(dispatch="all", collect="first")
    def count_up(self, n):
        return list(range(n))

    @remote_function(dispatch="slice_dp", collect="none")
    def dp_items(self, items):
        return [_rank(), list(items)]

    @remote_function(dispatch="all", collect="none")
    def received(self, value):
        return value

    @remote_function(dispatch="all", collect="first")
    def napped(self, seconds, value):
        time.sleep(seconds)
        return value

    @remote_function(dispatch="all", collect="none")
    def take(self, value):
        # Whether this worker got the driver's very object (only where it runs in the driver's
        # process and the backend shares the driver's objects instead of sending copies).
        return [_rank(), any(value is sent for sent in _UNSENDABLE)]


#: The unsendable arguments as the driver made them, in the driver's process (see `Probe.take`).
_UNSENDABLE: list[Any] = []

#: What `repr()` of an `Unsendable` gives: an error about it must not show it (values may be
#: secrets; errors name the argument and its type).
UNSENDABLE_REPR = "Unsendable(value-not-to-be-shown)"


class Unsendable:
    """An argument no transport can send to a worker: it holds a lock, which neither pickles nor
    deep-copies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return UNSENDABLE_REPR


@remote_class()
class WeightHolder:
    """A collective group member holding numpy weights: a float32 vector and an int64 matrix,
    different on every member (`offset` tells objects apart, the worker rank their workers)."""

    def __init__(self, offset):
        base = offset + 100 * _rank()
        self.w = np.arange(4, dtype=np.float32) + base
        self.b = np.arange(6, dtype=np.int64).reshape(2, 3) + base

    @remote_function(dispatch="all", collect="none")
    def push(self, name):
        c = collective(name)
        given = [self.w, self.b]
        out = c.broadcast(given, src=0)
        return [
            c.rank,
            c.world_size,
            [type(x).__name__ for x in out],
            [x is y for x, y in zip(out, given, strict=False)] + [len(out)],
            [type(self.w).__name__, str(self.w.dtype), list(self.w.shape), self.w.tolist()],
            [type(self.b).__name__, str(self.b.dtype), list(self.b.shape), self.b.tolist()],
        ]


@remote_class()
class Stage:
    """A two-stage pipeline (pp=2): reports its stage."""

    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="last_pp")
    def stage(self, x):
        ctx = get_worker_context()
        return [x, ctx.rank, ctx.device_mesh.coordinate(ctx.rank, "pp")]

    @remote_function(dispatch="all", collect="mean")
    def stage_loss(self):
        return float(_rank() * 10 + 1)


@remote_class()
class Answerer:
    @remote_function(dispatch="all", execute="peer", collect="first")
    def whoami(self):
        return _rank()

    @remote_function(dispatch="all", execute="peer", collect="none")
    def whoami_all(self):
        return _rank()


@remote_class()
class Asker:
    @remote_function(dispatch="all", collect="none")
    def ask(self, other):
        # A remote object of another group, called from inside this group's worker.
        return [_rank(), other.whoami()()]


@remote_class()
class MeshHolder:
    """A class whose constructor declares `device_mesh`: twinkle hands it the object's mesh."""

    def __init__(self, device_mesh, tag="default"):
        self.device_mesh = device_mesh
        self.tag = tag

    @remote_function(dispatch="all", collect="none")
    def describe(self):
        mesh = self.device_mesh
        if not isinstance(mesh, DeviceMesh):
            return [_rank(), f"not a DeviceMesh: {mesh!r}", None, self.tag, False]
        same_as_context = mesh == get_worker_context().device_mesh
        return [_rank(), mesh.parallelism(), mesh.world_size, self.tag, same_as_context]


@remote_class()
class MeshReader:
    """Reads the original Twinkle infra's per-dimension accessors of its own mesh."""

    def __init__(self, device_mesh):
        self.device_mesh = device_mesh

    @remote_function(dispatch="all", collect="none")
    def accessors(self):
        m = self.device_mesh
        ctx = get_worker_context()
        agrees = m.data_rank == ctx.data_rank and all(
            getattr(m, f"{d}_rank") == m.coordinate(ctx.rank, d) for d in m.mesh_dim_names
        )
        ranks = [m.dp_rank, m.fsdp_rank, m.tp_rank, m.pp_rank, m.cp_rank, m.ep_rank]
        sizes = [m.dp_world_size, m.fsdp_world_size, m.tp_world_size, m.pp_world_size]
        return [ctx.rank, *ranks, m.data_rank, *sizes, agrees]


@remote_class()
class Neighbour:
    """A second role for colocation checks: where it runs, and its own draws."""

    @remote_function(dispatch="all", collect="none")
    def process(self):
        return [_rank(), os.getpid()]


#: Per worker rank, the last array a `Producer` returned there (one table per process).
_MADE: dict[int, Any] = {}

#: Rows of a `Producer` array: 512 x 64 float64 = 256 KiB, above every backend's threshold for
#: keeping a result out of the reply (Ray's is 100 KiB).
_ROWS = 512


@remote_class()
class Producer:
    """A role whose results another role on its group takes by reference."""

    @remote_function(dispatch="all", collect="concat")
    def make(self):
        made = _MADE[_rank()] = np.full((_ROWS, 64), float(_rank()))
        return made

    @remote_function(dispatch="all", collect="none")
    def make_dict(self):
        return {"x": self.make(), "rank": _rank()}


@remote_class()
class Consumer:
    """What a role received: whether it is the very array its rank's producer returned."""

    @remote_function(dispatch="slice_dp", collect="none")
    def same_as_made(self, x):
        made = _MADE.get(_rank())
        return [_rank(), x is made, float(x[0, 0]), list(x.shape)]

    @remote_function(dispatch="all", collect="none")
    def which_are_made(self, results):
        made = _MADE.get(_rank())
        return [_rank(), [r["x"] is made for r in results], [float(r["x"][0, 0]) for r in results]]

    @remote_function(dispatch="all", collect="none")
    def first_values(self, x):
        return [_rank(), list(x.shape), float(x[0, 0]), float(x[-1, 0])]


#: Per worker rank, the TurnTaker roles holding their buffers right now (one table per process).
_HOLDERS: dict[int, set[str]] = {}


@remote_class()
class TurnTaker:
    """A role with `offload()`/`onload()`: colocated roles take turns on the devices."""

    def __init__(self, name):
        self.name = name
        _HOLDERS.setdefault(_rank(), set()).add(name)

    def offload(self):
        _HOLDERS[_rank()].discard(self.name)

    def onload(self):
        _HOLDERS.setdefault(_rank(), set()).add(self.name)

    @remote_function(dispatch="all", collect="none")
    def holders(self):
        return [_rank(), sorted(_HOLDERS.get(_rank(), ()))]


@remote_class()
class Offset:
    def __init__(self, offset, extras=None):
        self.offset = offset
        self.extras = extras

    @remote_function(dispatch="all", collect="none")
    def values(self):
        return [self.offset + _rank(), self.extras]


@remote_class()
class Loader:
    """A data loader: iterating the driver object iterates the first worker."""

    def __init__(self, n):
        self.n = n
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return [_rank(), self.i * 10]


@remote_class()
class Dice:
    """Draws from numpy's and python's generators when built and when asked."""

    def __init__(self):
        self.first = [int(np.random.randint(0, 10**6)), random.randrange(10**6)]

    @remote_function(dispatch="all", collect="none")
    def draws(self):
        return [*self.first, int(np.random.randint(0, 10**6))]


class TwoArgError(Exception):
    """An exception whose `__init__` takes two required arguments but passes one message on:
    plain pickling cannot rebuild it (`TwoArgError("42: boom")` misses an argument)."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class LockedError(RuntimeError):
    """An exception holding an attribute that cannot be pickled."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class BrokenStrError(Exception):
    """An exception whose own `__str__` raises: reporting it must not replace it."""

    def __str__(self):
        raise RuntimeError("this __str__ is broken")


@remote_class()
class Faulty:
    """Rank 1 raises exceptions of every shape, so they travel to the driver (and to rank 0)."""

    @remote_function(dispatch="all", collect="none")
    def value_error(self, x):
        if _rank() == 1:
            raise ValueError(f"bad batch {x}")
        return x

    @remote_function(dispatch="all", collect="none")
    def key_error(self):
        if _rank() == 1:
            raise KeyError("missing_key")
        return 0

    @remote_function(dispatch="all", collect="none")
    def os_error(self):
        if _rank() == 1:
            raise FileNotFoundError(2, "No such file or directory", "/nonexistent/twinkle.txt")
        return 0

    @remote_function(dispatch="all", collect="none")
    def two_arg_error(self):
        if _rank() == 1:
            raise TwoArgError(42, "boom")
        return 0

    @remote_function(dispatch="all", collect="none")
    def locked_error(self):
        if _rank() == 1:
            raise LockedError("resource busy")
        return 0

    @remote_function(dispatch="all", collect="none")
    def broken_str_error(self):
        if _rank() == 1:
            raise BrokenStrError("code 7")
        return 0

    @remote_function(dispatch="all", collect="none")
    def generator_result(self):
        if _rank() == 1:
            return (i for i in range(3))
        return 0

    @remote_function(dispatch="all", collect="none")
    def file_result(self):
        if _rank() == 1:
            return {"out": [open(os.devnull)]}  # the result under test: an open file
        return 0

    @remote_function(dispatch="all", collect="none", timeout=0.5)
    def slow(self, seconds):
        time.sleep(seconds)
        return seconds

    @remote_function(dispatch="all", collect="none")
    def quick(self, x):
        return x


# ----------------------------------------------------------------------------- the checks
BATCH = {
    "x": [0, 1, 2, 3, 4, 5, 6],
    "y": np.arange(7) * 10,
    "z": (100, 101, 102, 103, 104, 105, 106),
    "tag": "t",
}


def check_dispatch_all(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "all_args([1, 2, 3], 7, name='n') with dispatch='all'",
        probe.all_args([1, 2, 3], 7, name="n")(),
        [[0, [1, 2, 3], 7, "n"], [1, [1, 2, 3], 7, "n"]],
    )


def check_dispatch_slice(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "slice_args([1, 2, 3, 4, 5], 7, (9, 8)) with dispatch='slice'",
        probe.slice_args([1, 2, 3, 4, 5], 7, (9, 8))(),
        [[0, [1, 2, 3], 7, [9, 8]], [1, [4, 5], 7, [9, 8]]],
    )


def check_dispatch_slice_dp(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "dp_args(batch of 7) with dispatch='slice_dp' on dp=2",
        probe.dp_args(BATCH)(),
        [
            [0, 0, [0, 1, 2, 3], [0, 10, 20, 30], [100, 101, 102, 103], "t"],
            [1, 1, [4, 5, 6], [40, 50, 60], [104, 105, 106], "t"],
        ],
    )


def check_dispatch_callable(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "strided([10, 20, 30, 40, 50]) with a function as dispatcher",
        probe.strided([10, 20, 30, 40, 50])(),
        [[0, [10, 30, 50], 2], [1, [20, 40], 2]],
    )


def check_dispatch_wrong_share_count(run: Session) -> None:
    probe = run.shared(Probe, "two")
    exc = expect_raises(
        "a dispatcher returning 1 share for 2 workers",
        lambda: probe.one_share(5)(),
        ConfigurationError,
    )
    expect_true(
        "a ConfigurationError saying '1 entries for 2 workers'",
        "1 entries for 2 workers" in str(exc),
        str(exc),
    )
    expect(
        "each worker's one_share runs after the rejected call",
        [counts["one_share"] for counts in probe.run_counts()()],
        [0, 0],
    )


def check_execute_all(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "identity() with execute='all'",
        probe.identity()(),
        [[0, 2, "two", 0, 2], [1, 2, "two", 1, 2]],
    )


def check_execute_first_collect_none(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect("first_only(5) with execute='first', collect='none'", probe.first_only(5)(), [[0, 5]])
    expect(
        "each worker's first_only runs after one call",
        [counts["first_only"] for counts in probe.run_counts()()],
        [1, 0],
    )


def check_execute_peer(run: Session) -> None:
    asker = Asker(remote_group="two")
    answerer = Answerer(remote_group="other")
    expect(
        "ask(answerer): whoami() with execute='peer' from inside each worker",
        asker.ask(answerer)(),
        [[0, 0], [1, 1]],
    )
    expect(
        "whoami_all() with execute='peer' from the driver (every worker)",
        answerer.whoami_all()(),
        [0, 1],
    )


def check_collect_none(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "record() with collect='none'",
        probe.record()(),
        [{"rank": 0, "square": 0}, {"rank": 1, "square": 1}],
    )


def check_collect_flatten(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "times_ten([1, 2, 3, 4, 5]) with collect='flatten'",
        probe.times_ten([1, 2, 3, 4, 5])(),
        [10, 20, 30, 40, 50],
    )


def check_collect_mean(run: Session) -> None:
    probe = run.shared(Probe, "two")
    batch = [1, 2, 3, 4, 5, 6, 7]
    expect("shard_mean([1..7]) with collect='mean' (10.0, 18.0)", probe.shard_mean(batch)(), 14.0)
    expect("shard_size_mean([1..7]) with collect='mean' (4+3)", probe.shard_size_mean(batch)(), 3.5)


def check_collect_sum(run: Session) -> None:
    probe = run.shared(Probe, "two")
    batch = [1, 2, 3, 4, 5, 6, 7]
    expect("shard_sum([1..7]) with collect='sum'", probe.shard_sum(batch)(), 28.0)
    expect("shard_size_sum([1..7]) with collect='sum'", probe.shard_size_sum(batch)(), 7)


def check_sum_refuses_what_it_cannot_add(run: Session) -> None:
    probe = run.shared(Probe, "two")
    cases = [
        ("rows_sum() (shapes (1, 3) and (2, 3))", probe.rows_sum, "shapes differ"),
        ("list_sum() ([0] and [1])", probe.list_sum, "'+' would join"),
    ]
    for what, method, words in cases:

        def collected(method: Any = method) -> Any:
            return method()()

        exc = expect_raises(f"{what} with collect='sum'", collected, CollectError)
        expect_true(
            f"{what}: a CollectError saying {words!r}, never a joined or broadcast sum",
            words in str(exc),
            str(exc),
        )
    expect("shard_sum([1..7]) after those calls", probe.shard_sum([1, 2, 3, 4, 5, 6, 7])(), 28.0)


def check_collect_first(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect("rank_code() with collect='first' (rank * 100 + 7)", probe.rank_code()(), 7)


def check_collect_last_pp(run: Session) -> None:
    stage = Stage(remote_group="two", device_mesh=DeviceMesh.from_sizes(pp_size=2))
    expect("stage('x') with collect='last_pp' on pp=2", stage.stage("x")(), [["x", 1, 1]])
    expect(
        "stage_loss() with collect='mean' on pp=2 (the last stage stands for the shard)",
        stage.stage_loss()(),
        11.0,
    )


def check_collect_concat(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "doubled(np.arange(6)) with slice_dp and collect='concat'",
        probe.doubled(np.arange(6))(),
        np.array([0, 2, 4, 6, 8, 10]),
    )


def check_collect_callable(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "tens() with a function as collector",
        probe.tens()(),
        {"min": 10, "max": 20, "n": 2, "world": 2},
    )


def check_collect_dict_per_key(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "shard_stats([1..7]) with collect='mean' over dict results",
        probe.shard_stats([1, 2, 3, 4, 5, 6, 7])(),
        {"loss": 14.0, "count": 3.5},
    )


def check_collect_tuple_elementwise(run: Session) -> None:
    probe = run.shared(Probe, "two")
    expect(
        "shard_pair([1..7]) with collect='sum' over tuple results",
        probe.shard_pair([1, 2, 3, 4, 5, 6, 7])(),
        (7, 6.0),
    )


def check_device_mesh_keyword(run: Session) -> None:
    holder = MeshHolder(device_mesh=DeviceMesh.from_sizes(pp_size=2), tag="kw", remote_group="two")
    expect(
        "MeshHolder(device_mesh=pp=2 mesh, tag='kw').describe()",
        holder.describe()(),
        [[0, {"pp": 2}, 2, "kw", True], [1, {"pp": 2}, 2, "kw", True]],
    )


def check_device_mesh_positional(run: Session) -> None:
    holder = MeshHolder(DeviceMesh.from_sizes(tp_size=2), "pos", remote_group="two")
    expect(
        "MeshHolder(tp=2 mesh, 'pos').describe() (mesh passed positionally)",
        holder.describe()(),
        [[0, {"tp": 2}, 2, "pos", True], [1, {"tp": 2}, 2, "pos", True]],
    )


def check_device_mesh_default(run: Session) -> None:
    holder = MeshHolder(remote_group="two")
    expect(
        "MeshHolder().describe() (no mesh passed: the group's default dp mesh)",
        holder.describe()(),
        [[0, {"dp": 2}, 2, "default", True], [1, {"dp": 2}, 2, "default", True]],
    )


def check_lazy_to_group_of_other_size(run: Session) -> None:
    two = run.shared(Probe, "two")
    one = run.shared(Probe, "one")
    doubled = two.doubled(np.arange(6))  # collected from 2 workers, consumed by 1
    expect(
        "one.plus_thousand(two.doubled(np.arange(6)))",
        one.plus_thousand(doubled)(),
        np.array([1000, 1002, 1004, 1006, 1008, 1010]),
    )
    items = one.count_up(4)  # collected from 1 worker, sliced for 2
    expect("two.dp_items(one.count_up(4))", two.dp_items(items)(), [[0, [0, 1]], [1, [2, 3]]])


def check_lazy_to_constructor(run: Session) -> None:
    one = run.shared(Probe, "one")
    offset = Offset(one.number(5), extras={"list": [one.number(7)]}, remote_group="two")
    expect(
        "Offset(one.number(5), extras={'list': [one.number(7)]}).values()",
        offset.values()(),
        [[5, {"list": [7]}], [6, {"list": [7]}]],
    )


def check_lazy_nested_in_arguments(run: Session) -> None:
    one = run.shared(Probe, "one")
    two = run.shared(Probe, "two")
    argument = {"a": one.number(5), "b": [one.count_up(4), 3]}
    expect(
        "two.received({'a': one.number(5), 'b': [one.count_up(4), 3]})",
        two.received(argument)(),
        [{"a": 5, "b": [[0, 1, 2, 3], 3]}, {"a": 5, "b": [[0, 1, 2, 3], 3]}],
    )


def check_dispatcher_raising_leaves_nothing_behind(run: Session) -> None:
    one = run.shared(Probe, "one")
    two = run.shared(Probe, "two")
    # The LazyCollect is resolved for the call (a backend may keep what it learns for the
    # submission), then slice_dp refuses the batch: nothing of that call may reach the next.
    exc = expect_raises(
        "two.dp_items({'x': one.count_up(4), 'y': [1, 2, 3]}) (lengths 4 and 3)",
        lambda: two.dp_items({"x": one.count_up(4), "y": [1, 2, 3]}),
        ConfigurationError,
    )
    expect_true("the error names slice_dp", "slice_dp" in str(exc), str(exc))
    expect(
        "two.all_args([1, 2], 3) right after the refused call",
        two.all_args([1, 2], 3)(),
        [[0, [1, 2], 3, None], [1, [1, 2], 3, None]],
    )
    expect(
        "two.dp_items(one.count_up(4)) right after the refused call",
        two.dp_items(one.count_up(4))(),
        [[0, [0, 1]], [1, [2, 3]]],
    )


def check_colocated_roles_share_processes(run: Session) -> None:
    first = Neighbour(remote_group="two")
    second = Neighbour(remote_group="two")
    here = first.process()()
    expect("[rank, pid] of a second object on the same group", second.process()(), here)
    expect_true(
        "the ranks are numbered 0 and 1 in the first object's processes",
        [rank for rank, _ in here] == [0, 1],
        repr(here),
    )


def check_colocated_hand_off_by_reference(run: Session) -> None:
    producer = Producer(remote_group="two")
    consumer = Consumer(remote_group="two")
    elsewhere = run.shared(Consumer, "one")
    made = producer.make()
    expect(
        "consumer.same_as_made(producer.make()): slice_dp gives each rank its own array",
        consumer.same_as_made(made)(),
        [[0, True, 0.0, [_ROWS, 64]], [1, True, 1.0, [_ROWS, 64]]],
    )
    expect(
        "consumer.which_are_made(producer.make_dict()): only the rank's own result is shared",
        consumer.which_are_made(producer.make_dict())(),
        [[0, [True, False], [0.0, 1.0]], [1, [False, True], [0.0, 1.0]]],
    )
    expect(
        "consumer.first_values(producer.make()) with dispatch='all': the concatenation",
        consumer.first_values(producer.make())(),
        [[0, [2 * _ROWS, 64], 0.0, 1.0], [1, [2 * _ROWS, 64], 0.0, 1.0]],
    )
    expect(
        "a consumer on another group receives the values",
        elsewhere.first_values(made)(),
        [[0, [2 * _ROWS, 64], 0.0, 1.0]],
    )
    value = made()
    expect(
        "the driver's value of the handed-on call",
        [list(value.shape), float(value[0, 0]), float(value[-1, 0])],
        [[2 * _ROWS, 64], 0.0, 1.0],
    )


def check_roles_take_turns(run: Session) -> None:
    _HOLDERS.clear()  # the in-process table, if this process holds workers
    roles = {name: TurnTaker(name, remote_group="two") for name in ("policy", "ref", "gen")}
    for name in ("policy", "gen", "ref", "policy", "ref"):
        expect(
            f"{name}.holders(): only {name} holds its buffers, on both ranks",
            roles[name].holders()(),
            [[0, [name]], [1, [name]]],
        )


def check_iterate_remote_loader(run: Session) -> None:
    loader = Loader(3, remote_group="two")
    expect("[item for item in loader]", [item for item in loader], [[0, 10], [0, 20], [0, 30]])
    expect("iterating the loader again", list(loader), [[0, 10], [0, 20], [0, 30]])
    iterator = iter(loader)
    expect("next(iter(loader))", next(iterator), [0, 10])


def check_seeded_random(run: Session) -> None:
    draws = Dice(remote_group="two").draws()()
    expect_true(
        "every worker built from seed 1234 to draw the same numbers",
        isinstance(draws, list) and len(draws) == 2 and draws[0] == draws[1],
        draws,
    )
    # numpy's legacy generator and python's `random` are stable across versions and platforms:
    # seeded with 1234, the first numpy draw in [0, 1e6), python's, then numpy's second.
    expect("Dice(seed 1234).draws() on rank 0", draws[0], [486191, 815965, 451283])


def _expect_tagged_message(what: str, exc: BaseException, message: str) -> None:
    expect(f"{what}: str(exception)", str(exc), f"{CALLER_TAG} {message}")


def _expect_tag_in_notes(what: str, exc: BaseException) -> None:
    notes = notes_of(exc)
    if CALLER_TAG not in notes:
        raise CheckFailed(f"{what}: expected {CALLER_TAG!r} in __notes__, got {show(notes)}")


def _expect_failing_rank(what: str, exc: BaseException) -> None:
    if not any("failed in group 'two' on rank 1" in n for n in notes_of(exc)):
        raise CheckFailed(
            f"{what}: expected a note naming \"failed in group 'two' on rank 1\", got "
            f"{show(notes_of(exc))}"
        )


def _raised_on_rank_1(run: Session, method: str, what: str, kind: type, *args: Any) -> Any:
    """The exception `Faulty.<method>(*args)` raises on rank 1, as the caller gets it: of type
    `kind`, with a note naming rank 1 (what else it must carry, each check says)."""
    faulty = run.shared(Faulty, "two")
    exc = expect_raises(
        f"{method}({', '.join(map(repr, args))}) raising on rank 1{what}",
        lambda: driver_call(getattr(faulty, method), *args)(),
        kind,
    )
    _expect_failing_rank(kind.__name__, exc)
    return exc


def check_error_value_error(run: Session) -> None:
    exc = _raised_on_rank_1(run, "value_error", "", ValueError, 7)
    _expect_tagged_message("ValueError", exc, "bad batch 7")


def check_error_key_error(run: Session) -> None:
    exc = _raised_on_rank_1(run, "key_error", "", KeyError)
    expect("KeyError.args", exc.args, ("missing_key",))
    _expect_tag_in_notes("KeyError", exc)


def check_error_os_error(run: Session) -> None:
    exc = _raised_on_rank_1(run, "os_error", "", FileNotFoundError)
    expect("FileNotFoundError.errno", exc.errno, 2)
    expect("FileNotFoundError.strerror", exc.strerror, "No such file or directory")
    expect("FileNotFoundError.filename", exc.filename, "/nonexistent/twinkle.txt")
    _expect_tag_in_notes("FileNotFoundError", exc)


def check_error_two_arg_init(run: Session) -> None:
    exc = _raised_on_rank_1(run, "two_arg_error", "", TwoArgError)
    expect("TwoArgError attributes (code, detail)", [exc.code, exc.detail], [42, "boom"])
    _expect_tagged_message("TwoArgError", exc, "42: boom")


def check_error_unpicklable_attribute(run: Session) -> None:
    what = " (an exception holding a threading.Lock)"
    exc = _raised_on_rank_1(run, "locked_error", what, LockedError)
    _expect_tagged_message("LockedError", exc, "resource busy")


def check_error_broken_str(run: Session) -> None:
    what = " (an exception whose __str__ raises)"
    exc = _raised_on_rank_1(run, "broken_str_error", what, BrokenStrError)
    expect("BrokenStrError.args", exc.args, ("code 7",))
    _expect_tag_in_notes("BrokenStrError", exc)


def _is_process_bound(value: Any) -> bool:
    """A generator, or a dict holding an open file (not an in-memory copy of one)."""
    if isinstance(value, types.GeneratorType):
        return True
    if isinstance(value, dict) and isinstance(value.get("out"), list) and value["out"]:
        item = value["out"][0]
        return isinstance(item, io.IOBase) and not isinstance(item, (io.StringIO, io.BytesIO))
    return False


def check_error_unsendable_result(run: Session) -> None:
    faulty = run.shared(Faulty, "two")
    cases = [
        ("generator_result() returning a generator on rank 1", "generator_result", "generator"),
        ("file_result() returning {'out': [an open file]} on rank 1", "file_result", "dict"),
    ]
    shared = []
    for what, name, type_name in cases:
        start = f"{CALLER_TAG} the result of Faulty.{name} on rank 1 ({type_name}) cannot be sent"
        try:
            value = driver_call(getattr(faulty, name))()
        except TypeError as exc:
            expect_true(
                f"{what}: a TypeError starting {start!r}", str(exc).startswith(start), str(exc)
            )
            _expect_failing_rank(what, exc)
            continue
        if isinstance(value, list) and len(value) == 2 and _is_process_bound(value[1]):
            shared.append(what)  # the worker's own object: nothing was sent
            continue
        raise CheckFailed(
            f"{what}: expected TypeError starting {start!r}, got the value {show(value)} (a "
            "stand-in for what the worker returned: a copy of the file, or the generator's "
            "first item)"
        )
    expect("quick(3) after those calls", faulty.quick(3)(), [3, 3])
    if shared:
        expect_true(
            "both results refused, or both handed over as they are", len(shared) == 2, shared
        )
        raise NotApplicable(
            f"mode {run.mode!r} hands the driver the workers' own objects (nothing is copied or "
            "sent, e.g. isolate=False), so every result reaches the caller"
        )


def check_results_made_in_the_call(run: Session) -> None:
    probe = run.shared(Probe, "two")
    got = driver_call(probe.made_here, 10)()
    expect("made_here(10): one result per rank", len(got), 2)
    for rank, result in enumerate(got):
        expect(f"rank {rank}'s closure scale(2)", result["scale"](2), 20 + rank)
        expect(f"rank {rank}'s local class instance .x", result["point"].x, rank)
        expect(f"rank {rank}'s local class name", type(result["point"]).__name__, "Point")


def check_timeout_per_method(run: Session) -> None:
    faulty = run.shared(Faulty, "two")
    # @remote_function(timeout=0.5) on a 3 s call: 2.5 s of margin for a loaded machine.
    slow = driver_call(faulty.slow, 3.0)
    started = time.monotonic()
    try:
        value = slow()
    except CallTimeoutError as exc:
        waited = time.monotonic() - started
        expect_true(
            f"the CallTimeoutError's message to start with {CALLER_TAG!r}",
            str(exc).startswith(CALLER_TAG),
            str(exc),
        )
        expect_true("the wait to end before the 3 s call did (timeout 0.5 s)", waited < 2.9, waited)
    except Exception as exc:
        raise CheckFailed(
            f"slow(3.0) with timeout=0.5: expected CallTimeoutError, got "
            f"{type(exc).__qualname__}: {show(str(exc))}"
        ) from exc
    else:
        raise CheckFailed(
            f"slow(3.0) with timeout=0.5: expected CallTimeoutError, got the value {show(value)}"
        )
    expect("quick(5) after the timed-out call", faulty.quick(5)(), [5, 5])


def check_mesh_dp2_tp2_slice_dp(run: Session) -> None:
    probe = run.shared(Probe, "four", device_mesh=DeviceMesh.from_sizes(dp_size=2, tp_size=2))
    shard0 = [[0, 1, 2, 3], [0, 10, 20, 30], [100, 101, 102, 103], "t"]
    shard1 = [[4, 5, 6], [40, 50, 60], [104, 105, 106], "t"]
    expect(
        "dp_args(batch of 7) with slice_dp on dp=2 x tp=2",
        probe.dp_args(BATCH)(),
        [[0, 0, *shard0], [1, 0, *shard0], [2, 1, *shard1], [3, 1, *shard1]],
    )
    expect(
        "identity() on dp=2 x tp=2",
        probe.identity()(),
        [[0, 4, "four", 0, 2], [1, 4, "four", 0, 2], [2, 4, "four", 1, 2], [3, 4, "four", 1, 2]],
    )


def check_mesh_accessors(run: Session) -> None:
    # [rank, dp, fsdp, tp, pp, cp, ep ranks, data_rank, dp/fsdp/tp/pp world sizes, agrees]
    cases = {
        "dp=2 x tp=2": (
            DeviceMesh.from_sizes(dp_size=2, tp_size=2),
            [
                [0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 2, 1, True],
                [1, 0, 0, 1, 0, 0, 0, 0, 2, 1, 2, 1, True],
                [2, 1, 0, 0, 0, 0, 0, 1, 2, 1, 2, 1, True],
                [3, 1, 0, 1, 0, 0, 0, 1, 2, 1, 2, 1, True],
            ],
        ),
        "dp=2 x fsdp=2": (
            DeviceMesh.from_sizes(dp_size=2, fsdp_size=2),
            [
                [0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 1, 1, True],
                [1, 0, 1, 0, 0, 0, 0, 1, 2, 2, 1, 1, True],
                [2, 1, 0, 0, 0, 0, 0, 2, 2, 2, 1, 1, True],
                [3, 1, 1, 0, 0, 0, 0, 3, 2, 2, 1, 1, True],
            ],
        ),
        "pp=2 x dp=1 x tp=2": (
            DeviceMesh.from_sizes(pp_size=2, tp_size=2),
            [
                [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, True],
                [1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 2, 2, True],
                [2, 0, 0, 0, 1, 0, 0, 0, 1, 1, 2, 2, True],
                [3, 0, 0, 1, 1, 0, 0, 0, 1, 1, 2, 2, True],
            ],
        ),
    }
    for label, (mesh, expected) in cases.items():
        reader = MeshReader(remote_group="four", device_mesh=mesh)
        expect(f"mesh accessors inside the workers on {label}", reader.accessors()(), expected)
        expect(
            f"mesh accessors of {label} on the driver",
            [mesh.dp_rank, mesh.tp_rank, mesh.data_rank, mesh.dp_world_size],
            [None, None, None, mesh.dim_size("dp")],
        )


def check_mesh_dp2_tp2_reductions(run: Session) -> None:
    probe = run.shared(Probe, "four", device_mesh=DeviceMesh.from_sizes(dp_size=2, tp_size=2))
    batch = [1, 2, 3, 4, 5, 6, 7]
    # Data shards [1, 2, 3, 4] and [5, 6, 7]; tp rank 1 adds 100 to its value, so counting a
    # tp peer would show. Each data shard counts once, through its tp-rank-0 worker.
    expect("tp_skewed_mean([1..7]) with collect='mean'", probe.tp_skewed_mean(batch)(), 14.0)
    expect("tp_skewed_sum([1..7]) with collect='sum'", probe.tp_skewed_sum(batch)(), 28.0)
    expect("shard_size_sum([1..7]) with collect='sum'", probe.shard_size_sum(batch)(), 7)
    expect(
        "shard_items([1..7]) with collect='flatten'",
        probe.shard_items(batch)(),
        [1, 2, 3, 4, 5, 6, 7],
    )
    expect(
        "doubled(np.arange(1, 8)) with collect='concat'",
        probe.doubled(np.arange(1, 8))(),
        np.array([2, 4, 6, 8, 10, 12, 14]),
    )


# --------------------------------------------------------------------- collective groups (numpy)
#: The collective group the numpy check forms (names are unique within a run).
NUMPY_GROUP = "twinkle-conformance-numpy"


def check_collective_numpy_broadcast(run: Session) -> None:
    backend = get_plugin("backends", run.mode)
    if (
        getattr(backend, "create_collective_group", None)
        is ExecutionBackend.create_collective_group
    ):
        raise NotApplicable(
            f"mode {run.mode!r} has no collective groups (its backend does not implement "
            "ExecutionBackend.create_collective_group, which is optional)"
        )
    sender = WeightHolder(0, remote_group="two")
    receiver = WeightHolder(1000, remote_group="one")
    group = collective_group(NUMPY_GROUP, [sender, receiver], timeout=120)
    expect(
        "collective_group(...) over a 2-worker and a 1-worker object: [world_size, ranks_of]",
        [group.world_size, group.ranks_of(sender), group.ranks_of(receiver)],
        [3, [0, 1], [2]],
    )
    # The source's call first (where members share a process they run one after another,
    # docs/data.md), both issued before either is waited for (where every member is a process
    # of its own they broadcast together).
    sent = sender.push(NUMPY_GROUP)
    received = receiver.push(NUMPY_GROUP)
    # Every member ends with member 0's (sender rank 0's) arrays, still numpy of its own dtype
    # and shape, and broadcast returns the very arrays it was given.
    rows = sent() + received()
    expect(
        "[member rank, world size] of sender.push() and receiver.push()",
        [row[:2] for row in rows],
        [[0, 3], [1, 3], [2, 3]],
    )
    for row in rows:
        member = f"member {row[0]}, after broadcast([w, b], src=0) of numpy arrays"
        expect(f"{member}: the types broadcast returned", row[2], ["ndarray", "ndarray"])
        expect(
            f"{member}: whether broadcast returned the very arrays given, and how many",
            row[3],
            [True, True, 2],
        )
        expect(
            f"{member}: its float32 weights w [type, dtype, shape, values]",
            row[4],
            ["ndarray", "float32", [4], [0.0, 1.0, 2.0, 3.0]],
        )
        expect(
            f"{member}: its int64 weights b [type, dtype, shape, values]",
            row[5],
            ["ndarray", "int64", [2, 3], [[0, 1, 2], [3, 4, 5]]],
        )


# --------------------------------------------------------------------- wait
def _positions(what: str, got: list, calls: list) -> list[int]:
    """Where each of `got` is in `calls`, by identity."""
    out = []
    for item in got:
        found = [i for i, c in enumerate(calls) if c is item]
        if len(found) != 1:
            raise CheckFailed(f"{what}: returned {show(item)}, which is not one of the calls given")
        out.append(found[0])
    return out


def _waited(what: str, calls: list, num_returns: int) -> list[list[int]]:
    """`wait(calls, num_returns)` as [done positions, pending positions] in `calls`."""
    done, pending = wait(calls, num_returns=num_returns, timeout=120)
    return [_positions(what, done, calls), _positions(what, pending, calls)]


def _finish(calls: list, limit: float = 120.0) -> None:
    """Return once every call in `calls` is done (without collecting any), within `limit`."""
    deadline = time.monotonic() + limit
    while not all(c.done() for c in calls):
        if time.monotonic() > deadline:
            raise CheckFailed(f"calls still running after {limit:g}s: {calls!r}")
        time.sleep(0.005)


#: Seconds the slow call of `check_wait_num_returns` sleeps.
NAP = 1.5


def check_wait_num_returns(run: Session) -> None:
    two = run.shared(Probe, "two")
    other = run.shared(Probe, "other")
    # Three calls, all finished: at most num_returns of them are done, in the order given (all
    # seen finishing in the same round), and every other one is pending, finished or not.
    calls = [two.napped(0.0, i) for i in range(3)]
    # Finished first: calls still running when `wait` looks could be seen finishing in
    # different rounds (a backend may look again between two calls' `done()`).
    _finish(calls)
    expect(
        "wait(3 calls, num_returns=3): [done, pending]", _waited("wait", calls, 3), [[0, 1, 2], []]
    )
    for k, expected in ((1, [[0], [1, 2]]), (2, [[0, 1], [2]]), (0, [[], [0, 1, 2]])):
        expect(
            f"wait(3 finished calls, num_returns={k}): positions [done, pending]",
            _waited("wait", calls, k),
            expected,
        )
    expect("the calls' values", [c() for c in calls], [0, 1, 2])
    expect("wait(3 collected calls, num_returns=1)", _waited("wait", calls, 1), [[0], [1, 2]])
    # Completion order: a 1.5 s call issued first (on 'other'), a quick one second (on 'two').
    started = time.monotonic()
    slow = other.napped(NAP, "slow")
    issued = time.monotonic() - started
    fast = two.napped(0.0, "fast")
    got = _waited("wait([slow, fast], num_returns=1)", [slow, fast], 1)
    took = time.monotonic() - started
    if took < NAP:
        # Returned before the slow call could have finished: the quick one is done, alone.
        expect("wait([slow, fast], num_returns=1) while slow still runs", got, [[1], [0]])
        expect("wait([slow], num_returns=1) then", _waited("wait", [slow], 1), [[0], []])
    elif issued >= NAP:
        # The backend ran the slow call as it was issued: it finished before the quick one was
        # issued, so it comes first.
        expect("wait([slow, fast], num_returns=1) after slow ran as issued", got, [[0], [1]])
    else:  # too slow a machine to tell the order: one done, the other pending
        expect_true("one call done and the other pending", sorted(got) == [[0], [1]], got)
    expect("the slow and the quick call's values", [slow(), fast()], ["slow", "fast"])


def check_wait_loop_each_result_once(run: Session) -> None:
    two = run.shared(Probe, "two")
    other = run.shared(Probe, "other")
    naps = [0.2, 0.0, 0.1, 0.0, 0.05, 0.0]
    for k in (1, 2):
        calls = [
            (other if i % 2 == 0 else two).napped(nap, 10 * k + i) for i, nap in enumerate(naps)
        ]
        pending = list(calls)
        ready_sizes: list[int] = []
        values: list[Any] = []
        positions: list[int] = []
        while pending and len(ready_sizes) < len(calls):
            ready, pending = wait(pending, num_returns=min(k, len(pending)), timeout=120)
            ready_sizes.append(len(ready))
            positions += _positions("wait(pending, ...)", ready, calls)
            values += [x() for x in ready]
        expect(
            f"ready, pending = wait(pending, num_returns={k}) in a loop over 6 calls: the size of "
            "each round's ready",
            ready_sizes,
            [k] * (6 // k),
        )
        expect(
            f"every call ready exactly once (num_returns={k})", sorted(positions), list(range(6))
        )
        expect(
            f"every result collected exactly once (num_returns={k})",
            sorted(values),
            [10 * k + i for i in range(6)],
        )


def check_get_many(run: Session) -> None:
    two = run.shared(Probe, "two")
    other = run.shared(Probe, "other")
    faulty = run.shared(Faulty, "two")
    # Values in the order given, across two groups and two collectors, each cached on its call.
    calls = [
        other.napped(0.2, "slow"),
        two.received(1),
        two.napped(0.0, "quick"),
        other.received({"k": [1, 2]}),
    ]
    values = get([*calls, calls[1]], timeout=120)
    expect(
        "get([napped 'slow', received 1, napped 'quick', received {...}, received 1 again])",
        values,
        ["slow", [1, 1], "quick", [{"k": [1, 2]}, {"k": [1, 2]}], [1, 1]],
    )
    expect("each call resolved by get", [c.resolved for c in calls], [True] * 4)
    expect_true(
        "a call's value after get is the very value get returned",
        calls[3]() is values[3],
        calls[3](),
    )
    expect("get([])", get([]), [])
    # A failure raises, with the failing call's own call site, without waiting for a slow call
    # given before it (where the backend runs calls while they are issued, both have finished).
    started = time.monotonic()
    slow = other.napped(NAP, "slow")
    issued = time.monotonic() - started
    failing = driver_call(faulty.value_error, 5)
    exc = expect_raises("get([slow, value_error(5)])", lambda: get([slow, failing]), ValueError)
    took = time.monotonic() - started
    _expect_tagged_message("get([slow, value_error(5)])", exc, "bad batch 5")
    _expect_failing_rank("get([slow, value_error(5)])", exc)
    if issued < NAP / 2:
        expect_true(
            f"get raised before the {NAP:g} s call given first finished (fail fast)",
            took < NAP,
            f"{took:.2f} s",
        )
    expect("the slow call's value afterwards", slow(), "slow")
    # A timeout names the call still running; the call can still be collected.
    started = time.monotonic()
    late = other.napped(NAP, "late")
    if time.monotonic() - started < NAP / 2:
        expect_raises(
            "get([a 1.5 s call], timeout=0.1)", lambda: get([late], 0.1), CallTimeoutError
        )
    expect("the timed-out call's value afterwards", late(), "late")
    # Bad input: named, with what to do instead.
    for what, bad, pattern in (
        ("get(one LazyCollect)", lambda: get(two.received(0)), r"call it"),
        ("get([a number])", lambda: get([3]), r"only LazyCollect"),  # type: ignore[list-item]
        ("get(calls, timeout=-1)", lambda: get([], timeout=-1), r"timeout"),
    ):
        err = expect_raises(what, bad, ConfigurationError)
        said = re.search(pattern, str(err)) is not None
        expect_true(f"{what}: the message says {pattern!r}", said, str(err))


# --------------------------------------------------------------------- arguments
def _expect_names_argument(what: str, exc: BaseException, pattern: str, argument: str) -> None:
    message = str(exc)
    expect_true(
        f"{what}: a ConfigurationError naming {argument} as 'Probe.take: {argument}'",
        re.search(pattern, message) is not None,
        message,
    )
    expect_true(
        f"{what}: a message without the value's repr {UNSENDABLE_REPR!r}",
        UNSENDABLE_REPR not in message and " object at 0x" not in message,
        message,
    )


def check_error_unsendable_argument(run: Session) -> None:
    probe = run.shared(Probe, "two")
    holder, lock = Unsendable(), threading.Lock()
    cases = [
        (
            "take(Unsendable()) (an object holding a threading.Lock)",
            lambda: probe.take(holder)(),
            r"Probe\.take: argument 0\b",
            "argument 0",
        ),
        (
            "take(value=threading.Lock())",
            lambda: probe.take(value=lock)(),
            r"Probe\.take: (keyword )?argument 'value'",
            "argument 'value'",
        ),
    ]
    shared = []
    _UNSENDABLE[:] = [holder, lock]
    try:
        for what, call, pattern, argument in cases:
            try:
                value = call()
            except ConfigurationError as exc:
                _expect_names_argument(what, exc, pattern, argument)
                continue
            except Exception as exc:
                raise CheckFailed(
                    f"{what}: expected ConfigurationError naming 'Probe.take: {argument}', got "
                    f"{type(exc).__qualname__}: {show(str(exc))}"
                ) from exc
            if not same(value, [[0, True], [1, True]]):
                raise CheckFailed(
                    f"{what}: expected ConfigurationError naming 'Probe.take: {argument}', got "
                    f"the value {show(value)} ([rank, received the driver's own object])"
                )
            shared.append(what)
    finally:
        _UNSENDABLE.clear()
    expect("take(5) after those calls", probe.take(5)(), [[0, False], [1, False]])
    if shared:
        expect_true(
            "both calls refused, or both given the driver's own objects",
            len(shared) == len(cases),
            shared,
        )
        raise NotApplicable(
            f"mode {run.mode!r} hands workers the driver's own objects (nothing is copied or "
            "sent, e.g. isolate=False), so no argument fails to reach a worker"
        )


TWO = (("two", 2),)
_CHECKS: tuple[Check, ...] = (
    Check(
        "dispatch_all",
        "dispatch='all': every worker gets the full arguments",
        TWO,
        check_dispatch_all,
    ),
    Check(
        "dispatch_slice",
        "dispatch='slice': lists split, earlier workers take the remainder",
        TWO,
        check_dispatch_slice,
    ),
    Check(
        "dispatch_slice_dp",
        "dispatch='slice_dp': dicts walked, lists/arrays/tuples sliced",
        TWO,
        check_dispatch_slice_dp,
    ),
    Check("dispatch_callable", "a plain function as dispatcher", TWO, check_dispatch_callable),
    Check(
        "dispatch_wrong_share_count",
        "a dispatcher returning the wrong number of shares is a "
        "ConfigurationError, and nothing runs",
        TWO,
        check_dispatch_wrong_share_count,
    ),
    Check("execute_all", "execute='all' with each worker's context", TWO, check_execute_all),
    Check(
        "execute_first_collect_none",
        "execute='first' runs on worker 0 only",
        TWO,
        check_execute_first_collect_none,
    ),
    Check(
        "execute_peer",
        "execute='peer' from inside a worker and from the driver",
        (("two", 2), ("other", 2)),
        check_execute_peer,
    ),
    Check("collect_none", "collect='none': every result in rank order", TWO, check_collect_none),
    Check("collect_flatten", "collect='flatten': list results joined", TWO, check_collect_flatten),
    Check("collect_mean", "collect='mean' over data shards", TWO, check_collect_mean),
    Check("collect_sum", "collect='sum' over data shards", TWO, check_collect_sum),
    Check(
        "sum_refuses_what_it_cannot_add",
        "collect='sum' of arrays whose shapes differ, or of lists, is a CollectError, never a "
        "broadcast or joined result",
        TWO,
        check_sum_refuses_what_it_cannot_add,
    ),
    Check("collect_first", "collect='first': rank 0's result", TWO, check_collect_first),
    Check(
        "collect_last_pp", "collect='last_pp' (and mean) on a pp=2 mesh", TWO, check_collect_last_pp
    ),
    Check("collect_concat", "collect='concat' of numpy arrays", TWO, check_collect_concat),
    Check("collect_callable", "a plain function as collector", TWO, check_collect_callable),
    Check(
        "collect_dict_per_key",
        "dict results are collected per key",
        TWO,
        check_collect_dict_per_key,
    ),
    Check(
        "collect_tuple_elementwise",
        "tuple results are collected element-wise",
        TWO,
        check_collect_tuple_elementwise,
    ),
    Check(
        "device_mesh_keyword",
        "__init__(self, device_mesh) receives a mesh given by keyword",
        TWO,
        check_device_mesh_keyword,
    ),
    Check(
        "device_mesh_positional",
        "__init__(self, device_mesh) receives a mesh given positionally",
        TWO,
        check_device_mesh_positional,
    ),
    Check(
        "device_mesh_default",
        "__init__(self, device_mesh) receives the default mesh",
        TWO,
        check_device_mesh_default,
    ),
    Check(
        "lazy_to_group_of_other_size",
        "a LazyCollect passed to a group of another size",
        (("two", 2), ("one", 1)),
        check_lazy_to_group_of_other_size,
    ),
    Check(
        "lazy_to_constructor",
        "LazyCollects passed to a constructor (also nested)",
        (("two", 2), ("one", 1)),
        check_lazy_to_constructor,
    ),
    Check(
        "lazy_nested_in_arguments",
        "LazyCollects nested in a dict/list argument",
        (("two", 2), ("one", 1)),
        check_lazy_nested_in_arguments,
    ),
    Check(
        "dispatcher_raising_leaves_nothing_behind",
        "a dispatcher raising after a LazyCollect argument was resolved leaves nothing behind",
        (("two", 2), ("one", 1)),
        check_dispatcher_raising_leaves_nothing_behind,
    ),
    Check(
        "colocated_roles_share_processes",
        "objects created on one group run in the same process per rank",
        TWO,
        check_colocated_roles_share_processes,
    ),
    Check(
        "colocated_hand_off_by_reference",
        "a result handed to another object of its group is the very object on each rank",
        (("two", 2), ("one", 1)),
        check_colocated_hand_off_by_reference,
    ),
    Check(
        "roles_take_turns",
        "offload()/onload() run around switches between colocated roles",
        TWO,
        check_roles_take_turns,
    ),
    Check(
        "iterate_remote_loader",
        "iterating a remote class with __iter__/__next__",
        TWO,
        check_iterate_remote_loader,
    ),
    Check(
        "seeded_random",
        "workers built from one seed draw the same numbers",
        TWO,
        check_seeded_random,
    ),
    Check(
        "error_value_error",
        "a ValueError keeps its type; message tagged with the call site",
        TWO,
        check_error_value_error,
    ),
    Check(
        "error_key_error",
        "a KeyError keeps its key; call site in __notes__",
        TWO,
        check_error_key_error,
    ),
    Check(
        "error_os_error",
        "a FileNotFoundError keeps errno/strerror/filename; call site in __notes__",
        TWO,
        check_error_os_error,
    ),
    Check(
        "error_two_arg_init",
        "an exception whose __init__ takes two arguments keeps its type and attributes",
        TWO,
        check_error_two_arg_init,
    ),
    Check(
        "error_unpicklable_attribute",
        "an exception holding a threading.Lock keeps its type",
        TWO,
        check_error_unpicklable_attribute,
    ),
    Check(
        "error_broken_str",
        "an exception whose own __str__ raises keeps its type and arguments, the call site in "
        "its notes",
        TWO,
        check_error_broken_str,
    ),
    Check(
        "timeout_per_method",
        "@remote_function(timeout=...) raises CallTimeoutError with the "
        "call site; a later call still works",
        TWO,
        check_timeout_per_method,
    ),
    Check(
        "error_unsendable_result",
        "a result that cannot be sent back (a generator, a dict holding an open file) is that "
        "rank's TypeError naming the method, the rank and the type, never a stand-in; a later "
        "call works",
        TWO,
        check_error_unsendable_result,
    ),
    Check(
        "results_made_in_the_call",
        "a closure or an instance of a class defined inside the method comes back usable, "
        "by value (as Ray's cloudpickle sends it), in every mode",
        TWO,
        check_results_made_in_the_call,
    ),
    Check(
        "error_unsendable_argument",
        "an argument that cannot be sent to a worker is a ConfigurationError naming the method "
        "and the argument, not its value; a later call works",
        TWO,
        check_error_unsendable_argument,
    ),
    Check(
        "wait_num_returns",
        "wait(calls, num_returns=k) gives at most k done, in completion order, the rest pending",
        (("two", 2), ("other", 2)),
        check_wait_num_returns,
    ),
    Check(
        "wait_loop_each_result_once",
        "ready, pending = wait(pending, num_returns=k) in a loop sees every call once",
        (("two", 2), ("other", 2)),
        check_wait_loop_each_result_once,
    ),
    Check(
        "get_many",
        "get(calls) gives every value in the order given, each cached on its call, and raises "
        "the first failure with its call site without waiting for slower calls",
        (("two", 2), ("other", 2)),
        check_get_many,
    ),
    Check(
        "collective_numpy_broadcast",
        "a collective group broadcasting numpy arrays: the same values and types in every mode",
        (("two", 2), ("one", 1)),
        check_collective_numpy_broadcast,
    ),
    Check(
        "mesh_dp2_tp2_slice_dp",
        "slice_dp on dp=2 x tp=2 shards by data rank",
        (("four", 4),),
        check_mesh_dp2_tp2_slice_dp,
    ),
    Check(
        "mesh_accessors",
        "mesh.dp_rank/tp_rank/.../data_rank and <dim>_world_size answer for the worker running "
        "the code (None on the driver)",
        (("four", 4),),
        check_mesh_accessors,
    ),
    Check(
        "mesh_dp2_tp2_reductions",
        "mean/sum/flatten/concat on dp=2 x tp=2 count each data shard once",
        (("four", 4),),
        check_mesh_dp2_tp2_reductions,
    ),
)


def conformance_checks() -> list[Check]:
    """Every conformance check, in the order the runner runs them."""
    return list(_CHECKS)

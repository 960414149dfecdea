"""The design's own example and the shapes real scripts have, run unchanged in every mode.

`run(mode, **options)` returns JSON-ready values that must equal `EXPECTED` (written down
here, not computed by another backend): a `device_mesh` constructor parameter (by keyword,
positionally, the default mesh, a local object), a LazyCollect passed to a constructor (also
nested), every exception shape keeping its type and the driver call site, and a call after a
failure nobody collected (which used to deadlock).

    python design_example.py inprocess
    torchrun --standalone --nproc_per_node=2 design_example.py local
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    as_completed,
    initialize,
    remote_class,
    remote_function,
    shutdown,
    wait,
)

THIS_FILE = __file__


class TwoArgError(Exception):
    """An exception whose __init__ takes other arguments than it passes on (unpicklable as is)."""

    def __init__(self, code: int, where: str) -> None:
        super().__init__(f"code {code} at {where}")
        self.code = code
        self.where = where


class LockedError(Exception):
    """An exception holding something that cannot be pickled."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


@remote_class(execute="all")
class MyModel:
    def __init__(self, device_mesh: DeviceMesh, scale: int = 1):
        self.device_mesh = device_mesh
        self.scale = scale

    @remote_function(dispatch="all", collect="none")
    def mesh(self):
        return [self.device_mesh.world_size, self.device_mesh.data_world_size, self.scale]


@remote_class()
class Holder:
    def __init__(self, value, nested):
        self.value = value
        self.nested = nested

    @remote_function(dispatch="all", collect="first")
    def get(self):
        return [self.value, self.nested]


@remote_class()
class Source:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="first")
    def make(self, x):
        return x * 10

    @remote_function(dispatch="all", collect="first")
    def ok(self):
        return "ok"

    @remote_function(dispatch="all", collect="first")
    def slow(self, x, delay: float):
        time.sleep(delay)
        return x

    @remote_function(dispatch="all", collect="first")
    def fail(self, kind: str):
        if kind == "value":
            raise ValueError("plain message")
        if kind == "key":
            raise KeyError("missing column")
        if kind == "os":
            raise FileNotFoundError(2, "No such file or directory", "/no/such/file")
        if kind == "two_args":
            raise TwoArgError(7, "shard 3")
        if kind == "locked":
            raise LockedError("holds a lock")
        if kind == "exit":
            sys.exit(3)
        raise AssertionError(kind)


def _error_shape(lazy) -> list:
    """[type name, call site present, the attributes that must survive]."""
    try:
        lazy()
    except Exception as exc:
        text = "\n".join([str(exc), *getattr(exc, "__notes__", [])])
        site = f"[twinkle driver caller: {THIS_FILE}:" in text
        extra = {
            "args": [a if isinstance(a, (int, str)) else repr(a) for a in exc.args],
            "errno": getattr(exc, "errno", None),
            "code": getattr(exc, "code", None),
        }
        if type(exc).__name__ in ("ValueError", "TwoArgError", "LockedError", "WorkerExitError"):
            extra["args"] = [str(a).split("] ", 1)[-1] for a in exc.args]  # tag stripped
        if type(exc).__name__ == "WorkerExitError":
            extra["args"] = ["SystemExit(3)" in str(exc)]
        return [type(exc).__name__, site, extra]
    return ["no error", False, {}]


def run(mode: str, **options) -> dict:
    initialize(
        mode,
        seed=7,
        groups=[DeviceGroup("model", 2, "cpu"), DeviceGroup("solo", 1, "cpu")],
        **options,
    )
    try:
        out: dict = {}
        # The design's example, keyword and positional, then the default mesh.
        m = MyModel(device_mesh=DeviceMesh.from_sizes(dp_size=2), remote_group="model")
        out["mesh_keyword"] = m.mesh()()
        m = MyModel(DeviceMesh.from_sizes(dp_size=2), 3, remote_group="model")
        out["mesh_positional"] = m.mesh()()
        out["mesh_default"] = MyModel(remote_group="model", scale=5).mesh()()
        local = MyModel()
        out["mesh_local"] = [local.device_mesh.world_size, local.scale]
        # LazyCollects as constructor arguments, also nested, from a group of another size.
        src = Source(remote_group="solo")
        holder = Holder(src.make(4), {"x": [src.make(5)]}, remote_group="model")
        out["lazy_constructor"] = holder.get()()
        # A failure nobody collects, then another call: must not hang.
        src.fail("value")
        out["after_uncollected_failure"] = src.ok()(timeout=120)
        out["errors"] = {
            kind: _error_shape(src.fail(kind))
            for kind in ("value", "key", "os", "two_args", "locked", "exit")
        }
        out["waiting"] = _waiting(src, holder)
        return out
    finally:
        shutdown()


def _waiting(src, holder) -> dict:
    """Many calls without blocking: await, wait and as_completed give the same values anywhere."""

    async def together():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        beat = asyncio.ensure_future(ticker())
        values = await asyncio.gather(src.slow(1, 0.3), holder.get(), src.slow(2, 0.0))
        beat.cancel()
        return values, ticks

    values, ticks = asyncio.run(together())
    calls = [src.slow(i, 0.05 * i) for i in range(4)]
    done, pending = wait(calls, num_returns=2, timeout=60)
    everything, _ = wait(calls, num_returns=4, timeout=60)
    return {
        "await": values,
        "loop_ran": ticks >= 1,
        "wait": [len(done) >= 2, len(done) + len(pending), [c() for c in everything]],
        "as_completed": sorted(c() for c in as_completed(calls, timeout=60)),
    }


EXPECTED = {
    "mesh_keyword": [[2, 2, 1], [2, 2, 1]],
    "mesh_positional": [[2, 2, 3], [2, 2, 3]],
    "mesh_default": [[2, 2, 5], [2, 2, 5]],
    "mesh_local": [1, 1],
    "lazy_constructor": [40, {"x": [50]}],
    "after_uncollected_failure": "ok",
    "waiting": {
        "await": [1, [40, {"x": [50]}], 2],
        "loop_ran": True,
        "wait": [True, 4, [0, 1, 2, 3]],
        "as_completed": [0, 1, 2, 3],
    },
    "errors": {
        "value": ["ValueError", True, {"args": ["plain message"], "errno": None, "code": None}],
        "key": ["KeyError", True, {"args": ["missing column"], "errno": None, "code": None}],
        "os": [
            "FileNotFoundError",
            True,
            {"args": [2, "No such file or directory"], "errno": 2, "code": None},
        ],
        "two_args": [
            "TwoArgError",
            True,
            {"args": ["code 7 at shard 3"], "errno": None, "code": 7},
        ],
        "locked": ["LockedError", True, {"args": ["holds a lock"], "errno": None, "code": None}],
        "exit": ["WorkerExitError", True, {"args": [True], "errno": None, "code": None}],
    },
}


if __name__ == "__main__":
    result = run(sys.argv[1] if len(sys.argv) > 1 else "inprocess")
    print("DESIGN " + json.dumps(result, sort_keys=True), flush=True)
    sys.exit(0 if result == EXPECTED else 1)

"""A torchrun job for the success path of calls: usage `collect_fast_job.py OUT_DIR [PATH]`.

PATH says how the slot gathers travel: `sockets` (the default of a job on one machine, over
Unix sockets) or `gloo` (`node_sockets=False`, as a job across nodes does); `control` in the
report says which one the run used.

Every torch.distributed collective is counted (the methods of `ProcessGroup`, which every
`torch.distributed` collective ends in), so each section records the collectives each call ran:
name and bytes. Each rank writes OUT_DIR/rank<r>.json with the sections:

- `counts`: collect='mean' of a python float, five times after a first call (`first`: it
  also sends the result's structure once), with collectives per call and value, and
  collect='none' twice (`none_counts`), and twice of a result too big for the slot
  (`medium`, about 2 KB, with its values);
- `values`: sums and means that must equal the collector's `r0 + r1` (then `/ 2`) exactly,
  including -0.0, NaN, ints, a float next to an int, numpy floats, and a group of one worker;
- `failure`: the method raises on rank 1 only: the error every rank catches, then a good call;
- `diverged`: rank 0 and rank 1 make different calls (another method, another call site, a
  gather against a reduce): the error each rank gets (or the value, which would be wrong),
  then an aligned call that must still work.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
from collective_counter import SEEN, collectives  # noqa: F401 (wraps the collectives)

from twinkle_core import (
    DeviceGroup,
    get_device_placement,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

OUT = Path(sys.argv[1])
PATH = sys.argv[2] if len(sys.argv) > 2 else "sockets"
RANK = int(os.environ["RANK"])


def as_json(value):
    """Floats as repr strings (keeps -0.0 and nan), with their type name."""
    return [type(value).__name__, repr(value)]


@remote_class()
class Worker:
    def __init__(self) -> None:
        self.rank = get_worker_context().rank

    @remote_function(dispatch="all", collect="mean")
    def scalar(self) -> float:
        return 0.5 + self.rank

    @remote_function(dispatch="all", collect="mean")
    def other(self) -> float:
        return 10.0

    @remote_function(dispatch="all", collect="mean")
    def mean_of(self, values):
        return values[self.rank]

    @remote_function(dispatch="all", collect="sum")
    def sum_of(self, values):
        return values[self.rank]

    @remote_function(dispatch="all", collect="none")
    def nothing(self) -> None:
        return None

    @remote_function(dispatch="all", collect="none")
    def medium(self) -> list:
        return [self.rank] * 1000  # about 2 KB pickled: more than a slot holds

    @remote_function(dispatch="all", collect="mean")
    def fails_on(self, rank: int) -> float:
        if self.rank == rank:
            raise ValueError(f"bad batch on rank {rank}")
        return 1.0


initialize(
    "local",
    seed=3,
    groups=[DeviceGroup("g", 2, "cpu"), DeviceGroup("solo", 1, "cpu")],
    timeout=60,
    node_sockets=PATH == "sockets",
)
worker = Worker(remote_group="g")
solo = Worker(remote_group="solo")
report: dict = {"rank": RANK, "control": "gloo"}
_probe = collectives(lambda: worker.nothing()())[1]
report["control"] = "sockets" if _probe and _probe[0][0] == "socket_gather" else "gloo"
report["placement"] = get_device_placement(detail=True)

# ----------------------------------------------------------------- counts
# The first sum/mean of a result structure also sends the structure (exchange.py): not counted.
report["first"] = collectives(lambda: worker.scalar()())
report["counts"] = [collectives(lambda: worker.scalar()()) for _ in range(5)]
report["none_counts"] = [collectives(lambda: worker.nothing()())[1] for _ in range(2)]
report["medium"] = [collectives(lambda: worker.medium()()) for _ in range(2)]

# ----------------------------------------------------------------- values
CASES = {
    "tenths": [0.1, 0.2],
    "big_small": [1e16, 1.0],
    "negative_zero": [-0.0, -0.0],
    "zero_and_negative_zero": [0.0, -0.0],
    "nan": [float("nan"), 1.0],
    "inf": [float("inf"), 1.0],
    "ints": [1, 2],
    "float_and_int": [0.25, 3],
    "numpy": [np.float64(0.1), np.float64(0.2)],
}
values: dict = {}
for case, per_rank in CASES.items():
    mean, mean_seen = collectives(lambda per_rank=per_rank: worker.mean_of(per_rank)())
    total, _ = collectives(lambda per_rank=per_rank: worker.sum_of(per_rank)())
    expected_sum = per_rank[0] + per_rank[1]  # what the collector computes, in rank order
    values[case] = {
        "mean": as_json(mean),
        "expected_mean": as_json(expected_sum / 2),
        "sum": as_json(total),
        "expected_sum": as_json(expected_sum),
        "mean_collectives": mean_seen,
    }
for case, only in {"solo": [0.75], "solo_negative_zero": [-0.0]}.items():
    value, seen = collectives(lambda only=only: solo.mean_of(only)())
    values[case] = {
        "mean": as_json(value),
        "expected_mean": as_json(only[0]),
        "mean_collectives": seen,
    }
report["values"] = values

# ----------------------------------------------------------------- failure
try:
    worker.fails_on(1)()  # CALL-FAIL
    report["failure"] = {"caught": None}
except ValueError as exc:
    report["failure"] = {
        "caught": [type(exc).__name__, str(exc), list(getattr(exc, "__notes__", []))]
    }
report["failure"]["after"] = worker.scalar()()

# ----------------------------------------------------------------- divergence
diverged: dict = {}


def attempt(name: str, call) -> None:
    try:
        diverged[name] = {"value": repr(call())}
    except Exception as exc:
        diverged[name] = {"error": [type(exc).__name__, str(exc)]}
    diverged[name]["after"] = worker.scalar()()  # aligned again: must work


if RANK == 0:
    attempt("method", lambda: worker.scalar()())
    attempt("site", lambda: worker.scalar()())  # DIVERGE-SITE-0
    attempt("kind", lambda: worker.scalar()())
else:
    attempt("method", lambda: worker.other()())
    attempt("site", lambda: worker.scalar()())  # DIVERGE-SITE-1
    attempt("kind", lambda: worker.nothing()())
report["diverged"] = diverged

(OUT / f"rank{RANK}.json").write_text(json.dumps(report))
shutdown()
assert math.isfinite(report["failure"]["after"])

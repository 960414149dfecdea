"""A torchrun job for transports under torchrun: usage `transport_job.py OUT_DIR`.

Every process first runs the same calls in mode 'inprocess' (the reference values), then in
mode 'local' with every torch.distributed collective counted (the methods of `ProcessGroup`:
name and bytes), and writes OUT_DIR/rank<r>.json:

- `cases`: for each collector and structure of a `transport='gloo'` method, whether the value
  equals the in-process one (types, dtypes, shapes and bits), and the collectives of the call;
  `used_bytes` is what the collector's used results hold in tensors;
- `handoff`: `consumer.load(producer.get())` (collect='first'): the consumer's sum and the
  collectives of both calls;
- `auto`, `auto_small`, `object_store`: a 2 MiB CPU tensor under `auto` and `object_store`, a
  small one under `auto`;
- `writable`: a received tensor written in place, and the next call's value unchanged;
- `fallback`: a numpy result under `gloo` (twice): equal values and the log lines;
- `unknown`: a method naming an unregistered transport: the error;
- `failure`: the `gloo` method fails on one rank: the error, the seconds it took, and a good
  call after it; `diverged`: rank 0 and rank 1 call different held methods.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from collective_counter import COUNTING, SEEN, collectives

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

COUNTING[0] = False  # counted only inside collectives() and the marked blocks

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])
N = 128 * 1024  # float32 elements: 512 KiB per tensor (above the 64 KiB hold threshold)


# ----------------------------------------------------------------------- values
def tensor(rank: int, n: int = N, dtype=torch.float32, shift: float = 0.0):
    return (torch.arange(n, dtype=torch.float64) * 0.1 + rank + shift).to(dtype)


def structure(kind: str, rank: int):
    if kind == "tensor":
        return tensor(rank)
    if kind == "dict":
        return {
            "w": tensor(rank),
            "b": tensor(rank, N // 2, torch.int64, 3.0),
            "step": 7 + rank,
            "name": f"rank{rank}",
        }
    if kind == "odict":
        pairs = [("a", tensor(rank).reshape(256, -1)), ("h", tensor(rank, N, torch.bfloat16))]
        return OrderedDict(pairs)
    if kind == "list":
        return [tensor(rank), tensor(rank, N // 4, shift=0.5)]
    if kind == "tuple":
        return (tensor(rank), "tag", 2.5)
    if kind == "numbers":  # for sum/mean: tensors only
        return {"w": tensor(rank), "v": tensor(rank, N // 2, torch.float64, 1.0)}
    raise ValueError(kind)


CASES = {
    "none": ["tensor", "dict", "odict", "list", "tuple"],
    "first": ["tensor", "dict", "odict", "list", "tuple"],
    "last_pp": ["tensor", "dict"],
    "flatten": ["list", "dict"],
    "concat": ["tensor", "numbers", "list"],
    "sum": ["tensor", "numbers"],
    "mean": ["tensor", "numbers"],
}


def _method(collect: str, kind: str, transport: str = "gloo"):
    def fn(self):
        return structure(kind, get_worker_context().rank)

    fn.__name__ = fn.__qualname__ = f"m_{collect}_{kind}_{transport}"
    return remote_function(dispatch="all", collect=collect, transport=transport)(fn)


def _producer_class():
    ns: dict = {"__init__": lambda self: None, "__module__": __name__}
    for collect, kinds in CASES.items():
        for kind in kinds:
            m = _method(collect, kind)
            ns[m.__name__] = m
    for transport in ("auto", "object_store"):
        m = _method("first", "tensor", transport)
        ns[m.__name__] = m

    @remote_function(dispatch="all", collect="first")
    def big_auto(self):  # 2 MiB: `auto` moves it
        return tensor(get_worker_context().rank, 512 * 1024)

    @remote_function(dispatch="all", collect="first", transport="object_store")
    def big_store(self):
        return tensor(get_worker_context().rank, 512 * 1024)

    @remote_function(dispatch="all", collect="first")
    def small_auto(self):
        return tensor(get_worker_context().rank, 1024)

    @remote_function(dispatch="all", collect="none", transport="gloo")
    def as_numpy(self):
        return np.arange(N, dtype=np.float32) + get_worker_context().rank

    @remote_function(dispatch="all", collect="first", transport="gloo")
    def fails_on(self, rank):
        if get_worker_context().rank == rank:
            raise ValueError(f"no weights on rank {rank}")
        return tensor(get_worker_context().rank)

    @remote_function(dispatch="all", collect="sum", transport="gloo")
    def mixed_sum(self):  # rank 0's result is held, rank 1's (requires grad) is not
        rank = get_worker_context().rank
        return tensor(rank).requires_grad_(rank == 1)

    @remote_function(dispatch="all", collect="none", transport="gloo")
    def other(self):
        return tensor(get_worker_context().rank, shift=5.0)

    ns.update(
        big_auto=big_auto,
        big_store=big_store,
        small_auto=small_auto,
        as_numpy=as_numpy,
        fails_on=fails_on,
        mixed_sum=mixed_sum,
        other=other,
    )
    return remote_class()(type("Producer", (), ns))


Producer = _producer_class()


@remote_class()
class Consumer:
    def __init__(self) -> None:
        self.weights = None

    @remote_function(dispatch="all", collect="first")
    def load(self, weights) -> float:
        self.weights = weights
        return float(weights["w"].double().sum()) + float(weights["b"].double().sum())

    @remote_function(dispatch="all", collect="none")
    def pointer(self) -> int:
        return self.weights["w"].data_ptr()

    @remote_function(dispatch="all", collect="none", writable_args=True)
    def scale(self, weights) -> int:
        weights["w"].mul_(2.0)  # in place: declared writable_args, so a private copy
        return weights["w"].data_ptr()


@remote_class()
class Odd:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="first", transport="no_such_transport")
    def get(self):
        return 1


GROUPS = [DeviceGroup("p", 2, "cpu"), DeviceGroup("q", 2, "cpu")]
PP = DeviceMesh.from_sizes(pp_size=2)


def objects():
    return Producer(remote_group="p"), Producer(remote_group="q", device_mesh=PP)


def names():
    for collect, kinds in CASES.items():
        for kind in kinds:
            yield collect, kind


def run_cases(producer, piped) -> dict:
    out = {}
    for collect, kind in names():
        target = piped if collect == "last_pp" else producer
        out[(collect, kind)] = getattr(target, f"m_{collect}_{kind}_gloo")
    return out


# ----------------------------------------------------------------------- comparing
def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def used_bytes(collect: str, kind: str) -> int:
    """Tensor bytes of the results the collector uses (2 workers, dp=2; last_pp: pp=2)."""
    one = tensor_bytes(structure(kind, 0))
    return one if collect in ("first", "last_pp") else 2 * one


# ----------------------------------------------------------------------- reference run
initialize("inprocess", seed=3, groups=GROUPS)
producer, piped = objects()
reference = {key: m()() for key, m in run_cases(producer, piped).items()}
reference["numpy"] = producer.as_numpy()()
reference["mixed_sum"] = producer.mixed_sum()().detach()
shutdown()

# ----------------------------------------------------------------------- torchrun run
records: list[str] = []


class Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record.getMessage())


logging.getLogger("twinkle").addHandler(Capture())
logging.getLogger("twinkle").setLevel(logging.INFO)

initialize("local", seed=3, groups=GROUPS, timeout=60, dist_timeout=60)
producer, piped = objects()
consumer = Consumer(remote_group="q")
report: dict = {"rank": RANK, "cases": {}}

for (collect, kind), method in run_cases(producer, piped).items():
    value, seen = collectives(lambda m=method: m()())
    report["cases"][f"{collect}/{kind}"] = {
        "same": same(value, reference[(collect, kind)]),
        "seen": seen,
        "used_bytes": used_bytes(collect, kind),
    }

# The hand-off of the weight sync: consumer.load(producer.get()), collect='first'.
lazy, seen_get = collectives(lambda: producer.m_first_dict_gloo())
got, seen_load = collectives(lambda: consumer.load(lazy)())
weights = structure("dict", 0)
report["handoff"] = {
    "value": got,
    "expected": float(weights["w"].double().sum()) + float(weights["b"].double().sum()),
    "seen": seen_get + seen_load,
    "used_bytes": used_bytes("first", "dict"),
}

# The LazyCollect handed on: the consumer kept the delivered tensors (no copy), a later
# collect gets its own copy, and a writable_args method gets a private one.
handed = consumer.pointer()()[RANK]
later = lazy()
scaled = consumer.scale(lazy)()[RANK]
report["handoff"]["later_same"] = same(later, weights)
report["handoff"]["later_is_a_copy"] = later["w"].data_ptr() != handed
report["handoff"]["writable_is_a_copy"] = scaled not in (handed, later["w"].data_ptr())
report["handoff"]["after_writes"] = same(lazy(), weights) and same(later, weights)

# A sum of a held result (rank 0) and one no transport carries (rank 1: requires grad).
value, seen = collectives(lambda: producer.mixed_sum()())
report["mixed_sum"] = {
    "same": same(value.detach(), reference["mixed_sum"]) and value.requires_grad,
    "seen": seen,
}

for name in ("big_auto", "big_store", "small_auto"):
    value, seen = collectives(lambda n=name: getattr(producer, n)()())
    size = 512 * 1024 if name != "small_auto" else 1024
    report[name] = {"same": same(value, tensor(0, size)), "seen": seen}

# Received tensors are the receiver's own: writable, and writing does not reach the holder.
value = producer.m_first_tensor_gloo()()
value.add_(1.0)
again = producer.m_first_tensor_gloo()()
report["writable"] = {
    "changed": bool(torch.equal(value, tensor(0) + 1.0)),
    "again_same": same(again, reference[("first", "tensor")]),
}

# A result the named transport cannot carry takes the exchange, logged once per process.
before = len(records)
values = [producer.as_numpy()() for _ in range(2)]
report["fallback"] = {
    "same": all(same(v, reference["numpy"]) for v in values),
    "lines": [r for r in records[before:] if "as_numpy" in r],
}

# An unregistered transport name: the same error on every process, before any exchange.
try:
    Odd(remote_group="p").get()()
    report["unknown"] = None
except ConfigurationError as exc:
    report["unknown"] = [type(exc).__name__, str(exc)]

# A failing producer: nothing is broadcast, every process raises; then the run goes on.
failure: dict = {}
for rank in (1, 0):
    start, mark = time.monotonic(), len(SEEN)
    COUNTING[0] = True
    try:
        producer.fails_on(rank)()
        failure[str(rank)] = {"value": True}
    except ValueError as exc:
        failure[str(rank)] = {"caught": [type(exc).__name__, str(exc)]}
    finally:
        COUNTING[0] = False
    failure[str(rank)]["seconds"] = time.monotonic() - start
    failure[str(rank)]["seen"] = [list(c) for c in SEEN[mark:]]
failure["after"] = same(producer.fails_on(-1)(), tensor(0))
report["failure"] = failure

# Diverging calls of held methods: the same error everywhere, nothing broadcast.
mark = len(SEEN)
COUNTING[0] = True
try:
    if RANK == 0:
        producer.m_none_tensor_gloo()()
    else:
        producer.other()()
    report["diverged"] = {"value": True}
except Exception as exc:
    report["diverged"] = {"error": [type(exc).__name__, str(exc)]}
finally:
    COUNTING[0] = False
report["diverged"]["seen"] = [list(c) for c in SEEN[mark:]]
report["diverged"]["after"] = same(producer.m_none_tensor_gloo()(), reference[("none", "tensor")])

shutdown()
(OUT / f"rank{RANK}.json").write_text(json.dumps(report))

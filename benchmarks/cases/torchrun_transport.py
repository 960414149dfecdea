"""15. torchrun transports: a weight hand-off between two torchrun processes (CPU, gloo).

One job (`python -m torch.distributed.run --standalone --nproc_per_node=2
cases/torchrun_transport.py --rounds N`) hands a dict of eight float32 CPU tensors (64 MiB and
256 MiB in all) from a producer to a consumer, `consumer.load(producer.get())` with
`collect='first'` (rank 0's weights, as a weight sync does), alternating:
- gloo: `get` declared `transport='gloo'`: rank 0's tensors broadcast as raw tensors over
  twinkle's control group (`twinkle_local/transports.py`);
- object store: `transport='object_store'`, today's path: the result pickled and all-gathered
  to every process through the exchange;
- raw: hand-written torch.distributed, the same tensors broadcast from rank 0 (the receiver
  allocating them, as twinkle's does) over the default gloo group, then the same read.
In every variant each process reads every 4096th element of every tensor it ends with (the
consumer's `load`; the raw one does it inline). At 1 MiB, `auto` (which picks gloo from 1 MB)
against `object_store`: where `auto`'s threshold stands. Rows: gloo / raw and gloo / object
store per size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from handoffs import hand_off_rows
from harness import BENCH_DIR, Context, Row, emit, interleave, median, run_child

from twinkle_core import get_worker_context, remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "15", "torchrun-transport", False, ()

SIZES_MIB = (64, 256)
PIECES = 8
WARMUP = 2


def make_weights(mib: float, rank: int) -> dict:
    import torch

    n = int(mib * 1024 * 1024) // 4 // PIECES
    return {
        f"layer{i}": torch.full((n,), float(rank + i), dtype=torch.float32) for i in range(PIECES)
    }


def read(weights: dict) -> float:
    return float(sum(float(t[::4096].sum()) for t in weights.values()))


class Weights:
    def __init__(self) -> None:
        self.weights: dict = {}

    def make(self, mib: float) -> None:
        self.weights = make_weights(mib, get_worker_context().rank)

    def get(self) -> dict:
        return self.weights


@remote_class()
class Producer(Weights):
    make = remote_function(dispatch="all")(Weights.make)
    get_gloo = remote_function(collect="first", transport="gloo")(Weights.get)
    get_store = remote_function(collect="first", transport="object_store")(Weights.get)
    get_auto = remote_function(collect="first")(Weights.get)


@remote_class()
class Consumer:
    def __init__(self) -> None:
        self.weights: dict = {}

    @remote_function(dispatch="all", collect="first")
    def load(self, weights: dict) -> float:
        self.weights = weights
        return read(weights)


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 7
    start = time.perf_counter()
    result = run_child(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(BENCH_DIR / "cases" / "torchrun_transport.py"),
            f"--rounds={rounds}",
        ],
        timeout=1800,
    )
    job_s = time.perf_counter() - start
    rows = hand_off_rows(
        NUMBER,
        lambda mib, title: (
            f"torchrun 2 procs: {mib} MiB weight hand-off, transport='gloo' vs {title}"
        ),
        result,
        SIZES_MIB,
        "gloo",
        [("raw", "raw broadcast", True), ("store", "'object_store'", False)],
        extra={"job_wall_s": job_s},
    )
    s = result["1"]
    rows.append(
        Row(
            "15e",
            "torchrun 2 procs: 1 MiB hand-off, transport='auto' (gloo) vs 'object_store'",
            median(s["auto"]),
            median(s["store"]),
            unit="per hand-off",
            note="both twinkle: auto's threshold",
            extra={"median_s": {k: median(v) for k, v in s.items()}},
            samples={"twinkle": s["auto"], "raw": s["store"]},
        )
    )
    return rows


# ------------------------------------------------------------------------------- the job
def job(rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from twinkle_core import DeviceGroup, initialize, shutdown

    initialize(
        mode="local",
        groups=[DeviceGroup("producer", 2), DeviceGroup("consumer", 2)],
        timeout=600,
        dist_timeout=600,
    )
    rank = dist.get_rank()
    producer = Producer(remote_group="producer")
    consumer = Consumer(remote_group="consumer")
    out: dict = {}

    def timed(fn):
        def go() -> float:
            dist.barrier()
            begin = time.perf_counter()
            fn()
            return time.perf_counter() - begin

        return go

    for mib in (1, *SIZES_MIB):
        producer.make(mib)()
        mine = make_weights(mib, rank)  # the raw variant's own copy of the same tensors
        expected = read(make_weights(mib, 0))

        def check(value: float, expected=expected) -> None:
            assert value == expected, (value, expected)

        def gloo() -> None:
            check(consumer.load(producer.get_gloo())())

        def store() -> None:
            check(consumer.load(producer.get_store())())

        def auto() -> None:
            check(consumer.load(producer.get_auto())())

        def raw(mine=mine) -> None:
            got = {}
            for key, t in mine.items():
                buf = t if rank == 0 else torch.empty_like(t)
                dist.broadcast(buf, src=0)
                got[key] = buf
            check(read(got))

        variants = {"gloo": gloo, "store": store, "raw": raw}
        if mib == 1:
            variants = {"auto": auto, "store": store, "raw": raw}
        out[str(mib)] = interleave(
            {k: timed(v) for k, v in variants.items()},
            rounds if mib > 1 else 5 * rounds,
            warmup=WARMUP,
        )
        del mine
    shutdown()
    if rank == 0:
        emit(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    job(parser.parse_args().rounds)

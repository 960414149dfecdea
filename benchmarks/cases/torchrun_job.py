"""The torchrun job of case 5 (`cases/torchrun.py` launches it; it prints its result as JSON).

Every process runs the same lines, as a twinkle torchrun driver does. Per round each variant
makes `--calls` calls; the variants alternate (interleaved rounds), with a barrier before each
so both processes start it together. With `--bursts=1`, two more variants make `BURST` calls
back to back per sample (twinkle's mean and the raw all_reduce), where a sample of one call
also holds how far apart the two processes left the barrier. Rank 0 prints the medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist
from harness import emit, interleave, median

from twinkle_core import initialize, remote_class, remote_function, shutdown


@remote_class()
class Worker:
    def __init__(self) -> None:
        self.value = 0.5

    @remote_function(dispatch="all", collect="mean")
    def scalar(self) -> float:
        return self.value

    @remote_function(dispatch="all", collect="none")
    def nothing(self) -> None:
        return None

    @remote_function(dispatch="all", collect="none")
    def medium(self) -> list:
        return MEDIUM


#: A result too big for a call's slot (about 2 KB pickled), as a list of metrics or token ids.
MEDIUM = list(range(1000))
#: Calls per sample of the "-burst" variants.
BURST = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--node-sockets", type=int, default=1)
    parser.add_argument("--bursts", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    initialize(mode="local", timeout=120, dist_timeout=120, node_sockets=bool(args.node_sockets))
    init_s = time.perf_counter() - start
    worker = Worker(remote_group="default")
    world = dist.get_world_size()
    value = 0.5

    def barrier_then(fn):
        def go() -> float:
            dist.barrier()
            begin = time.perf_counter()
            fn()
            return time.perf_counter() - begin

        return go

    def twinkle_mean() -> None:
        for _ in range(args.calls):
            got = worker.scalar()()
        assert got == value, got

    def raw_mean() -> None:
        for _ in range(args.calls):
            t = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(t)
            got = t.item() / world
        assert got == value, got

    def raw_mean_checked() -> None:
        # The least a call that also detects diverging ranks needs: the value and one check
        # number in one all_reduce. gloo all-reduces a single element in one step and anything
        # longer in more, so this is the floor for a checked collect='mean' here.
        for _ in range(args.calls):
            t = torch.tensor([value, 1.0], dtype=torch.float64)
            dist.all_reduce(t)
            got = t[0].item() / world
            assert t[1].item() == world
        assert got == value, got

    def twinkle_none() -> None:
        for _ in range(args.calls):
            got = worker.nothing()()
        assert got == [None] * world, got

    def raw_none() -> None:
        for _ in range(args.calls):
            got = [None] * world
            dist.all_gather_object(got, None)
        assert got == [None] * world, got

    def twinkle_medium() -> None:
        for _ in range(args.calls):
            got = worker.medium()()
        assert got == [MEDIUM] * world

    def raw_medium() -> None:
        for _ in range(args.calls):
            got = [None] * world
            dist.all_gather_object(got, MEDIUM)
        assert got == [MEDIUM] * world

    def burst(fn):  # BURST calls back to back: no barrier's exit skew in each sample
        def go() -> None:
            for _ in range(BURST):
                fn()

        return go

    variants = {
        "twinkle-mean": twinkle_mean,
        "raw-all_reduce": raw_mean,
        "raw-all_reduce-checked": raw_mean_checked,
        "twinkle-none": twinkle_none,
        "raw-all_gather_object": raw_none,
        "twinkle-medium": twinkle_medium,
        "raw-all_gather_object-medium": raw_medium,
        "twinkle-mean-burst": burst(twinkle_mean),
        "raw-all_reduce-burst": burst(raw_mean),
    }
    per = {k: args.calls * (BURST if k.endswith("-burst") else 1) for k in variants}
    if not args.bursts:  # quick mode: no bursts
        for name in [k for k in variants if k.endswith("-burst")]:
            del variants[name]
    samples = interleave({k: barrier_then(v) for k, v in variants.items()}, args.rounds, per=per)
    shutdown()
    if int(os.environ.get("RANK", "0")) == 0:
        emit(
            {
                "world": world,
                "initialize_s": init_s,
                "medians": {k: median(v) for k, v in samples.items()},
                "samples": samples,
            }
        )


if __name__ == "__main__":
    main()

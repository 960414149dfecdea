"""What small gloo collectives cost between the processes of one machine: the floor under
torchrun's `collect='mean'` (docs/performance.md, case 5).

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/gloo_collectives.py

Rank 0 prints, per collective, the wall and CPU time per call (median of `--rounds` rounds of
`--calls` calls, every round started by a barrier). gloo all-reduces a single element in one
step and anything longer in more, which is why a call that carries a check beside its value
costs more than the one-number `all_reduce` case 5 compares against.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    group = dist.new_group(backend="gloo")
    f64 = {n: torch.zeros(n, dtype=torch.float64) for n in (1, 2, 3, 8)}
    i64, f32 = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.float32)
    slot, slots = torch.zeros(256, dtype=torch.uint8), torch.zeros(512, dtype=torch.uint8)
    one_a, one_b = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)

    def two_at_once() -> None:
        a = dist.all_reduce(one_a, group=group, async_op=True)
        b = dist.all_reduce(one_b, group=group, async_op=True)
        a.wait()
        b.wait()

    cases = {
        **{
            f"all_reduce {n} float64": (lambda t=t: dist.all_reduce(t, group=group))
            for n, t in f64.items()
        },
        "all_reduce 2 int64": lambda: dist.all_reduce(i64, group=group),
        "all_reduce 2 float32": lambda: dist.all_reduce(f32, group=group),
        "all_gather 256 bytes (twinkle's slot)": lambda: dist.all_gather_into_tensor(
            slots, slot, group=group
        ),
        "two 1-element all_reduces at once": two_at_once,
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, call in cases.items():
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.calls):
                call()
            results[name].append(
                (
                    (time.perf_counter() - wall) / args.calls,
                    (time.process_time() - cpu) / args.calls,
                )
            )
    if dist.get_rank() == 0:
        for name, samples in results.items():
            wall = statistics.median(w for w, _ in samples) * 1e6
            cpu = statistics.median(c for _, c in samples) * 1e6
            print(f"{name:40s} {wall:7.0f} us wall {cpu:7.0f} us cpu", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

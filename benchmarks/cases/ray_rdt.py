"""16. Ray Direct Transport: a dict of torch CPU tensors (64 MiB and 512 MiB) handed from one
actor to another over twinkle's `nixl` transport (Ray Direct Transport, NIXL's UCX backend on
CPU memory), against twinkle's `gloo` transport, twinkle's object store path and Ray's own nixl
path written by hand, all in one run.

Runs in a child process with its own one-node cluster (object store 2.5 GiB). Variants,
alternating, at each size:
- nixl: `consumer.load(producer.get_nixl())(...)` with `get_nixl` declared `transport='nixl'`:
  the producer keeps the tensors, the driver has it hand them to Ray with
  `.options(tensor_transport="nixl")` and the consumer's task takes that ref
  (`twinkle_ray.transports`);
- gloo: the same with `transport='gloo'` (case 14's path);
- object store: the same with `transport='object_store'` (what `auto` does for CPU tensors);
- raw RDT: hand-written Ray, actors declared `enable_tensor_transport=True`, a
  `tensor_transport="nixl"` method whose ref is passed to the consumer.
Each consumer reads every 4096th element of every tensor and returns a float. Needs the `nixl`
package (`pip install nixl`; on this machine nixl-cu12 1.5.1 and the nixl 1.5.1 meta package);
without it the case reports no rows and says why.
"""

from __future__ import annotations

import sys

from handoffs import hand_off_rows
from harness import BENCH_DIR, Context, Row, child_env, emit, run_child

from cases import ray_transport

NUMBER, NAME, QUICK, SESSION = "16", "ray-rdt", False, ()

SIZES_MIB = (64, 512)
WARMUP = 3


#: Case 14's classes (its producer hands the weights out by every transport).
Weights, Loader = ray_transport.Weights, ray_transport.Loader
Producer, Consumer = ray_transport.Producer, ray_transport.Consumer


def run(ctx: Context) -> list[Row]:
    from twinkle_ray.transports import nixl_installed

    if not nixl_installed():
        print("case 16: the nixl package is not installed: no rows (pip install nixl)")
        return []
    rounds = 3 if ctx.quick else 7
    result = run_child(
        [sys.executable, str(BENCH_DIR / "cases" / "ray_rdt.py"), str(rounds)],
        timeout=1800,
        env=child_env(),
    )
    return hand_off_rows(
        NUMBER,
        lambda mib, title: f"Ray: {mib} MiB CPU tensor hand-off, transport='nixl' vs {title}",
        result,
        SIZES_MIB,
        "nixl",
        [
            ("rdt", "raw RDT nixl", True),
            ("store", "'object_store'", False),
            ("gloo", "transport='gloo'", False),
        ],
    )


# ------------------------------------------------------------------------------- child
def child(rounds: int) -> None:
    import cases.ray_rdt as me  # workers import the classes by this name

    getters = {"nixl": "get_nixl", "gloo": "get_gloo", "store": "get_store"}
    # CPU groups are declared for Ray Direct Transport only when asked.
    emit(ray_transport.measure(me, rounds, "nixl", getters, direct_transport=True))


if __name__ == "__main__":
    child(int(sys.argv[1]))

"""14. Transports: a dict of torch CPU tensors (64 MiB and 512 MiB) handed from one actor to
another over twinkle's `gloo` transport, against twinkle's object store path and against Ray
Direct Transport's own gloo path written by hand, all in one run.

Runs in a child process with its own one-node cluster (object store 2.5 GiB). Variants,
alternating, at each size:
- gloo: `consumer.load(producer.get_gloo())(...)` with `get_gloo` declared
  `transport='gloo'`: the producer keeps the tensors and sends them over a gloo group twinkle
  made between the two groups (`twinkle_ray.transports`);
- object store: the same with `transport='object_store'` (what `auto` does for CPU tensors);
- raw RDT: hand-written Ray, actors declared `enable_tensor_transport=True`,
  `create_collective_group([p, c], backend="torch_gloo")`, a `tensor_transport="gloo"` method
  whose ref is passed to the consumer.
Each consumer reads every 4096th element of every tensor and returns a float; the producer's
work (handing out its tensors) is part of every variant. Rows: gloo vs raw RDT, and gloo vs
object store (the second is twinkle against twinkle: how much the device-direct path costs or
saves on one node).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from handoffs import hand_off_rows, same_every_time
from harness import BENCH_DIR, Context, Row, child_env, emit, interleave, run_child

from cases import ray_handoff
from twinkle_core import remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "14", "ray-transport", False, ()

SIZES_MIB = (64, 512)
WARMUP = 3


class Weights(ray_handoff.Weights):
    """Case 12's producer, its tensors made per size (`make`) instead of at start."""

    def __init__(self) -> None:
        self.weights: dict = {}

    def make(self, mib: int) -> None:
        ray_handoff.Weights.__init__(self, mib)


#: Case 12's consumer: reads every 4096th element of every tensor it receives.
Loader = ray_handoff.Loader


@remote_class()
class Producer(Weights):
    make = remote_function(dispatch="all")(Weights.make)
    get_gloo = remote_function(collect="first", transport="gloo")(Weights.get_weights)
    get_nixl = remote_function(collect="first", transport="nixl")(Weights.get_weights)  # 16
    get_store = remote_function(collect="first", transport="object_store")(Weights.get_weights)
    noop = remote_function(dispatch="all")(Weights.noop)


@remote_class()
class Consumer(Loader):
    load = remote_function(dispatch="all", collect="first")(Loader.load_weights)
    noop = remote_function(dispatch="all")(Loader.noop)


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 7
    result = run_child(
        [sys.executable, str(BENCH_DIR / "cases" / "ray_transport.py"), str(rounds)],
        timeout=1200,
        env=child_env(),
    )
    return hand_off_rows(
        NUMBER,
        lambda mib, title: f"Ray: {mib} MiB tensor hand-off, transport='gloo' vs {title}",
        result,
        SIZES_MIB,
        "gloo",
        [("rdt", "raw RDT gloo", True), ("store", "'object_store'", False)],
    )


# ------------------------------------------------------------------------------- child
def measure(
    me: Any,
    rounds: int,
    raw_transport: str,
    getters: dict[str, str],
    direct_transport: bool = False,
) -> dict[str, dict[str, list[float]]]:
    """Per size, seconds per hand-off of each twinkle variant (`getters`: variant name ->
    the `me.Producer` method that hands the weights out) and of hand-written Ray Direct
    Transport over `raw_transport` (variant `rdt`), alternating, on a cluster of its own.
    `me` is the case's module, imported by its name so workers import the classes alike."""
    import ray
    from harness import start_ray, stop_ray
    from ray.experimental.collective import create_collective_group

    from twinkle_core import DeviceGroup, initialize, shutdown

    @ray.remote(num_cpus=0.25, enable_tensor_transport=True)
    class RawProducer(me.Weights):
        @ray.method(tensor_transport=raw_transport)
        def get_weights(self):
            return self.weights

    raw_consumer_cls = ray.remote(num_cpus=0.25, enable_tensor_transport=True)(me.Loader)

    temp_dir = start_ray(num_cpus=4, object_store_mib=2560)
    try:
        initialize(
            mode="ray",
            groups=[DeviceGroup("producer", 1), DeviceGroup("consumer", 1)],
            cpus_per_worker=0.25,
            direct_transport=direct_transport,
        )
        producer = me.Producer(remote_group="producer")
        consumer = me.Consumer(remote_group="consumer")
        raw_producer, raw_consumer = RawProducer.remote(), raw_consumer_cls.remote()
        ray.get([raw_producer.noop.remote(), raw_consumer.noop.remote()], timeout=600)
        if raw_transport == "gloo":  # two-sided: Ray needs a collective group
            create_collective_group([raw_producer, raw_consumer], backend="torch_gloo")
        consumer.noop()(600)
        out: dict = {}
        for mib in me.SIZES_MIB:
            producer.make(mib)(600)
            ray.get(raw_producer.make.remote(mib), timeout=600)
            check = same_every_time()

            def hand_off(getter: str, check=check) -> Callable[[], None]:
                get = getattr(producer, getter)
                return lambda: check(consumer.load(get())(600))

            def rdt(check=check) -> None:
                ref = raw_consumer.load_weights.remote(raw_producer.get_weights.remote())
                check(ray.get(ref, timeout=600))

            variants = {name: hand_off(getter) for name, getter in getters.items()}
            out[str(mib)] = interleave({**variants, "rdt": rdt}, rounds, warmup=me.WARMUP)
        shutdown()
        return out
    finally:
        stop_ray(temp_dir)


def child(rounds: int) -> None:
    import cases.ray_transport as me  # workers import the classes by this name

    emit(measure(me, rounds, "gloo", {"gloo": "get_gloo", "store": "get_store"}))


if __name__ == "__main__":
    child(int(sys.argv[1]))

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

from harness import BENCH_DIR, Context, Row, child_env, emit, interleave, median, run_child

from cases import ray_handoff, ray_transport
from twinkle_core import remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "16", "ray-rdt", False, ()

SIZES_MIB = (64, 512)
WARMUP = 3


Weights = ray_transport.Weights
Loader = ray_handoff.Loader


@remote_class()
class Producer(Weights):
    make = remote_function(dispatch="all")(Weights.make)
    get_nixl = remote_function(collect="first", transport="nixl")(Weights.get_weights)
    get_gloo = remote_function(collect="first", transport="gloo")(Weights.get_weights)
    get_store = remote_function(collect="first", transport="object_store")(Weights.get_weights)
    noop = remote_function(dispatch="all")(Weights.noop)


@remote_class()
class Consumer(Loader):
    load = remote_function(dispatch="all", collect="first")(Loader.load_weights)
    noop = remote_function(dispatch="all")(Loader.noop)


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
    rows = []
    for i, mib in enumerate(SIZES_MIB):
        s = result[str(mib)]
        med = {k: median(v) for k, v in s.items()}
        gbs = {k: mib / 1024 / v for k, v in med.items()}
        note = ", ".join(f"{k} {v:.2f} GiB/s" for k, v in gbs.items())
        extra = {"median_s": med, "gib_per_s": gbs, "payload_mib": mib}
        for letter, other, title in (
            ("a", "rdt", "raw RDT nixl"),
            ("b", "store", "'object_store'"),
            ("c", "gloo", "transport='gloo'"),
        ):
            rows.append(
                Row(
                    f"16{chr(ord(letter) + 3 * i)}",
                    f"Ray: {mib} MiB CPU tensor hand-off, transport='nixl' vs {title}",
                    med["nixl"],
                    med[other],
                    unit="per hand-off",
                    note=note if other == "rdt" else "both twinkle",
                    extra=extra,
                    samples={"twinkle": s["nixl"], "raw": s[other]},
                )
            )
    return rows


# ------------------------------------------------------------------------------- child
def child(rounds: int) -> None:
    import ray
    from harness import start_ray, stop_ray

    import cases.ray_rdt as me  # workers import the classes by this name
    from twinkle_core import DeviceGroup, initialize, shutdown

    @ray.remote(num_cpus=0.25, enable_tensor_transport=True)
    class RawProducer(me.Weights):
        @ray.method(tensor_transport="nixl")
        def get_weights(self):
            return self.weights

    raw_consumer_cls = ray.remote(num_cpus=0.25, enable_tensor_transport=True)(me.Loader)

    temp_dir = start_ray(num_cpus=4, object_store_mib=2560)
    try:
        initialize(
            mode="ray",
            groups=[DeviceGroup("producer", 1), DeviceGroup("consumer", 1)],
            cpus_per_worker=0.25,
            direct_transport=True,  # CPU groups: declared for RDT only when asked
        )
        producer = me.Producer(remote_group="producer")
        consumer = me.Consumer(remote_group="consumer")
        raw_producer, raw_consumer = RawProducer.remote(), raw_consumer_cls.remote()
        ray.get([raw_producer.noop.remote(), raw_consumer.noop.remote()], timeout=600)
        consumer.noop()(600)
        out: dict = {}
        for mib in SIZES_MIB:
            producer.make(mib)(600)
            ray.get(raw_producer.make.remote(mib), timeout=600)
            expected: list[float] = []

            def check(value: float, expected=expected) -> None:
                if expected:
                    assert value == expected[0], (value, expected[0])
                else:
                    expected.append(value)

            def nixl() -> None:
                check(consumer.load(producer.get_nixl())(600))

            def gloo() -> None:
                check(consumer.load(producer.get_gloo())(600))

            def store() -> None:
                check(consumer.load(producer.get_store())(600))

            def rdt() -> None:
                check(
                    ray.get(
                        raw_consumer.load_weights.remote(raw_producer.get_weights.remote()),
                        timeout=600,
                    )
                )

            out[str(mib)] = interleave(
                {"nixl": nixl, "gloo": gloo, "store": store, "rdt": rdt}, rounds, warmup=WARMUP
            )
        shutdown()
        emit(out)
    finally:
        stop_ray(temp_dir)


if __name__ == "__main__":
    child(int(sys.argv[1]))

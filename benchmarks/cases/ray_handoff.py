"""12. Weight hand-off between groups: a 512 MiB dict of torch tensors from a policy group to
a sampler group (`sampler.load_weights(policy.get_weights())`), and from one producer to 4
consumers.

Runs in child processes with their own one-node cluster (object store 2.5 GiB), twice: once
with Ray's defaults and once with `RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1` cluster-wide (raw
Ray's fastest tensor path, off by default). Variants, alternating:
- twinkle: `sampler.load_weights(policy.get_weights())(...)` with `get_weights` on
  `execute='first', collect='first'` and `load_weights` on `dispatch='all'`: the LazyCollect
  is handed to the sampler group without being collected on the driver;
- raw refs: hand-written Ray, the producer actor's result ref passed to every consumer actor
  (`ray.get([s.load_weights.remote(ref) for s in samplers])`), the driver never fetching;
- through the driver: the same with `ray.get(ref)` on the driver and the dict passed to each
  consumer, what code that collects the weights first does.
Each consumer reads every 4096th element of every tensor (nothing arrives lazily unread) and
returns a float; the producer's work (making the result) is part of every variant. The driver's
resident memory is sampled every 2 ms during one extra run of each variant (peak growth).
Three untimed rounds first touch every page of the object store (a fresh page costs a fault:
about 0.35 s per 512 MiB, paid by whichever variant first uses it).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

from harness import BENCH_DIR, Context, Row, child_env, emit, interleave, median, run_child

from twinkle_core import remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "12", "ray-handoff", False, ()

MIB = 512
LAYERS = 8
#: Untimed rounds first: the object store's pages are faulted in on first use (about 0.35 s per
#: 512 MiB here), so every variant is timed on a store whose pages all exist already.
WARMUP = 3


class Weights:
    """The producer: `LAYERS` float32 tensors, `MIB` MiB in all (made once)."""

    def __init__(self, mib: int = MIB) -> None:
        import torch

        rows = mib * 1024 * 1024 // LAYERS // 4 // 1024
        self.weights = {f"layer{i}": torch.full((rows, 1024), float(i)) for i in range(LAYERS)}

    def get_weights(self):
        return self.weights

    def noop(self) -> None:
        return None


class Loader:
    """A consumer: reads every 4096th element of every tensor it receives."""

    def load_weights(self, weights) -> float:
        return float(sum(float(t.view(-1)[::4096].sum()) for t in weights.values()))

    def noop(self) -> None:
        return None


@remote_class()
class Policy(Weights):
    get_weights = remote_function(execute="first", collect="first")(Weights.get_weights)
    noop = remote_function(dispatch="all")(Weights.noop)


@remote_class()
class Sampler(Loader):
    load_weights = remote_function(dispatch="all", collect="none")(Loader.load_weights)
    noop = remote_function(dispatch="all")(Loader.noop)


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 5
    rows = []
    for flag, ids in (("0", ("12a", "12b")), ("1", ("12c", "12d"))):
        result = run_child(
            [sys.executable, str(BENCH_DIR / "cases" / "ray_handoff.py"), str(rounds)],
            timeout=1200,
            env=child_env({"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": flag}),
        )
        raw_name = "raw refs" + (" (Ray zero-copy tensors)" if flag == "1" else "")
        for row_id, key, title in (
            (ids[0], "2to2", f"Ray: {MIB} MiB weight hand-off, 2 -> 2 actors vs {raw_name}"),
            (ids[1], "1to4", f"Ray: {MIB} MiB weight hand-off, 1 -> 4 consumers vs {raw_name}"),
        ):
            s = result[key]
            med = {k: median(v) for k, v in s.items()}
            rss = {k: v / 2**20 for k, v in result[f"{key}_rss"].items()}
            extra = {"median_s": med, "driver_rss_growth_mib": rss, "payload_mib": MIB}
            note = f"driver RSS growth MiB: twinkle {rss['twinkle']:.0f}, raw {rss['raw']:.0f}"
            if "driver" in med:
                extra["driver_over_raw"] = med["driver"] / med["raw"]
                note += (
                    f", through the driver {rss['driver']:.0f} "
                    f"({med['driver'] / med['raw']:.2f}x raw time)"
                )
            rows.append(
                Row(
                    row_id,
                    title,
                    med["twinkle"],
                    med["raw"],
                    unit="per hand-off",
                    note=note,
                    extra=extra,
                    samples=s,
                )
            )
    return rows


# ------------------------------------------------------------------------------- child
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_growth(fn) -> int:
    """The driver's peak resident-memory growth while `fn` runs (sampled every 2 ms)."""
    import gc

    gc.collect()
    base = _rss()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], _rss())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        stop.set()
        thread.join()
    return max(peak[0], _rss()) - base


def child(rounds: int) -> None:
    warnings.filterwarnings("ignore", message=".*[Zz]ero-copy.*")
    import ray
    from harness import start_ray, stop_ray

    import cases.ray_handoff as me  # workers import the classes by this name
    from twinkle_core import DeviceGroup, initialize, shutdown

    temp_dir = start_ray(num_cpus=4, object_store_mib=2560)
    try:
        initialize(
            mode="ray",
            groups=[
                DeviceGroup("policy", 2),
                DeviceGroup("sampler", 2),
                DeviceGroup("fleet", 4),
            ],
            cpus_per_worker=0.25,
        )
        policy = me.Policy(remote_group="policy")
        sampler = me.Sampler(remote_group="sampler")
        fleet = me.Sampler(remote_group="fleet")
        producer = ray.remote(num_cpus=0.25)(me.Weights).remote()
        loaders = [ray.remote(num_cpus=0.25)(me.Loader).remote() for _ in range(6)]
        ray.get([a.noop.remote() for a in [producer, *loaders]], timeout=600)
        policy.noop()(600)
        sampler.noop()(600)
        fleet.noop()(600)
        expected: list[float] = []

        def check(values: list[float], n: int) -> None:
            assert len(values) == n and len(set(values)) == 1, values
            if expected:
                assert values[0] == expected[0], (values[0], expected[0])
            else:
                expected.append(values[0])

        def twinkle(consumers=sampler, n=2) -> None:
            check(consumers.load_weights(policy.get_weights())(600), n)

        def raw(consumers=loaders[:2]) -> None:
            ref = producer.get_weights.remote()
            check(
                ray.get([c.load_weights.remote(ref) for c in consumers], timeout=600),
                len(consumers),
            )

        def driver(consumers=loaders[:2]) -> None:
            weights = ray.get(producer.get_weights.remote(), timeout=600)
            check(
                ray.get([c.load_weights.remote(weights) for c in consumers], timeout=600),
                len(consumers),
            )
            del weights

        out: dict = {}
        two = {"twinkle": twinkle, "raw": raw, "driver": driver}
        out["2to2"] = interleave(two, rounds, warmup=WARMUP)
        out["2to2_rss"] = {name: peak_growth(fn) for name, fn in two.items()}

        def twinkle4() -> None:
            twinkle(fleet, 4)

        def raw4() -> None:
            raw(loaders[2:6])

        four = {"twinkle": twinkle4, "raw": raw4}
        out["1to4"] = interleave(four, rounds, warmup=WARMUP)
        out["1to4_rss"] = {name: peak_growth(fn) for name, fn in four.items()}
        shutdown()
        emit(out)
    finally:
        stop_ray(temp_dir)


if __name__ == "__main__":
    child(int(sys.argv[1]))

"""The weight-sync shape on Ray: `sampler.load_weights(policy.get_weights())` with a 256 MiB
dict of torch tensors (`collect='first'`, two 2-actor groups) must not pass through the driver.

The hand-off runs in a child process with its own one-node cluster (an object store big enough
for the payload; the session cluster's is 100 MiB), so the driver's resident memory is the
child's alone. Its peak during the hand-off, sampled every 2 ms from /proc/self/statm, may grow
by at most 10% of the payload (fetching it through the driver grew it by five times the
payload). The consumers' checksums prove they received the whole payload.

Run by hand: `python tests/ray/test_handoff_memory.py 256` prints the measurement as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from _support import prestart

MIB = 256
LAYERS = 8


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The highest resident set size seen while the block runs (sampled every 2 ms)."""

    def __enter__(self) -> PeakRss:
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.base


def child(mib: int) -> dict:
    import gc
    import shutil
    import tempfile

    import ray
    import torch

    from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

    @remote_class()
    class Policy:
        def __init__(self, mib: int) -> None:
            per_layer = mib * 1024 * 1024 // LAYERS // 4
            self.weights = {
                f"layer{i}.weight": torch.full((per_layer // 1024, 1024), float(i + 1))
                for i in range(LAYERS)
            }
            self.small = {"w": torch.ones(64, 1024)}

        @remote_function(dispatch="all", collect="first")
        def get_weights(self, small=False):
            return self.small if small else self.weights

    @remote_class()
    class Sampler:
        @remote_function(dispatch="all", collect="none")
        def load_weights(self, weights):
            return float(sum(float(t.double().sum()) for t in weights.values()))

    temp_dir = tempfile.mkdtemp(prefix="tw-m-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=4,
        object_store_memory=(3 * mib + 256) * 1024 * 1024,
        include_dashboard=False,
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        initialize(
            "ray",
            groups=[DeviceGroup("policy", 2, "cpu"), DeviceGroup("sampler", 2, "cpu")],
            cpus_per_worker=0.5,
            name="handoff-memory",
        )
        policy = Policy(mib, remote_group="policy")
        sampler = Sampler(remote_group="sampler")
        sampler.load_weights(policy.get_weights(small=True))(300)  # every code path loaded
        weights = policy.get_weights()
        weights.source.pending.wait_replies(300)  # produced: the hand-off alone is measured
        gc.collect()
        started = time.perf_counter()
        with PeakRss() as rss:
            sums = sampler.load_weights(weights)(300)
        seconds = time.perf_counter() - started
        expected = float(sum((i + 1) * mib * 1024 * 1024 / LAYERS / 4 for i in range(LAYERS)))
        opened = weights.source.pending._values is not None
        shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return {
        "payload_bytes": mib * 1024 * 1024,
        "driver_rss_growth_bytes": rss.growth,
        "seconds": seconds,
        "sums": sums,
        "expected": expected,
        "driver_opened_results": opened,
    }


@prestart.fixture
def done(tmp_path_factory):
    """The child's run, in the background from the session's start (tests/_support/
    prestart.py): it has a cluster of its own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for `_support`
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, __file__, str(MIB)],
        capture_output=True,
        text=True,
        timeout=220,
        env=env,
    )


@pytest.mark.timeout(240)
def test_a_256_mib_weight_hand_off_leaves_the_driver_flat(done):
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sums"] == [result["expected"]] * 2  # both consumers got every byte
    assert not result["driver_opened_results"]
    growth, payload = result["driver_rss_growth_bytes"], result["payload_bytes"]
    assert growth < 0.10 * payload, (
        f"the driver grew by {growth / 2**20:.1f} MiB during a {payload / 2**20:.0f} MiB "
        "hand-off; it should not see the payload at all"
    )


if __name__ == "__main__":
    print(json.dumps(child(int(sys.argv[1]) if len(sys.argv) > 1 else MIB)))

"""The worker class of the Ray cases: `Ops` is what raw Ray actors run, `Bench` the very same
methods as a twinkle remote class. Ray workers import this module by name (the suite puts
`benchmarks/` on PYTHONPATH), so raw and twinkle workers run identical code.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np

from twinkle_core import get_worker_context, remote_class, remote_function


class Ops:
    def __init__(self) -> None:
        self.calls = 0

    def noop(self) -> None:
        return None

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def block(self, path: str, limit: float = 300.0) -> None:
        """Keep this worker busy until `path` exists (at most `limit` s)."""
        end = time.monotonic() + limit
        while not os.path.exists(path) and time.monotonic() < end:
            time.sleep(0.002)

    def take(self, value: Any) -> int:
        """A method with an argument, as real calls have (a config dict, token ids, ...)."""
        return 1

    def sample(self, config: Any) -> float:
        """A sampler's small step: draws from numpy's and python's global generators."""
        return float(np.random.rand()) + random.random()

    def mean(self, values: Any) -> float:
        return float(np.mean(values))

    def fail_or_sleep(self, rank: int, seconds: float) -> None:
        if rank == 0:
            raise RuntimeError("rank 0 fails at once (benchmark)")
        time.sleep(seconds)

    def touch(self, value: Any) -> float:
        """Read every 4096th element, so nothing arrives lazily unread."""
        if type(value).__module__.startswith("torch"):
            return float(value.view(-1)[::4096].float().sum()) + value.numel()
        flat = np.asarray(value).reshape(-1)
        return float(flat[::4096].sum()) + flat.size


@remote_class()
class Bench(Ops):
    noop = remote_function(collect="none")(Ops.noop)
    sleep = remote_function(dispatch="all")(Ops.sleep)
    block = remote_function(dispatch="all")(Ops.block)
    take = remote_function(dispatch="all", collect="none")(Ops.take)
    sample = remote_function(dispatch="all", collect="none")(Ops.sample)
    mean = remote_function(dispatch="slice_dp", collect="mean")(Ops.mean)
    touch = remote_function(dispatch="slice_dp", collect="sum")(Ops.touch)

    @remote_function(dispatch="all")
    def fail_or_sleep(self, seconds: float) -> None:
        ctx = get_worker_context()
        return Ops.fail_or_sleep(self, ctx.rank if ctx is not None else 0, seconds)

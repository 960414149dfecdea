"""The conformance driver: one script run unchanged in every mode.

It exercises every built-in dispatcher, execute mode and collector, chaining between groups,
handle passing with `execute='peer'`, iteration and per-worker random state, and prints the
collected values as one JSON line prefixed with `CONFORMANCE `. The in-process backend's output
is the reference every other backend must reproduce:

    python tests/_support/conformance.py inprocess
    torchrun --standalone --nproc_per_node=2 tests/_support/conformance.py local
    python tests/_support/conformance.py ray
"""

from __future__ import annotations

import json
import sys

import numpy as np

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)


def to_json(value):
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


@remote_class()
class Trainer:
    def __init__(self, offset: float) -> None:
        self.offset = offset
        self.draw = int(np.random.randint(0, 10**6))  # same seed in every worker process
        self.calls = 0

    @remote_function(dispatch="all", collect="none")
    def identity(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.world_size, ctx.group_name, ctx.data_rank, ctx.data_world_size]

    @remote_function(dispatch="slice", collect="flatten")
    def scale(self, xs, factor):
        return [x * factor + self.offset for x in xs]

    @remote_function(dispatch="slice_dp", collect="concat")
    def double(self, batch):
        return np.asarray(batch["x"]) * 2

    @remote_function(dispatch="slice_dp", collect="mean")
    def loss(self, batch):
        return float(np.sum(batch)) / 10

    @remote_function(dispatch="slice_dp", collect="sum")
    def count(self, batch):
        return len(batch)

    @remote_function(dispatch="slice_dp", collect="mean")
    def metrics(self, batch):
        return {"n": float(len(batch)), "pair": (float(batch[0]), float(get_worker_context().rank))}

    @remote_function(dispatch="all", execute="first", collect="first")
    def first_only(self, x):
        return x + 100 * get_worker_context().rank

    @remote_function(dispatch="all", collect="first")
    def random_draws(self):
        self.calls += 1
        return [self.draw, int(np.random.randint(0, 10**6)), self.calls]

    @remote_function(dispatch="all", collect="none")
    def own_draws(self):
        return int(np.random.randint(0, 10**6))

    @remote_function(dispatch="slice_dp", collect="concat")
    def consume(self, values):
        return np.asarray(values) + 1000

    @remote_function(dispatch="all", collect="none")
    def ask_peer(self, other):
        # Call a remote object of another group from inside this worker.
        return [get_worker_context().rank, other.whoami()()]


@remote_class()
class Stage:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="last_pp")
    def stage(self, x):
        ctx = get_worker_context()
        return [x, ctx.rank, ctx.device_mesh.coordinate(ctx.rank, "pp")]

    @remote_function(dispatch="all", execute="peer", collect="first")
    def whoami(self):
        return get_worker_context().rank


@remote_class()
class Loader:
    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i * 10


def run(mode: str, **options) -> dict:
    initialize(
        mode,
        seed=1234,
        groups=[
            DeviceGroup("trainer", 2, "cpu"),
            DeviceGroup("stage", 2, "cpu"),
            DeviceGroup("loader", 1, "cpu"),
        ],
        **options,
    )
    try:
        trainer = Trainer(0.5, remote_group="trainer")
        stage = Stage(remote_group="stage", device_mesh=DeviceMesh.from_sizes(pp_size=2))
        loader = Loader(3, remote_group="loader")
        batch = list(range(7))
        out = {
            "identity": trainer.identity()(),
            "scale": trainer.scale([1, 2, 3, 4, 5], 3)(),
            "double": trainer.double({"x": np.arange(6)})(),
            "loss": trainer.loss(batch)(),
            "count": trainer.count(batch)(),
            "metrics": trainer.metrics(batch)(),
            "first_only": trainer.first_only(5)(),
            "random_1": trainer.random_draws()(),
            "random_2": trainer.random_draws()(),
            "own_draws": trainer.own_draws()(),
            "last_pp": stage.stage("x")(),
            "chained": trainer.consume(trainer.double({"x": np.arange(4)}))(),
            "peer": trainer.ask_peer(stage)(),
            "iterate": [item for item in loader],
            "lazy_len": len(trainer.identity()),
        }
        return to_json(out)
    finally:
        shutdown()


if __name__ == "__main__":
    result = run(sys.argv[1] if len(sys.argv) > 1 else "inprocess")
    print("CONFORMANCE " + json.dumps(result, sort_keys=True), flush=True)

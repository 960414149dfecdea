"""More driver code run unchanged in two modes: numeric all-reduce paths, groups smaller than the
world, execute='first', LazyCollect, worker contexts and per-worker torch random state.

`run(mode)` returns JSON-ready values; under torchrun every rank must return what mode
'inprocess' returns.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

Point = namedtuple("Point", "x y")


def to_json(value):
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, torch.Tensor):
        return {"tensor": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, (np.ndarray, np.generic)):
        return {"numpy": value.tolist(), "dtype": str(value.dtype)}
    return value


@remote_class()
class Worker:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.first_draw = float(torch.rand(1))

    @remote_function(dispatch="slice_dp", collect="mean")
    def tensor_mean(self, batch):
        return torch.tensor(batch, dtype=torch.float32).sum(0) * self.scale

    @remote_function(dispatch="slice_dp", collect="sum")
    def int_tensor_sum(self, batch):
        return torch.tensor(batch, dtype=torch.int64).sum(0)

    @remote_function(dispatch="slice_dp", collect="mean")
    def int_tensor_mean(self, batch):
        return torch.tensor(batch, dtype=torch.int32).sum(0)

    @remote_function(dispatch="slice_dp", collect="sum")
    def numpy_tree(self, batch):
        arr = np.asarray(batch, dtype=np.float32)
        return {"arr": arr.sum(0), "n": np.int64(len(batch)), "pt": Point(1.5, len(batch))}

    @remote_function(dispatch="slice_dp", collect="mean")
    def mixed_types(self, batch):
        total = float(np.sum(batch))
        return total if get_worker_context().rank == 0 else np.float64(total)

    @remote_function(dispatch="slice_dp", collect="flatten")
    def lists(self, batch):
        return [x * 10 for x in batch]

    @remote_function(dispatch="all", collect="mean")
    def torch_draw(self):
        return float(torch.rand(1))

    @remote_function(dispatch="all", collect="none")
    def draws(self):
        return [self.first_draw, float(torch.rand(1)), int(np.random.randint(0, 1000))]

    @remote_function(dispatch="all", collect="none")
    def context(self):
        ctx = get_worker_context()
        return [
            ctx.rank,
            ctx.world_size,
            ctx.local_rank,
            ctx.local_world_size,
            ctx.group_name,
            ctx.device_type,
            list(ctx.device_ids),
            ctx.data_rank,
            ctx.data_world_size,
            ctx.device_mesh.parallelism(),
        ]

    @remote_function(dispatch="all", execute="first", collect="none")
    def first_none(self):
        return get_worker_context().rank

    @remote_function(dispatch="all", execute="first", collect="mean")
    def first_mean(self, x):
        return x + get_worker_context().rank

    @remote_function(dispatch="slice_dp", collect="concat")
    def consume(self, values):
        return np.asarray(values, dtype=np.float64) + 0.25


@remote_class()
class Solo:
    def __init__(self) -> None:
        self.count = 0

    @remote_function(dispatch="all", collect="sum")
    def bump(self, by):
        self.count += by
        return {"count": self.count, "t": torch.tensor([self.count, 2 * self.count])}

    @remote_function(dispatch="all", collect="first")
    def where(self):
        ctx = get_worker_context()
        return [ctx.rank, ctx.world_size, ctx.group_name]


@remote_class()
class Sharded:
    """Two workers as tensor-parallel peers: one data shard, so rank 0 stands for both."""

    def __init__(self) -> None:
        pass

    @remote_function(dispatch="slice_dp", collect="mean")
    def loss(self, batch):
        return float(np.sum(batch)) + 100.0 * get_worker_context().rank

    @remote_function(dispatch="slice_dp", collect="concat")
    def shard(self, batch):
        return np.asarray(batch) * (1 + get_worker_context().rank)


def run(mode: str, size: int = 2, **options) -> dict:
    """The scenario on a group of `size` workers (tensor-parallel part only when size is 2)."""
    initialize(
        mode,
        seed=7,
        groups=[DeviceGroup("w", size, "cpu"), DeviceGroup("solo", 1, "cpu")],
        **options,
    )
    try:
        w = Worker(2.0, remote_group="w")
        solo = Solo(remote_group="solo")
        batch = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.5]]
        lazy = w.tensor_mean(batch)
        tensor_mean = lazy()
        out = {
            # Under torchrun a call is done once every process reached it; after collecting it
            # is done everywhere, as it is at once in mode 'inprocess'.
            "lazy_done": lazy.done(),
            "tensor_mean": tensor_mean,
            "int_tensor_sum": w.int_tensor_sum([[1, 2], [3, 4], [5, 6]])(),
            "int_tensor_mean": w.int_tensor_mean([[1, 2], [3, 4], [5, 7]])(),
            "numpy_tree": w.numpy_tree(batch)(),
            "mixed_types": w.mixed_types([1.0, 2.0, 4.0])(),
            "lists": w.lists([1, 2, 3])(),
            "torch_draw": w.torch_draw()(),
            "draws_1": w.draws()(),
            "draws_2": w.draws()(),
            "context": w.context()(),
            "first_none": w.first_none()(),
            "first_mean": w.first_mean(3.5)(),
            "chained": w.consume(w.numpy_tree(batch)()["arr"].tolist())(),
            "lazy_arg": w.consume(w.int_tensor_sum([[1, 2], [3, 4]]))(),
            "solo_1": solo.bump(2)(),
            "solo_2": solo.bump(3)(),
            "solo_where": solo.where()(),
        }
        if size == 2:
            tp = Sharded(remote_group="w", device_mesh=DeviceMesh.from_sizes(tp_size=2))
            out["tp_loss"] = tp.loss([1, 2, 3, 4])()
            out["tp_shard"] = tp.shard([1, 2, 3, 4])()
        out["driver_draw"] = float(torch.rand(1))
        return to_json(out)
    finally:
        shutdown()

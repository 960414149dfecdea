"""Child process of case 17: three roles on one 2-worker CPU group on an embedded Ray cluster,
each importing torch in its `__init__`; `colocated` (the default) or `own` (`colocate=False`:
one set of actors per role, the layout before roles shared a group's processes)."""

from __future__ import annotations

import os
import sys
import time

from harness import emit

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown


@remote_class()
class Role:
    def __init__(self, n):
        import torch

        self.weights = torch.zeros(n)

    @remote_function(dispatch="all", collect="none")
    def process(self):
        return os.getpid()


@remote_class(colocate=False)
class OwnRole(Role):
    pass


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run(cls: type) -> dict:
    initialize("ray", groups=[DeviceGroup("g", 2, "cpu")], seed=1)
    try:
        start = time.perf_counter()
        roles = [cls(1000, remote_group="g") for _ in range(3)]
        pids = set()
        for role in roles:
            pids |= set(role.process()())
        took = time.perf_counter() - start
        return {"seconds": took, "processes": len(pids), "rss": sum(map(rss_bytes, pids))}
    finally:
        shutdown()


if __name__ == "__main__":
    emit(run(Role if sys.argv[1] == "colocated" else OwnRole))

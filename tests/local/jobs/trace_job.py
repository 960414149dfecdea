"""A traced 2-process job with two groups; rank 0 writes the merged trace.

Usage `trace_job.py OUT_DIR [hang]`: writes OUT_DIR/run.json (the trace). With `hang`, a second,
untraced run follows in the same processes (one job serves both tests: a torchrun job costs
seconds): each rank's worker of `Stuck` sits in `time.sleep` while its process gets SIGUSR1:
every rank prints its own stacks (to stderr).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])
SLEEP = 0.05


@remote_class()
class Producer:
    @remote_function(dispatch="all", collect="none")
    def make(self, n):
        time.sleep(SLEEP)
        return list(range(n))


@remote_class()
class Synced:
    @remote_function(dispatch="all", collect="first")
    def step(self):
        # Rank 1 works longer; the all-reduce ends both executions together, so their ends
        # line up when the clocks do.
        time.sleep(SLEEP * (1 + 2 * dist.get_rank()))
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t)


@remote_class()
class Stuck:
    @remote_function(dispatch="all", collect="none")
    def wait(self):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        time.sleep(3)  # the worker hangs here


initialize(
    "local", groups=[DeviceGroup("prod", 2), DeviceGroup("sync", 2)], trace=str(OUT / "run.json")
)
producer = Producer(remote_group="prod")
synced = Synced(remote_group="sync")
for _ in range(3):
    items = producer.make(4)
    assert synced.step()() == 2.0
    assert items() == [[0, 1, 2, 3], [0, 1, 2, 3]]
shutdown()  # writes the trace
if len(sys.argv) > 2 and sys.argv[2] == "hang":
    initialize("local", groups=[DeviceGroup("prod", 2)])
    Stuck(remote_group="prod").wait()()
    shutdown()

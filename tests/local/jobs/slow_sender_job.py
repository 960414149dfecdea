"""A torchrun job whose notifying process is slow: usage `slow_sender_job.py OUT_DIR`.

Both processes see the same failure; one is elected to send its alert, with a notifier that
takes 60 s. The other process calls `shutdown(timeout=2)`: its wait for the sender must end
with that deadline, not after `notify_wait` (30 s by default). Each process writes how long its
shutdown took.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])


def slow_notify(text: str) -> None:
    (OUT / f"sending{RANK}").write_text(text)
    time.sleep(60)


@remote_class()
class Failing:
    @remote_function(dispatch="all", collect="none")
    def step(self):
        raise ValueError("always fails")


initialize("local", seed=1, groups=[DeviceGroup("g", 2, "cpu")], notifier=slow_notify)
try:
    Failing(remote_group="g").step()()
except ValueError:
    pass
time.sleep(1.0)  # let the elected process start its slow send
start = time.monotonic()
# The sender's own deadline (16 s) is far above the waiter's bound in the test (12 s): a waiter
# that waited for the sender instead of its own 2 s would fail it.
shutdown(timeout=2 if not (OUT / f"sending{RANK}").exists() else 16)
(OUT / f"shutdown{RANK}.json").write_text(
    json.dumps({"took": time.monotonic() - start, "sender": (OUT / f"sending{RANK}").exists()})
)

"""A one-process torch.distributed job (torchrun-style variables) with a slow notifier.

Usage `term_job.py OUT_DIR`. A remote call fails, its alert is queued (the notifier takes 2 s),
then the script prints READY and sleeps. The test sends SIGTERM, as torchrun does to the
survivors of a failed job: the alert must still be written before the process ends.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from twinkle_core import initialize, remote_class, remote_function

OUT = Path(sys.argv[1])


def slow_notify(text: str) -> None:
    time.sleep(2)
    (OUT / "alert.txt").write_text(text)


@remote_class()
class Job:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def fail(self):
        raise RuntimeError("disk full")


initialize("local", notifier=slow_notify)
job = Job(remote_group="default")
try:
    job.fail()()
except RuntimeError:
    pass
print("READY", flush=True)
time.sleep(60)

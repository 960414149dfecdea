"""A torchrun job where rank 1 dies or hangs inside a method: usage `lost_job.py OUT_DIR MODE`.

MODE `die`: rank 1 exits abruptly (os._exit) in the middle of a call. MODE `hang`: rank 1
sleeps far longer than the job's twinkle timeout (5 s). Rank 0 must not wait forever: it
reports a WorkerDiedError (one alert) and the job ends with a non-zero exit.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from twinkle_core import (
    DeviceGroup,
    WorkerDiedError,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
)

OUT = Path(sys.argv[1])
MODE = sys.argv[2]
RANK = int(os.environ["RANK"])


def notify(text: str) -> None:
    with open(OUT / "alerts.jsonl", "a") as f:
        f.write(json.dumps({"rank": RANK, "text": text}) + "\n")


@remote_class()
class Fragile:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="none")
    def step(self):
        if get_worker_context().rank == 1:
            if MODE == "die":
                os._exit(3)
            time.sleep(300)
        return "ok"


initialize(
    "local",
    seed=1,
    groups=[DeviceGroup("g", 2, "cpu")],
    notifier=notify,
    timeout=5,
    notify_wait=5,
)
fragile = Fragile(remote_group="g")
(OUT / f"start{RANK}.json").write_text(json.dumps({"t": time.time()}))
try:
    fragile.step()()  # CALL-LOST
except WorkerDiedError as exc:
    # The job is broken: a later call fails at once instead of waiting for the timeout again.
    start = time.time()
    try:
        fragile.step()()
    except WorkerDiedError as again:
        report = {"first": str(exc), "again": str(again), "again_took": time.time() - start}
        (OUT / f"broken{RANK}.json").write_text(json.dumps(report))
    raise

"""A torchrun job whose workers raise: usage `fail_job.py OUT_DIR`.

Call A fails on rank 1 only; every rank catches the same error. Call B fails on both ranks the
same way and is not caught, so the job must end with a non-zero exit. The notifier appends one
JSON line per alert to OUT_DIR/alerts.jsonl; exactly one line per distinct failure is expected
for the whole job. Each rank writes OUT_DIR/rank<r>.json before call B.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from twinkle_core import DeviceGroup, get_worker_context, initialize, remote_class, remote_function

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])


def notify(text: str) -> None:
    with open(OUT / "alerts.jsonl", "a") as f:
        f.write(json.dumps({"rank": RANK, "text": text}) + "\n")


@remote_class()
class Boom:
    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="mean")
    def explode(self, only):
        rank = get_worker_context().rank
        if only is None or only == rank:
            raise ValueError(f"bad batch {only}")
        return 1.0


initialize("local", seed=1, groups=[DeviceGroup("g", 2, "cpu")], notifier=notify, timeout=60)
boom = Boom(remote_group="g")
report: dict = {"rank": RANK}
try:
    boom.explode(1)()  # CALL-A
except ValueError as exc:
    report["caught"] = [type(exc).__name__, str(exc), list(getattr(exc, "__notes__", []))]
report["raised_at"] = time.time()
(OUT / f"rank{RANK}.json").write_text(json.dumps(report))
boom.explode(None)()  # CALL-B
print("NOT REACHED", flush=True)

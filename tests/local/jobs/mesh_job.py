"""An 8-process job: the original Twinkle infra's DeviceMesh accessors inside the workers.

Usage `mesh_job.py OUT_DIR`; every rank writes OUT_DIR/rank<r>.json with what each worker of
an 8-worker group answered on a pp=2 x dp=2 x tp=2 and a dp=2 x fsdp=4 mesh
(`_support.mesh_reader`), and what the driver code (outside any worker) answers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from _support.mesh_reader import EIGHT, MeshReader, read_all

from twinkle_core import DeviceGroup, initialize, shutdown


def main(out_dir: Path) -> None:
    initialize("local", groups=[DeviceGroup("eight", 8, "cpu")], timeout=120)
    try:
        out = read_all(MeshReader(remote_group="eight"))
        out["driver"] = [EIGHT["dp2_fsdp4"].dp_rank, EIGHT["dp2_fsdp4"].data_rank]
    finally:
        shutdown()
    (out_dir / f"rank{os.environ['RANK']}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""17. Colocated roles: three roles (each importing torch) on a group of 2 workers on Ray, as
colocated objects sharing the group's processes against one set of processes per role
(`colocate=False`, how Ray hosted roles before). Each variant is a fresh driver with its own
embedded cluster (`colocation_driver.py`), alternating. Rows: time from building the first
role to the third role's first call, the workers' total resident memory, and how many worker
processes ran. Fair: the same roles, calls and cluster; only the hosting differs.
"""

from __future__ import annotations

import sys

from harness import BENCH_DIR, Context, Row, median, run_child

NUMBER, NAME, QUICK, SESSION = "17", "colocation", False, ()

DRIVER = str(BENCH_DIR / "cases" / "colocation_driver.py")


def run(ctx: Context) -> list[Row]:
    rounds = 1 if ctx.quick else 3
    runs: dict[str, list[dict]] = {"colocated": [], "own": []}
    for r in range(rounds):
        for name in ("colocated", "own") if r % 2 == 0 else ("own", "colocated"):
            runs[name].append(run_child([sys.executable, DRIVER, name], timeout=600))

    def of(name: str, key: str) -> float:
        return median([run[key] for run in runs[name]])

    return [
        Row(
            "17a",
            "Colocation: 3 roles on 2 Ray workers, first build to third role's first call",
            of("colocated", "seconds"),
            of("own", "seconds"),
            unit="once",
            note="raw: the same roles with colocate=False (processes of their own)",
            samples={k: [run["seconds"] for run in v] for k, v in runs.items()},
        ),
        Row(
            "17b",
            "Colocation: the workers' total RSS (bytes, not seconds)",
            of("colocated", "rss"),
            of("own", "rss"),
            unit="bytes",
            note=f"{of('colocated', 'rss') / 2**20:.0f} MiB vs {of('own', 'rss') / 2**20:.0f} MiB",
        ),
        Row(
            "17c",
            "Colocation: worker processes (count, not seconds)",
            of("colocated", "processes"),
            of("own", "processes"),
            unit="count",
        ),
    ]

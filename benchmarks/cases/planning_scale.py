"""22. Planning at scale: 8,192 ranks on 1,024 nodes of 8 devices, declared, no processes.

The run: a 4,096-rank policy, a 2,048-rank reference, a 2,048-rank sampler of two devices per
worker (every device of the 1,024 nodes) and a 64-worker CPU group.

- 22a: the `DeviceGroup`s built and placed by the device-rank rule
  (`ExecutionBackend.plan_placement`, what `twinkle placement` asks by default).
- 22b: the same groups through the Ray backend's planner against 1,024 declared nodes (8 GPUs,
  64 CPUs each; no cluster): `ResourceManager._plan_accelerators` (node choice, spanning and
  `visible_devices` checks) and `slots()` for every accelerator worker, with each node's
  placement group stood in by its bundle (what Ray would hand back: devices 0-7).
- 22c: `twinkle placement big.toml` end to end in a fresh process (interpreter start included),
  output to a pipe.

There is no raw tool that plans a twinkle run, so the baseline column is the target of issue 29
(item 5): 1 s to plan, 2 s for the command; a ratio below 1 meets it. The note of 22c gives a
floor: a fresh `python -c` that only parses the same file with tomllib.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness import Context, Row, child_env, interleave, median

from twinkle_core import DeviceGroup
from twinkle_core.plugin import ExecutionBackend

NUMBER, NAME, QUICK, SESSION = "22", "planning-scale", True, ()

NODES, NPN = 1024, 8
PLAN_TARGET_S, COMMAND_TARGET_S = 1.0, 2.0
GROUPS: list[dict[str, Any]] = [
    {"name": "policy", "ranks": list(range(0, 4096)), "device_type": "cuda"},
    {"name": "reference", "ranks": list(range(4096, 6144)), "device_type": "cuda"},
    {
        "name": "sampler",
        "ranks": list(range(6144, 8192)),
        "device_type": "cuda",
        "gpus_per_worker": 2,
    },
    {"name": "rewards", "ranks": 64, "device_type": "cpu"},
]


def write_file(path: Path) -> None:
    lines = [f"nproc_per_node = {NPN}", f"nodes = {NODES}"]
    for group in GROUPS:
        lines += ["", "[[groups]]"]
        for key, value in group.items():
            if isinstance(value, list):
                shown = "[" + ", ".join(str(v) for v in value) + "]"
            else:
                shown = json.dumps(value)
            lines.append(f"{key} = {shown}")
    path.write_text("\n".join(lines) + "\n")


def plan_by_rule() -> int:
    groups = [DeviceGroup(**g) for g in GROUPS]
    placed = ExecutionBackend.plan_placement(groups, NPN)
    assert placed["sampler"][1023].node == "node1023", placed["sampler"][1023]
    return sum(len(p) for p in placed.values())


def ray_planner() -> Any:
    """A function planning the run as the Ray backend would, on declared nodes (None when
    twinkle-ray is not installed)."""
    try:
        from twinkle_ray.cluster import NodeInfo
        from twinkle_ray.resources import NodeReservation, ResourceManager
    except ImportError:
        return None
    nodes = [
        NodeInfo(
            f"{i:056x}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", {"CPU": 64.0, "GPU": 8.0}
        )
        for i in range(NODES)
    ]

    def plan() -> int:
        groups = {g["name"]: DeviceGroup(**g) for g in GROUPS}
        manager = ResourceManager("bench", groups, NPN, lambda name: 1.0, 60.0)
        planned = manager._plan_accelerators(nodes)
        for dt, (resource, npn, chosen) in planned.items():
            bundle = SimpleNamespace(bundle_specs=[{resource: float(npn), "CPU": 32.0}])
            manager.reservations[dt] = [
                NodeReservation(dt, resource, node, i, bundle, list(range(npn)))
                for i, node in enumerate(chosen)
            ]
        slots = [manager.slots(g, g.num_workers) for g in groups.values() if not g.is_cpu]
        last = slots[-1][-1]
        assert last.node is nodes[-1] and last.devices == (6, 7), last
        return sum(len(s) for s in slots)

    return plan


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 9
    rows: list[Row] = []

    variants: dict[str, Any] = {"rule": plan_by_rule}
    ray_plan = ray_planner()
    if ray_plan is not None:
        variants["ray"] = ray_plan
    placed = {name: fn() for name, fn in variants.items()}  # once, checked, before timing

    def untimed(fn: Any) -> Any:
        def call() -> None:  # None: interleave times the call itself
            fn()

        return call

    samples = interleave({name: untimed(fn) for name, fn in variants.items()}, rounds, warmup=1)
    rows.append(
        Row(
            f"{NUMBER}a",
            "Planning 8,192 ranks on 1,024 nodes: DeviceGroups + the device-rank rule",
            median(samples["rule"]),
            PLAN_TARGET_S,
            unit="once",
            note=f"baseline: the 1 s target; {placed['rule']} workers placed",
            samples={"rule": samples["rule"]},
        )
    )
    if ray_plan is not None:
        rows.append(
            Row(
                f"{NUMBER}b",
                "Planning 8,192 ranks on 1,024 declared nodes: the Ray backend's planner",
                median(samples["ray"]),
                PLAN_TARGET_S,
                unit="once",
                note=f"baseline: the 1 s target; {placed['ray']} accelerator slots, no cluster",
                samples={"ray": samples["ray"]},
            )
        )

    with tempfile.TemporaryDirectory(prefix="tw-plan-") as folder:
        path = Path(folder) / "big.toml"
        write_file(path)
        script = Path(sys.executable).parent / "twinkle"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "twinkle_core"]
        env = child_env()
        output: dict[str, int] = {}

        def timed(name: str, argv: list[str]) -> float:
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(argv[:3])} exited {done.returncode}: {done.stderr}")
            output[name] = len(done.stdout.splitlines())
            return elapsed

        parse = f"import tomllib; tomllib.load(open({str(path)!r}, 'rb'))"
        cli = interleave(
            {
                "command": lambda: timed("command", [*command, "placement", str(path)]),
                "parse": lambda: timed("parse", [sys.executable, "-c", parse]),
            },
            rounds,
            warmup=1,
        )
        size = path.stat().st_size
    rows.append(
        Row(
            f"{NUMBER}c",
            "`twinkle placement` on a file of 8,192 ranks, fresh process",
            median(cli["command"]),
            COMMAND_TARGET_S,
            unit="once",
            note=(
                f"baseline: the 2 s target; a fresh python parsing the {size / 1024:.0f} KiB file "
                f"with tomllib: {median(cli['parse']) * 1e3:.0f} ms; "
                f"{output['command']} lines drawn"
            ),
            samples=cli,
        )
    )
    return rows

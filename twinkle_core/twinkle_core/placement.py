"""`get_device_placement()`: the run's topology as a box drawing.

By default the design's layout: one box per device group with its device type and ranks, and
one `DeviceMesh: <Class>` block per remote object hosted on the group, so colocated roles show
at a glance. `detail=True` gives the per-rank table: each worker's rank in its group and the
global ranks it owns (the group's `ranks` entries), node, devices, data rank and process.
The drawing is built from the helpers below, which `twinkle placement groups.toml` (see
`placement_plan`) shares, so a plan drawn from a file looks like the live run's placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .device_group import DeviceGroup
from .runtime import current_runtime


def format_ranks(ranks: Sequence[int]) -> str:
    """`0-3` for a run of three or more consecutive ranks, else `0,2`."""
    ranks = tuple(ranks)
    if ranks and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def group_line(group: DeviceGroup) -> str:
    """`group model  cuda  ranks 0-3  workers 4` (plus `2 per worker` when shared)."""
    per = f"  {group.gpus_per_worker} per worker" if group.gpus_per_worker > 1 else ""
    return (
        f"group {group.name}  {group.device_type}  ranks {format_ranks(group.rank_list)}  "
        f"workers {group.num_workers}{per}"
    )


def worker_line(
    rank: int,
    global_ranks: Sequence[int],
    node: str | None,
    device_type: str,
    devices: Sequence[int],
    *,
    data_rank: object = None,
    process: str | None = None,
    indent: str = "    ",
) -> str:
    """One worker's row, naming both numberings: `rank` is its rank in its group (0, 1, ...),
    `global_ranks` the group's `ranks` entries it owns (one, or `gpus_per_worker` of them):

    `group rank 0   global rank 4   node n1  device cuda:4` (`global ranks 4,5` for a worker of
    two devices; then `  data rank 0`, `  process pid 42` when given)."""
    shown = (
        f"{device_type}:{','.join(str(d) for d in devices)}"
        if devices and device_type != "cpu"
        else device_type
    )
    plural = "s" if len(global_ranks) > 1 else ""
    ranks = f"global rank{plural} {format_ranks(global_ranks) or '-'}"
    line = f"{indent}group rank {rank:<3} {ranks:<14}  node {node or '-'}  device {shown}"
    if data_rank is not None:
        line += f"  data rank {data_rank}"
    if process:
        line += f"  process {process.removeprefix('process ')}"
    return line


def draw_box(lines: Sequence[str]) -> str:
    """Frame `lines`: the first is the title, under a rule; the second (a spacer) is dropped."""
    width = max(len(line) for line in lines)
    top = "┌" + "─" * (width + 2) + "┐"
    sep = "├" + "─" * (width + 2) + "┤"
    bottom = "└" + "─" * (width + 2) + "┘"
    body = [top, f"│ {lines[0].ljust(width)} │", sep]
    body += [f"│ {line.ljust(width)} │" for line in lines[2:]] if len(lines) > 1 else []
    body.append(bottom)
    return "\n".join(body)


#: Inner width of the topology drawing (it grows for longer lines).
TOPOLOGY_WIDTH = 78


def draw_topology(groups: Sequence[tuple[DeviceGroup, Sequence[tuple[str, Any]]]]) -> str:
    """The design's layout: a title box, then per group a box with its device type, ranks and
    one `DeviceMesh: <Class>` block per (class name, mesh) hosted on it."""
    rows: list[tuple[str, str]] = []  # (kind, text): "group", "rule", "line"
    for group, objects in groups:
        rows += [("group", f"◈ DeviceGroup: {group.name}"), ("rule", "")]
        rows += [
            ("line", f"├─ Device Type : {group.device_type}"),
            ("line", f"└─ Ranks       : {list(group.rank_list)}"),
        ]
        for class_name, mesh in objects:
            dims = ", ".join(f"{k}={v}" for k, v in mesh.parallelism().items())
            upper = ", ".join(f"{k.upper()}={v}" for k, v in mesh.parallelism().items())
            rows += [
                ("line", f"┌─ DeviceMesh: {class_name}"),
                ("line", f"│  Dimensions : {dims}"),
                ("line", f"│  Parallelism: {upper}"),
            ]
        rows.append(("end", ""))
    title = "DEVICE PLACEMENT TOPOLOGY"
    width = max([TOPOLOGY_WIDTH, len(title) + 2, *(len(text) + 2 for _, text in rows)])
    out = ["╔" + "═" * width + "╗", f"║ {title.ljust(width - 2)} ║", "╚" + "═" * width + "╝"]
    for kind, text in rows:
        if kind == "group":
            out += ["┌" + "─" * width + "┐", f"│ {text.ljust(width - 2)} │"]
        elif kind == "rule":
            out.append("├" + "─" * width + "┤")
        elif kind == "end":
            out.append("└" + "─" * width + "┘")
        else:
            out.append(f"│ {text.ljust(width - 2)} │")
    return "\n".join(out)


def get_device_placement(detail: bool = False) -> str:
    """The run's topology: each group's device type and ranks, and the mesh of every remote
    object hosted on it (colocated roles share a group's processes).

    With `detail=True`, the per-rank table instead: the run's header (mode, backend facts),
    and for each object every worker's node, physical devices, data rank and process (the same
    process for colocated objects).
    """
    runtime = current_runtime()
    if not detail:
        return draw_topology(
            [
                (
                    group,
                    [
                        (b.class_name, b.workers.device_mesh)
                        for b in runtime.bound
                        if b.workers.group.name == group.name
                    ],
                )
                for group in runtime.config.groups.values()
            ]
        )
    cfg = runtime.config
    header = [f"twinkle run {cfg.name}", f"mode {cfg.mode}"]
    for key, value in runtime.backend.describe().items():
        header.append(f"{key} {value}")
    lines: list[str] = ["  ".join(header)]
    for group in cfg.groups.values():
        lines.append("")
        line = group_line(group)
        health = cfg.health.get(group.name)
        if health is not None and (group.max_restarts or health.generation):
            state = health.snapshot()
            line += (
                f"  generation {state.generation} ({state.state}, restarts {state.restarts} "
                f"of {state.max_restarts})"
            )
        lines.append(line)
        bound = [b for b in runtime.bound if b.workers.group.name == group.name]
        if not bound:
            lines.append("  (no remote class placed yet)")
        for b in bound:
            mesh = b.workers.device_mesh
            lines.append(f"  class {b.class_name}  mesh {mesh.describe()}")
            for p in b.workers.placements:
                lines.append(
                    worker_line(
                        p.rank,
                        group.worker_ranks(p.rank),
                        p.node,
                        p.device_type,
                        p.devices,
                        data_rank=mesh.data_rank_of(p.rank) if p.rank in mesh.ranks else "-",
                        process=p.process,
                    )
                )
    return draw_box(lines)

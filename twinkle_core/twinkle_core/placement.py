"""`get_device_placement()`: the run's topology as a box drawing.

The drawing is built from the helpers below, which `twinkle placement groups.toml` (see
`placement_plan`) shares, so a plan drawn from a file looks like the live run's placement.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    node: str | None,
    device_type: str,
    devices: Sequence[int],
    *,
    data_rank: object = None,
    indent: str = "    ",
) -> str:
    """`rank 0   node n1  device cuda:0,1` (and `  data rank 0` when one is given)."""
    shown = (
        f"{device_type}:{','.join(str(d) for d in devices)}"
        if devices and device_type != "cpu"
        else device_type
    )
    line = f"{indent}rank {rank:<3} node {node or '-'}  device {shown}"
    if data_rank is not None:
        line += f"  data rank {data_rank}"
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


def get_device_placement() -> str:
    """Groups, device types, ranks, and each remote class's mesh and worker placement.

    Each worker line shows the node and the physical devices the backend placed it on.
    """
    runtime = current_runtime()
    cfg = runtime.config
    header = [f"twinkle run {cfg.name}", f"mode {cfg.mode}"]
    for key, value in runtime.backend.describe().items():
        header.append(f"{key} {value}")
    lines: list[str] = ["  ".join(header)]
    for group in cfg.groups.values():
        lines.append("")
        lines.append(group_line(group))
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
                        p.node,
                        p.device_type,
                        p.devices,
                        data_rank=mesh.data_rank_of(p.rank) if p.rank in mesh.ranks else "-",
                    )
                )
    return draw_box(lines)

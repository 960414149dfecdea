"""`get_device_placement()`: the run's topology as a box drawing."""

from __future__ import annotations

from .runtime import current_runtime


def _ranks(ranks: tuple[int, ...]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


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
        per = f"  {group.gpus_per_worker} per worker" if group.gpus_per_worker > 1 else ""
        lines.append(
            f"group {group.name}  {group.device_type}  ranks {_ranks(group.rank_list)}  "
            f"workers {group.num_workers}{per}"
        )
        bound = [b for b in runtime.bound if b.workers.group.name == group.name]
        if not bound:
            lines.append("  (no remote class placed yet)")
        for b in bound:
            mesh = b.workers.device_mesh
            lines.append(f"  class {b.class_name}  mesh {mesh.describe()}")
            for p in b.workers.placements:
                devices = (
                    f"{p.device_type}:{','.join(str(d) for d in p.devices)}"
                    if p.devices and p.device_type != "cpu"
                    else p.device_type
                )
                node = p.node or "-"
                lines.append(
                    f"    rank {p.rank:<3} node {node}  device {devices}  "
                    f"data rank {mesh.data_rank(p.rank) if p.rank in mesh.ranks else '-'}"
                )
    width = max(len(line) for line in lines)
    top = "┌" + "─" * (width + 2) + "┐"
    sep = "├" + "─" * (width + 2) + "┤"
    bottom = "└" + "─" * (width + 2) + "┘"
    body = [top, f"│ {lines[0].ljust(width)} │", sep]
    body += [f"│ {line.ljust(width)} │" for line in lines[2:]] if len(lines) > 1 else []
    body.append(bottom)
    return "\n".join(body)

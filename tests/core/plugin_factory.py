"""Build fake installed distributions (dist-info + module) in a folder, for plugin tests."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_plugin(
    root: Path,
    dist: str,
    module: str,
    code: str,
    *,
    entry_point: str | None = None,
    version: str = "1.0",
    requires: tuple[str, ...] = ("twinkle-core>=0.1",),
) -> None:
    """Write `module.py` and a `dist-version.dist-info` declaring a `twinkle` entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "entry_points.txt").write_text(f"[twinkle]\n{entry_point or module} = {module}\n")

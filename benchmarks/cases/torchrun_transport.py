"""15. Placeholder: being written this session (issue 11); reports no row yet."""

from __future__ import annotations

from harness import Context, Row

NUMBER, NAME, QUICK, SESSION = "15", "torchrun-transport", False, ()


def run(ctx: Context) -> list[Row]:
    return []

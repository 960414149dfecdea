"""16. Placeholder: being written this session (issue 11); reports no row yet."""

from __future__ import annotations

from harness import Context, Row

NUMBER, NAME, QUICK, SESSION = "16", "ray-rdt", False, ()


def run(ctx: Context) -> list[Row]:
    return []

"""Looking at real processes from tests (workers found, killed, checked gone)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process `pid` still exists (a zombie not yet reaped counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

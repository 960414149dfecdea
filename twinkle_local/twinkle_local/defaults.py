"""twinkle-local's default bounds."""

from __future__ import annotations

#: Default timeout of twinkle's process groups and calls: long enough for slow checkpoints,
#: as torch's own.
DEFAULT_TIMEOUT_S = 1800.0

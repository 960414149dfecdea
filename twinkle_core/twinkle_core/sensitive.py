"""What looks like a secret: one definition for every place that shows or sends environment
variables (`twinkle doctor` hides their values; the Ray backend never sends them to a worker
through a wildcard of its pass-through list).

Two sources: names that look like credentials (`SECRET_NAME_PATTERNS`), and the variables
plugins declare as their own secrets through the `twinkle_secret_env_vars` hook (a notifier's
webhook token), which never leave the driver at all.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

#: Names that look like credentials (`fnmatch` patterns, compared case-insensitively).
SECRET_NAME_PATTERNS: tuple[str, ...] = (
    "*SECRET*",
    "*TOKEN*",
    "*PASS*",
    "*WEBHOOK*",
    "*CREDENTIAL*",
    "*AUTH*",
    "*PRIVATE*",
    "*COOKIE*",
    "*SIGN*",
    "*_KEY",
    "*_KEY_*",
    "*APIKEY*",
)


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether `name` matches one of the `fnmatch` `patterns`, ignoring case."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, p.upper()) for p in patterns)


def looks_secret(name: str) -> bool:
    """Whether the variable `name` looks like it holds a credential."""
    return matches_any(name, SECRET_NAME_PATTERNS)


def secret_env_patterns() -> tuple[str, ...]:
    """Every pattern plugins declare through the `twinkle_secret_env_vars` hook."""
    from .plugins import plugin_system

    out: list[str] = []
    for part in plugin_system().hook.twinkle_secret_env_vars():
        out.extend(p for p in part or () if isinstance(p, str) and p)
    return tuple(out)

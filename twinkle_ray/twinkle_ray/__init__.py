"""twinkle-ray: mode `ray` for twinkle. Remote classes run as Ray actors on placement groups.

Importing this package does not import ray's heavy parts until the backend is used; the plugin
registers the backend by name only.
"""

from __future__ import annotations

from importlib.metadata import version as _dist_version

__version__ = _dist_version("twinkle-ray")  # written once: in pyproject.toml

from .envvars import DEFAULT_PASSTHROUGH

__all__ = ["DEFAULT_PASSTHROUGH", "RayBackend"]


def __getattr__(name: str):
    if name == "RayBackend":
        from .backend import RayBackend

        return RayBackend
    raise AttributeError(name)

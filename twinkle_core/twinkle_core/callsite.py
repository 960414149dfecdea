"""Finding the user's own call site, so failures point at the driver line that caused them."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from types import FrameType

from .plugins import ENTRY_POINT_GROUP

_internal: tuple[frozenset[str], tuple[str, ...]] | None = None


def internal_packages() -> tuple[frozenset[str], tuple[str, ...]]:
    """(top-level package names, their folders) whose frames are twinkle's plumbing, never the
    user's call site: twinkle_core and every package a `twinkle` entry point loads from. Read
    once per process from the installed metadata (no plugin is imported for it)."""
    global _internal
    if _internal is None:
        names = {__name__.split(".", 1)[0]}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            names.add(ep.value.split(":", 1)[0].split(".", 1)[0].strip())
        dirs = []
        for name in sorted(names):
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            for folder in (spec.submodule_search_locations or []) if spec else []:
                dirs.append(os.path.abspath(folder) + os.sep)
        _internal = (frozenset(names), tuple(dirs))
    return _internal


@dataclass(frozen=True)
class CallSite:
    """Where in the user's code a remote call was made."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


def is_internal_frame(frame: FrameType) -> bool:
    """Whether `frame` runs twinkle's code (core's or a plugin's), not the user's."""
    code = frame.f_code
    internal = _INTERNAL_CODE.get(code)
    if internal is None:
        names, dirs = internal_packages()
        module = frame.f_globals.get("__name__", "")
        internal = module.split(".", 1)[0] in names or code.co_filename.startswith(dirs)
        if len(_INTERNAL_CODE) >= _SITES_MAX:
            _INTERNAL_CODE.clear()
        _INTERNAL_CODE[code] = internal
    return internal


#: Call sites already made, by (code object, line): a loop making thousands of calls from one
#: line shares one `CallSite` instead of keeping one per call in flight. Bounded: cleared
#: when full (a driver has far fewer call sites than this).
_SITES: dict[tuple[object, int], CallSite] = {}
_SITES_MAX = 4096
#: Whether a code object is twinkle's own (skipped when looking for the user's frame), by code
#: object: a function's module and file never change. Bounded like `_SITES`.
_INTERNAL_CODE: dict[object, bool] = {}
_UNKNOWN = CallSite("<unknown>", 0, "<unknown>")


def user_call_site(skip: int = 1) -> CallSite:
    """The innermost frame outside twinkle's packages, starting `skip` frames above the caller."""
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None and is_internal_frame(frame):
        frame = frame.f_back
    if frame is None:
        return _UNKNOWN
    code, lineno = frame.f_code, frame.f_lineno
    site = _SITES.get((code, lineno))
    if site is None:
        if len(_SITES) >= _SITES_MAX:
            _SITES.clear()
        site = _SITES[(code, lineno)] = CallSite(code.co_filename, lineno, code.co_name)
    return site


def user_stack(frame: FrameType | None, limit: int = 16) -> str:
    """The stack ending at `frame`, without twinkle's own frames (a line says where twinkle
    was, when the innermost frames are twinkle's): for watchdogs that show where a thread is."""
    if frame is None:
        return "    (no stack: the thread is gone)\n"
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    inside = ""
    while frames and is_internal_frame(frames[-1]):
        inside = inside or f"{frames[-1].f_code.co_name}"
        frames.pop()
    summary = traceback.StackSummary.extract(
        ((f, f.f_lineno) for f in frames if not is_internal_frame(f)), limit=None
    )
    lines = summary.format()[-limit:]
    if inside:
        lines.append(f"    ... inside twinkle ({inside})\n")
    return "".join(lines)

"""Finding the user's own call site, so failures point at the driver line that caused them."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import FrameType

# Frames from these packages are twinkle's plumbing, never the user's call site.
_INTERNAL_PREFIXES = ("twinkle_core", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")
_INTERNAL_DIRS = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + p + os.sep
    for p in _INTERNAL_PREFIXES
)


@dataclass(frozen=True)
class CallSite:
    """Where in the user's code a remote call was made."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


def _is_internal(frame) -> bool:
    code = frame.f_code
    internal = _INTERNAL_CODE.get(code)
    if internal is None:
        module = frame.f_globals.get("__name__", "")
        internal = module.split(".", 1)[0] in _INTERNAL_PREFIXES or code.co_filename.startswith(
            _INTERNAL_DIRS
        )
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
    while frame is not None and _is_internal(frame):
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

"""The driver's own line: where a call was made, and stacks without twinkle's plumbing."""

from __future__ import annotations

import os
import sys
import traceback
from types import FrameType

import twinkle_core

#: Frames from these packages are twinkle's plumbing, never the driver's call site.
INTERNAL_MODULES = ("twinkle_core", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")
INTERNAL_DIRS = (
    os.path.dirname(os.path.abspath(twinkle_core.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


def is_internal(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module.split(".", 1)[0] in INTERNAL_MODULES or frame.f_code.co_filename.startswith(
        INTERNAL_DIRS
    )


def driver_call_site(skip: int = 1) -> str:
    """`file:line` of the innermost frame outside twinkle, as core reports call sites."""
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None and is_internal(frame):
        frame = frame.f_back
    if frame is None:
        return "<unknown>:0"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def user_stack(frame: FrameType | None, limit: int = 16) -> str:
    """The stack ending at `frame`, without twinkle's own frames (a line says where twinkle
    was, when the innermost frames are twinkle's)."""
    if frame is None:
        return "    (no stack: the thread is gone)\n"
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    inside = ""
    while frames and is_internal(frames[-1]):
        inside = inside or f"{frames[-1].f_code.co_name}"
        frames.pop()
    summary = traceback.StackSummary.extract(
        ((f, f.f_lineno) for f in frames if not is_internal(f)), limit=None
    )
    lines = summary.format()[-limit:]
    if inside:
        lines.append(f"    ... inside twinkle ({inside})\n")
    return "".join(lines)

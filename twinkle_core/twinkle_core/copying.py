"""A worker's private copy of a call's arguments, with a clear error for one that cannot be
copied.

Backends whose workers share the driver's memory (in-process; torchrun, where the driver's
objects are the process's own) copy each call's arguments (`isolate=True`, the default), as a
real transport would. An argument that cannot be copied (a lock, a socket, an open file) is a
`ConfigurationError` naming the call and the argument, the shape Ray's is for an argument that
cannot be pickled (`Class.method: argument N (type) cannot be ...`), never `copy`'s bare
`TypeError`; the value itself is never shown (it may hold a secret).
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ConfigurationError


def copy_arguments(args: tuple, kwargs: dict, memo: Any, call: str) -> tuple[tuple, dict]:
    """`copy.deepcopy((args, kwargs), memo)`; an argument that cannot be copied raises a
    `ConfigurationError` naming `call` ("Class.method" or "Class.__init__") and the argument."""
    try:
        return copy.deepcopy((args, kwargs), memo)
    except Exception as exc:
        named = [(f"argument {i}", v) for i, v in enumerate(args)]
        named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        for where, value in named:
            try:
                copy.deepcopy(value)
            except Exception:
                raise ConfigurationError(
                    f"{call}: {where} ({type(value).__name__}) cannot be copied to a worker "
                    f"({type(exc).__name__}: {exc}). Values are not shown; pass plain data or "
                    "create the object in the worker"
                ) from None
        raise

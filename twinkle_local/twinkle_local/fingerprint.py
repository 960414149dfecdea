"""A cheap fingerprint of a call's arguments, compared across the torchrun processes.

Every process runs the driver script and makes "the same" call; the exchange checks that the
processes are at the same call (method, call site, worker count). Two driver threads calling
one line with different arguments pass that check when their calls interleave differently on
two processes, and each process would then pair its own call with another thread's results:
a silent wrong answer. The fingerprint closes that hole: it is part of the call's key, so such
a pairing is a divergence error naming both calls.

It must cost next to nothing on the call path, so it reads only what is cheap: scalars and
short strings whole, a string's or bytes' length and first 64 bytes, a container's length and
its first items (a bounded number in all), an array's shape, dtype and three elements (numpy
only: reading a GPU tensor's elements would synchronize the device). Arguments that differ
only where it does not look are not told apart: it catches the common case (different ids,
prompts, step numbers, configs), not every one.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

#: Values looked at per call, over all its arguments (nested items included).
BUDGET = 64

_SCALARS = (type(None), bool, int, float, complex)


def arguments_print(per_call: list[tuple[tuple, dict]]) -> int:
    """A 63-bit fingerprint of every worker's arguments of one call (0: no arguments)."""
    if all(not a and not k for a, k in per_call):
        return 0
    h = hashlib.blake2b(digest_size=8)
    budget = [BUDGET]
    for args, kwargs in per_call:
        h.update(b"(")
        for value in args:
            _feed(h, value, budget)
        for key in sorted(kwargs):
            h.update(key.encode())
            _feed(h, kwargs[key], budget)
    return (int.from_bytes(h.digest(), "little") >> 1) or 1


def _feed(h: Any, value: Any, budget: list[int]) -> None:
    if budget[0] <= 0:
        return
    budget[0] -= 1
    kind = type(value)
    if kind in _SCALARS:
        h.update(f"{kind.__name__}:{value!r};".encode())
    elif kind is str:
        h.update(f"s{len(value)}:".encode() + value[:64].encode("utf-8", "replace"))
    elif kind is bytes or kind is bytearray:
        h.update(f"b{len(value)}:".encode() + bytes(value[:64]))
    elif kind is dict:
        h.update(f"d{len(value)}".encode())
        for k, v in value.items():
            if budget[0] <= 0:
                break
            h.update(repr(k).encode()[:64])
            _feed(h, v, budget)
    elif kind is list or kind is tuple:
        h.update(f"l{len(value)}".encode())
        for v in value[:8]:
            if budget[0] <= 0:
                break
            _feed(h, v, budget)
    elif isinstance(value, np.ndarray):
        h.update(f"a{value.shape}{value.dtype}".encode())
        if value.size and value.dtype.kind in "biufc":
            flat = value.reshape(-1)
            h.update(np.asarray(flat[[0, flat.size // 2, flat.size - 1]]).tobytes())
    else:
        shape = getattr(value, "shape", None)
        h.update(f"{kind.__name__}{tuple(shape) if shape is not None else ''}".encode())

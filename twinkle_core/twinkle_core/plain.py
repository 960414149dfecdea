"""Plain data: numbers, strings, bytes, None and numpy arrays of numbers, in lists, tuples and
dicts.

Most calls carry such values (a config dict, token ids, a step number). A value known to be
plain needs none of the call path's walks: it holds no LazyCollect to replace, nothing tied to
the process (a file, a lock) to refuse, and it pickles as it is. Walking a small config dict
for each of those questions cost a call about 15 us of driver time (measured: one call in
flight cost twinkle 40 us of Python over Ray's own submission, most of it those walks).

`is_plain_data` answers all of them at once, quickly: a small container's items (and a dict's
keys) are looked at one by one, a larger one's by the set of their types, made at C speed; only
containers among the items are looked into. It gives up (False) on anything longer or deeper
than such a look covers; the caller then walks the value as before, so False never means the
value is wrong, only "not known plain".
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Types that are plain data themselves (exact types: a subclass may hold anything).
LEAVES = frozenset({int, float, bool, complex, str, bytes, type(None)})
#: Plain too when its dtype holds no Python objects (numbers, bools, fixed-size strings,
#: records of those): exactly `numpy.ndarray`, not a subclass (a masked array, a matrix).
ARRAY = np.ndarray
_CONTAINERS = frozenset({list, tuple, dict})
_LEAVES_OR_ARRAY = LEAVES | {ARRAY}
_LEAVES_OR_CONTAINERS = _LEAVES_OR_ARRAY | _CONTAINERS

#: Containers holding more items than this are not looked into (False): the full walks
#: decide for them, as they did before this short road existed.
MAX_ITEMS = 64
#: Nor are containers nested deeper than this.
MAX_DEPTH = 3
#: Containers of at most this many items are looked at item by item; larger ones by the set
#: of their items' types (measured: a loop is faster up to about 8 items, a set beyond).
_LOOP_ITEMS = 8


def is_plain_data(value: Any, depth: int = MAX_DEPTH) -> bool:
    """Whether `value` is made only of plain leaves (`LEAVES`, and numpy arrays whose dtype
    holds no Python objects) in lists, tuples and dicts with plain keys, at most `depth`
    containers deep and `MAX_ITEMS` items each.

    True means: no LazyCollect, nothing tied to this process, and it pickles faithfully.
    False means only that the quick look could not tell.
    """
    kind = type(value)
    if kind in LEAVES:
        return True
    if kind is ARRAY:
        return not value.dtype.hasobject
    if kind is dict:
        size = len(value)
        if size > MAX_ITEMS:
            return False
        if size <= _LOOP_ITEMS:
            for key in value:
                if type(key) not in LEAVES:
                    return False
        elif not set(map(type, value)) <= LEAVES:
            return False
        items: Any = value.values()
    elif kind is list or kind is tuple:
        size = len(value)
        if size > MAX_ITEMS:
            return False
        items = value
    else:
        return False
    if size > _LOOP_ITEMS:  # many items: their set of types, at C speed
        kinds = set(map(type, items))
        if kinds <= LEAVES:
            return True
        if not kinds <= _LEAVES_OR_CONTAINERS or (depth <= 1 and not kinds <= _LEAVES_OR_ARRAY):
            return False
    for item in items:
        kind = type(item)
        if kind in LEAVES:
            continue
        if kind is ARRAY:  # a leaf at any depth
            if item.dtype.hasobject:
                return False
        elif depth <= 1 or not is_plain_data(item, depth - 1):
            return False
    return True

"""Tensors handed to one call's arguments without a copy.

With `isolate` on, a call's arguments are deep-copied, as a real transport would copy them. A
LazyCollect handed to a call whose tensors a transport has just delivered (fresh buffers that
nothing else references) need not be copied once more: `LocalWorkerGroup.resolve_argument`
shares them here, on the call's own `PreparedCall.backend_data`, and the call's copy keeps
them as they are. So do a colocated producer's own results (`keep`). Nothing outlives the
call: one that never reaches `submit` (its dispatcher raised) leaves nothing for the next.
"""

from __future__ import annotations

from typing import Any

from twinkle_core.plugin import reference_memo


class SharedArguments:
    """The tensors shared with one call, by id."""

    def __init__(self) -> None:
        self._shared: dict[int, Any] = {}

    def keep(self, result: Any) -> None:
        """A colocated producer's own result (and everything in it) goes to this process's
        worker as it is: the by-reference hand-off between objects of one group."""
        self._shared.update(reference_memo(result))

    def share(self, value: Any) -> None:
        """The tensors in `value` (dicts, lists, tuples) go to the call's workers as they are
        (see `LocalWorkerGroup.resolve_argument`)."""
        stack = [value]
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind in (list, tuple):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif kind.__name__ == "Tensor" and kind.__module__.startswith("torch"):
                self._shared[id(item)] = item

    def memo(self) -> dict[int, Any]:
        """A `copy.deepcopy` memo that keeps the shared tensors as they are."""
        return dict(self._shared)

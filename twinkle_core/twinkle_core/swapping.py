"""Roles take turns on a group's devices: `offload()` / `onload()` around a switch.

Colocated objects share their group's processes and devices (docs/colocation.md). A class may
define `offload(self)` (give its device memory back: move weights to the CPU, free caches) and
`onload(self)` (take it again). When a call reaches an object whose group last ran a call of
another object, core first runs the other object's `offload()` and then this one's `onload()`
on each of their workers, and waits for both, so that at most one role of a group holds its
device buffers at a time. Constructing an object counts as its first call (the active role is
offloaded before the new one's `__init__` allocates). Objects without the methods are left
alone; `@remote_class(swap=False)` opts a class out.

The switches are ordinary calls (they show in a trace as `Class.offload` / `Class.onload`),
made by the driver: calls made inside workers do not switch roles, and a group's calls are
expected to come from one driver thread at a time (two threads driving two roles of one group
at once would swap them back and forth). A switch that raises fails the call that needed it,
tagged with that call's site and naming the role and method that raised; the group stays
usable, and the next call tries the switch again.
"""

from __future__ import annotations

from typing import Any

#: The methods a class may define (names from the original Twinkle infra's users: verl,
#: OpenRLHF and ROLL call these `offload`/`onload` or `offload_*`/`load_*`).
OFFLOAD, ONLOAD = "offload", "onload"


def swap_methods(cls: type, swap: bool) -> tuple[str | None, str | None]:
    """(offload method name or None, onload method name or None) of `cls`."""
    if not swap:
        return None, None
    has = [callable(getattr(cls, name, None)) for name in (OFFLOAD, ONLOAD)]
    return (OFFLOAD if has[0] else None), (ONLOAD if has[1] else None)


class Turns:
    """Which object of each group ran last, and the switches between them (one per run)."""

    def __init__(self) -> None:
        self.active: dict[str, Any] = {}

    def before_call(self, binding: Any, call_site: Any) -> None:
        """Make `binding`'s object the active one of its group (switching if needed)."""
        group = binding.workers.group.name
        previous = self.active.get(group)
        if previous is binding:
            return
        if previous is not None and previous.offload is not None:
            _run(previous, previous.offload, call_site)
        self.active[group] = binding
        if binding.onload is not None:
            try:
                _run(binding, binding.onload, call_site)
            except BaseException:
                self.active[group] = None  # the next call runs onload() again
                raise

    def before_construct(self, group: str, call_site: Any) -> None:
        """A new object is about to be built on `group`: the active one gives its devices
        back first (the new object then counts as the active one)."""
        previous = self.active.get(group)
        if previous is not None and previous.offload is not None:
            _run(previous, previous.offload, call_site)
        self.active[group] = None

    def constructed(self, binding: Any) -> None:
        self.active[binding.workers.group.name] = binding


#: The specs of the switch calls, one per (class name, method): made once, like a class's own
#: (core caches a spec's dispatcher and collector by spec).
_SPECS: dict[tuple[str, str], Any] = {}


def _run(binding: Any, method: str, call_site: Any) -> None:
    """Run `method` on every worker of `binding`'s object and wait for it; a failure raises
    tagged with `call_site` (the user's call that needed the switch)."""
    from .calls import MethodSpec, invoke

    cls_name = binding.workers.class_name
    spec = _SPECS.get((cls_name, method))
    if spec is None:
        spec = MethodSpec(name=method, qualname=f"{cls_name}.{method}", dispatch="all")
        spec = _SPECS.setdefault((cls_name, method), spec)
    result = invoke(binding, spec, (), {}, call_site, swapping=False)
    if callable(result):
        result()

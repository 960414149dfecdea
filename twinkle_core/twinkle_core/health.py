"""The health of a device group: whether its workers serve calls, which generation of them
does, and how many restarts its budget (`DeviceGroup(max_restarts=N)`) has left.

A small state machine with no I/O, driven by the backend that can restart workers (Ray):

    healthy --died, budget left--> restarting --restarted--> healthy (generation + 1)
    healthy --died, budget spent--> dead
    restarting --restart failed (or a death during it), budget left--> restarting
    restarting --restart failed, budget spent--> dead

A group whose `max_restarts` is 0 (the default) goes from healthy to dead on its first death,
which is what every group did before restarts existed. `dead` is final for the run. The
backend asks `died()` what to do; core's `on_restarted` callback (set by the runtime) fires the
`twinkle_group_restarted` hook, one alert and one log line per restart, never per rank. Every
transition is also told to the book's listeners (`HealthBook.listen`) as the new `GroupState`:
the runtime writes it into the trace, and a backend may publish it (Ray: for
`twinkle doctor --ray`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HEALTHY = "healthy"
RESTARTING = "restarting"
DEAD = "dead"

#: What `died` and `restart_failed` tell the backend to do.
RESTART = "restart"
TEAR_DOWN = "tear down"

log = logging.getLogger("twinkle")


@dataclass(frozen=True)
class GroupState:
    """A group's health, as `twinkle_core.group_state()` returns it."""

    group: str
    #: "healthy", "restarting" or "dead".
    state: str
    #: Which generation of workers serves the group (0 until its first restart).
    generation: int
    #: Restarts begun so far, and the budget (`DeviceGroup(max_restarts=...)`).
    restarts: int
    max_restarts: int
    #: Why the group last died (or its last restart failed); None while nothing happened.
    last_cause: str | None = None

    @property
    def restarts_left(self) -> int:
        return max(0, self.max_restarts - self.restarts)


class GroupHealth:
    """The state machine of one group (thread-safe; never calls out while holding its lock)."""

    def __init__(
        self,
        group: str,
        max_restarts: int = 0,
        on_restarted: Callable[[str, int, str], Any] | None = None,
        on_change: Callable[[GroupState], Any] | None = None,
    ) -> None:
        self.group = group
        self.max_restarts = max_restarts
        self.on_restarted = on_restarted
        #: Called with the new state after every transition (outside the lock).
        self.on_change = on_change
        self._lock = threading.Lock()
        self._state = HEALTHY
        self._generation = 0
        self._restarts = 0
        self._cause: str | None = None
        #: Set while the group serves calls; cleared while it restarts (callers wait on it).
        self.serving = threading.Event()
        self.serving.set()

    # ------------------------------------------------------------------ reading
    def snapshot(self) -> GroupState:
        with self._lock:
            return self._state_now()

    def _state_now(self) -> GroupState:
        return GroupState(
            self.group,
            self._state,
            self._generation,
            self._restarts,
            self.max_restarts,
            self._cause,
        )

    def _tell(self, before: str, after: GroupState) -> None:
        if self.on_change is not None and (before, after.state) != (DEAD, DEAD):
            self.on_change(after)

    @property
    def state(self) -> str:
        return self._state

    @property
    def generation(self) -> int:
        return self._generation

    # ------------------------------------------------------------------ transitions
    def died(self, cause: str) -> str:
        """A worker of the group died: RESTART (state `restarting`, one restart of the budget
        taken) or TEAR_DOWN (state `dead`). A death reported again for a group already
        restarting or dead changes nothing and answers TEAR_DOWN for the caller's own use:
        the backend that began the restart carries on with it."""
        with self._lock:
            if self._state != HEALTHY:
                return TEAR_DOWN
            before = self._state
            decision = self._next_attempt(cause)
            after = self._state_now()
        self._tell(before, after)
        return decision

    def restart_failed(self, cause: str) -> str:
        """The restart in progress failed (a death during it included): RESTART again while
        the budget lasts, else TEAR_DOWN (state `dead`)."""
        with self._lock:
            if self._state != RESTARTING:
                raise RuntimeError(f"group {self.group!r}: no restart in progress ({self._state})")
            decision = self._next_attempt(cause)
            after = self._state_now()
        self._tell(RESTARTING, after)
        return decision

    def restarted(self) -> int:
        """The restart in progress finished: the group serves calls on the next generation,
        which is returned (and `on_restarted` is called with it, outside the lock)."""
        with self._lock:
            if self._state != RESTARTING:
                raise RuntimeError(f"group {self.group!r}: no restart in progress ({self._state})")
            self._state = HEALTHY
            self._generation += 1
            generation, cause = self._generation, self._cause or ""
            after = self._state_now()
        self.serving.set()
        self._tell(RESTARTING, after)
        if self.on_restarted is not None:
            self.on_restarted(self.group, generation, cause)
        return generation

    def _next_attempt(self, cause: str) -> str:
        self._cause = cause
        if self._restarts < self.max_restarts:
            self._restarts += 1
            self._state = RESTARTING
            self.serving.clear()
            return RESTART
        self._state = DEAD
        self.serving.set()  # nobody waits for a dead group: their calls fail at once
        return TEAR_DOWN

    def budget_text(self) -> str:
        """How the budget stands, for error messages: 'after 2 of 2 restarts'."""
        state = self.snapshot()
        if state.max_restarts == 0:
            return "max_restarts=0"
        return f"after {state.restarts} of max_restarts={state.max_restarts}"


class HealthBook:
    """Every group's `GroupHealth` in one run, made on first use (a backend may add groups)."""

    def __init__(self, on_restarted: Callable[[str, int, str], Any] | None = None) -> None:
        self.on_restarted = on_restarted
        self._lock = threading.Lock()
        self._groups: dict[str, GroupHealth] = {}
        self._listeners: list[Callable[[GroupState], Any]] = []

    def listen(self, listener: Callable[[GroupState], Any]) -> None:
        """Call `listener(state)` after every transition of any group of the book (from the
        thread that made it; an exception it raises is logged, never passed on)."""
        with self._lock:
            self._listeners.append(listener)

    def states(self) -> list[GroupState]:
        """Every group's current state, in the order the groups were first used."""
        with self._lock:
            groups = list(self._groups.values())
        return [g.snapshot() for g in groups]

    def _changed(self, state: GroupState) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(state)
            except Exception as exc:  # a listener must not stop a restart
                log.warning(
                    "twinkle: a group health listener raised %s: %s", type(exc).__name__, exc
                )

    def of(self, group: Any) -> GroupHealth:
        """The health of `group` (a `DeviceGroup`: its `max_restarts` sets the budget)."""
        with self._lock:
            health = self._groups.get(group.name)
            if health is None:
                budget = int(getattr(group, "max_restarts", 0) or 0)
                health = self._groups[group.name] = GroupHealth(
                    group.name, budget, self._notify, self._changed
                )
            return health

    def _notify(self, group: str, generation: int, cause: str) -> None:
        callback = self.on_restarted  # set by the runtime once it exists
        if callback is not None:
            callback(group, generation, cause)

    def get(self, name: str) -> GroupHealth | None:
        with self._lock:
            return self._groups.get(name)

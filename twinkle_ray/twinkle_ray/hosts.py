"""The actors of a device group that host its objects (one process per rank), and what a
restart needs to build them again.

The group's first object starts one actor per rank; every later object of the group that can
share them (`remote_class(colocate=True)`, the default, the same number of workers and Ray
Direct Transport declaration) is built in those same actors, in the next slot
(`TwinkleActor._tw_construct_more`), as torchrun hosts every object of a rank in its one
process. An object with `colocate=False` gets `Hosts` of its own, not shared. Each `Member`
keeps its class and constructor arguments (LazyCollects already resolved to their values), so
a restart (`restarts.py`) replays every constructor, in slot order, in new actors. When the
actors are torn down for good, the next object on the group starts new ones.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Member:
    """One object hosted by the actors: its worker group, class, arguments and slot."""

    workers: Any
    cls: type
    args: tuple
    kwargs: dict
    slot: int


@dataclass
class Hosts:
    """One set of actors: its first object's workers, their placement slots
    (`resources.WorkerSlot`, one per rank), whether they are declared for Ray Direct Transport,
    the actor class (`hosting`) and instance number their names use, and the objects they
    host (`members`, in slot order)."""

    first: Any
    slots: list[Any]
    rdt: bool
    hosting: Any = None
    instance: int = 0
    objects: int = 1
    members: list[Member] = field(default_factory=list)
    #: Rank -> the liveness probe in flight for it (`restarts.Watcher`).
    pings: dict[int, Any] = field(default_factory=dict)
    #: Held while a death is turned into a restart or a teardown (one at a time).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Set once a restart rebuilt the actors (constructors replayed), until the next teardown:
    #: they may join collective groups before the group takes calls again.
    rebuilt: bool = False
    #: The per-node relays of these actors (`relay.Route`), when they span enough nodes.
    route: Any = None
    #: Set while a dead relay's route is replaced (`rerouting.py`): calls wait for it.
    rerouting: threading.Event | None = None
    #: How many times the relays were replaced (names the new ones).
    reroutes: int = 0

    @property
    def alive(self) -> bool:
        return self.first.torn_down is None

    @property
    def group(self) -> Any:
        return self.first.group

    def fits(self, num_workers: int, rdt: bool) -> bool:
        """Whether an object of `num_workers` workers and declaration `rdt` can join."""
        return self.alive and num_workers == len(self.slots) and rdt == self.rdt

    def take_slot(self) -> int:
        """The slot the next object takes in every actor."""
        slot = self.objects
        self.objects += 1
        return slot

    def teardown(self, reason: str) -> None:
        """Kill the actors (once) and mark every hosted object torn down with `reason`."""
        self.rebuilt = False
        self.first.teardown(reason)  # and its relays
        self.route = None
        for member in self.members:
            member.workers.torn_down = reason
            member.workers.route = None
        self.pings = {}

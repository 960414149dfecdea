"""The actors of a device group that host its colocated objects (one process per rank).

The group's first object starts one actor per rank; every later object of the group that can
share them (`remote_class(colocate=True)`, the default, the same number of workers and Ray
Direct Transport declaration, a group that does not restart) is built in those same actors,
in the next slot (`TwinkleActor._tw_construct_more`), as torchrun hosts every object of a
rank in its one process. When the actors are torn down (a worker died), the next object on
the group starts new ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Hosts:
    """One group's shared actors: its first object's workers, their placement slots
    (`resources.WorkerSlot`, one per rank), whether they are declared for Ray Direct Transport,
    and how many objects they host."""

    first: Any
    slots: list[Any]
    rdt: bool
    objects: int = 1

    @property
    def alive(self) -> bool:
        return self.first.torn_down is None

    def fits(self, num_workers: int, rdt: bool) -> bool:
        """Whether an object of `num_workers` workers and declaration `rdt` can join."""
        return self.alive and num_workers == len(self.slots) and rdt == self.rdt

    def take_slot(self) -> int:
        """The slot the next object takes in every actor."""
        slot = self.objects
        self.objects += 1
        return slot

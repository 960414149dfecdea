"""`DeviceGroup`: a named set of ranks on one device type; remote classes are placed on one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import ConfigurationError

#: The most device ranks a group or mesh may have: 65,536 (8,192 nodes of 8 devices), beyond
#: any cluster twinkle places on. Checked before anything is built, so an absurd size is a
#: clear error at once instead of a rank list filling memory.
MAX_RANKS = 1 << 16


def check_rank_count(what: str, count: int) -> None:
    """Refuse `count` ranks above `MAX_RANKS`, naming `what`."""
    if count > MAX_RANKS:
        raise ConfigurationError(
            f"{what} asks for {count} ranks, more than any cluster twinkle places on (at most "
            f"{MAX_RANKS}: 8,192 nodes of 8 devices); check the size (a count of workers, "
            "not of items or bytes)"
        )


def canonical_device_type(device_type: str) -> str:
    """Lower-case `device_type` and map the aliases platforms declare (`GPU` -> `cuda` when
    a plugin registering the cuda platform is installed; a third-party platform adds its own)."""
    if not isinstance(device_type, str) or not device_type.strip():
        raise ConfigurationError(
            f"device_type must be a non-empty string such as 'cuda', 'npu' or 'cpu', "
            f"got {device_type!r}"
        )
    name = device_type.strip().lower()
    if name == "cpu":
        return name
    from .platform import platform_aliases

    return platform_aliases().get(name, name)


@dataclass(frozen=True)
class DeviceGroup:
    """A named group of workers on one device type.

    `ranks` is a list of global device ranks (which accelerators the group occupies), or, for
    CPU groups, a count of worker processes. `gpus_per_worker` gives each worker several devices.
    `visible_devices` pins the group to explicit physical device ids instead of the planned ones.
    `max_restarts` is how many times the group's workers are rebuilt after one of them dies
    (on backends that can: Ray); 0, the default, tears the group down at its first death.
    """

    name: str
    ranks: Sequence[int] | int
    device_type: str = "cpu"
    gpus_per_worker: int = 1
    visible_devices: Sequence[int] | None = None
    max_restarts: int = 0
    _rank_list: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(
                f"DeviceGroup(name=...) must be a non-empty string, got {self.name!r}"
            )
        object.__setattr__(self, "device_type", canonical_device_type(self.device_type))
        ranks = self.ranks
        if isinstance(ranks, bool) or not isinstance(ranks, (int, Sequence)):
            raise ConfigurationError(
                f"DeviceGroup {self.name!r}: ranks must be a list of global ranks or a worker "
                f"count, got {ranks!r}"
            )
        if isinstance(ranks, int):
            if ranks < 1:
                raise ConfigurationError(
                    f"DeviceGroup {self.name!r}: ranks as a count must be >= 1, got {ranks}"
                )
            check_rank_count(f"DeviceGroup {self.name!r}: ranks", ranks)
            rank_list = tuple(range(ranks))
        else:
            if hasattr(ranks, "__len__"):
                check_rank_count(f"DeviceGroup {self.name!r}: ranks", len(ranks))
            rank_list = tuple(ranks)
            if not rank_list:
                raise ConfigurationError(f"DeviceGroup {self.name!r}: ranks must not be empty")
            bad = [
                r
                for r in rank_list
                if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < MAX_RANKS
            ]
            if bad:
                raise ConfigurationError(
                    f"DeviceGroup {self.name!r}: ranks must be integers from 0 to {MAX_RANKS - 1} "
                    f"(global device ranks), got {bad[:5]}"
                )
            if len(set(rank_list)) != len(rank_list):
                raise ConfigurationError(
                    f"DeviceGroup {self.name!r}: ranks contain duplicates: {list(rank_list)}"
                )
        if (
            isinstance(self.gpus_per_worker, bool)
            or not isinstance(self.gpus_per_worker, int)
            or (self.gpus_per_worker < 1)
        ):
            raise ConfigurationError(
                f"DeviceGroup {self.name!r}: gpus_per_worker must be an integer >= 1, "
                f"got {self.gpus_per_worker!r}"
            )
        if len(rank_list) % self.gpus_per_worker:
            raise ConfigurationError(
                f"DeviceGroup {self.name!r}: {len(rank_list)} ranks cannot be split into workers "
                f"of gpus_per_worker={self.gpus_per_worker}; use a multiple of it"
            )
        if self.visible_devices is not None:
            devices = tuple(self.visible_devices)
            if len(devices) != len(rank_list):
                raise ConfigurationError(
                    f"DeviceGroup {self.name!r}: visible_devices has {len(devices)} entries but "
                    f"the group has {len(rank_list)} ranks; give one device id per rank"
                )
            object.__setattr__(self, "visible_devices", devices)
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or self.max_restarts < 0
        ):
            raise ConfigurationError(
                f"DeviceGroup {self.name!r}: max_restarts must be an integer >= 0 (how many "
                f"times its workers are rebuilt after a death), got {self.max_restarts!r}"
            )
        object.__setattr__(self, "_rank_list", rank_list)

    @property
    def rank_list(self) -> tuple[int, ...]:
        """The group's device ranks as a tuple (a count `n` becomes `0..n-1`)."""
        return self._rank_list

    @property
    def num_devices(self) -> int:
        """How many devices (or CPU slots) the group occupies."""
        return len(self._rank_list)

    @property
    def num_workers(self) -> int:
        """How many worker processes the group has: one per `gpus_per_worker` devices."""
        return len(self._rank_list) // self.gpus_per_worker

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    def worker_ranks(self, worker: int) -> tuple[int, ...]:
        """The device ranks that worker number `worker` of this group owns."""
        g = self.gpus_per_worker
        return self._rank_list[worker * g : (worker + 1) * g]

    # ------------------------------------------------------------------ the device-rank rule
    # Written once, here: accelerator groups share one device-rank space per device type, and
    # node `i` holds device ranks `i*nproc_per_node ... (i+1)*nproc_per_node-1`. The Ray
    # backend places its workers by it, `twinkle placement` draws plans by it
    # (`ExecutionBackend.plan_placement`), and torchrun's launcher lays processes out the same.

    def spanned_nodes(self, worker: int, nproc_per_node: int) -> list[int]:
        """The node indices worker `worker`'s device ranks fall on (one, unless it spans)."""
        return sorted({r // nproc_per_node for r in self.worker_ranks(worker)})

    def worker_node(self, worker: int, nproc_per_node: int) -> int:
        """The index of the node worker `worker` runs on (that of its first device rank)."""
        return self.worker_ranks(worker)[0] // nproc_per_node

    def worker_devices(self, worker: int, nproc_per_node: int) -> tuple[int, ...]:
        """Worker `worker`'s devices on its node: its `visible_devices` when given, else each
        device rank's place on its node (`rank % nproc_per_node`)."""
        if self.visible_devices is not None:
            g = self.gpus_per_worker
            return tuple(self.visible_devices[worker * g : (worker + 1) * g])
        return tuple(r % nproc_per_node for r in self.worker_ranks(worker))

    def spanning_message(self, worker: int, nproc_per_node: int) -> str | None:
        """Why worker `worker` cannot be placed (its devices span nodes), or None."""
        spanned = self.spanned_nodes(worker, nproc_per_node)
        if len(spanned) < 2:
            return None
        return (
            f"worker {worker} owns device ranks {list(self.worker_ranks(worker))}, which span "
            f"nodes {', '.join(str(n) for n in spanned)} with nproc_per_node={nproc_per_node}; "
            "a worker must sit on one node: make gpus_per_worker divide nproc_per_node and "
            "align the ranks"
        )

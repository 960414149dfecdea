"""`DeviceMesh`: how the workers of one remote class are arranged into parallel dimensions.

Mesh entries are worker ranks within the class's group (0..n-1). Data dimensions (`dp`,
`fsdp`) decide which share of a batch a worker receives; every other dimension (`tp`, `pp`,
`cp`, `ep`, ...) holds peers that receive the same share.

Inside a worker, the original Twinkle infra's per-dimension accessors answer for the worker
running the code (its group rank, from the worker context, so every mode answers alike):
`mesh.dp_rank`, `mesh.tp_rank`, ... (any dimension: `<name>_rank`), `mesh.data_rank`, and
`mesh.<name>_world_size`. On the driver, or in a process whose rank is not in the mesh, the
`_rank` accessors are None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .device_group import check_rank_count
from .errors import ConfigurationError

# Outermost to innermost, as in Megatron-style layouts: tensor parallel peers are adjacent ranks.
STANDARD_DIMS = ("pp", "dp", "fsdp", "ep", "cp", "tp")
DATA_DIMS = ("dp", "fsdp")


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigurationError(f"DeviceMesh: {name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True, eq=False)
class DeviceMesh:
    """An n-dimensional array of worker ranks with a name per dimension."""

    mesh: np.ndarray
    mesh_dim_names: tuple[str, ...]
    _coords: dict[int, tuple[int, ...]] = field(init=False, repr=False)
    _memo: dict[Any, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        mesh = np.asarray(self.mesh)
        names = tuple(self.mesh_dim_names)
        if mesh.ndim != len(names):
            raise ConfigurationError(
                f"DeviceMesh: mesh has {mesh.ndim} dimensions but {len(names)} names {names}; "
                "give one name per dimension"
            )
        if len(set(names)) != len(names):
            raise ConfigurationError(f"DeviceMesh: dimension names repeat: {names}")
        if mesh.size == 0 or not np.issubdtype(mesh.dtype, np.integer):
            raise ConfigurationError("DeviceMesh: mesh must be a non-empty array of integer ranks")
        flat = mesh.reshape(-1).tolist()
        if len(set(flat)) != len(flat) or min(flat) < 0:
            raise ConfigurationError(
                f"DeviceMesh: ranks must be distinct non-negative integers, got {flat}"
            )
        mesh = mesh.copy()
        mesh.setflags(write=False)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "mesh_dim_names", names)
        coords = {int(mesh[idx]): tuple(int(i) for i in idx) for idx in np.ndindex(mesh.shape)}
        object.__setattr__(self, "_coords", coords)
        # The mesh is immutable: answers every call asks again are computed once.
        object.__setattr__(self, "_memo", {})

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_sizes(
        cls,
        *,
        dp_size: int = 1,
        fsdp_size: int = 1,
        tp_size: int = 1,
        pp_size: int = 1,
        cp_size: int = 1,
        ep_size: int = 1,
        ranks: Sequence[int] | None = None,
        **extra_sizes: int,
    ) -> DeviceMesh:
        """A mesh with the standard dimensions (and any extra `<name>_size=`), ranks row-major.

        Dimensions of size 1 are kept so every mesh answers `dim_size('tp')` and friends.
        Extra dimensions are placed innermost, after `tp`.
        """
        sizes = {
            "pp": _check_size("pp_size", pp_size),
            "dp": _check_size("dp_size", dp_size),
            "fsdp": _check_size("fsdp_size", fsdp_size),
            "ep": _check_size("ep_size", ep_size),
            "cp": _check_size("cp_size", cp_size),
            "tp": _check_size("tp_size", tp_size),
        }
        world_size = extra_sizes.pop("world_size", None)
        for key, value in extra_sizes.items():
            if not key.endswith("_size") or key[: -len("_size")] in sizes:
                raise ConfigurationError(
                    f"DeviceMesh.from_sizes: unexpected argument {key!r}; dimensions are given as "
                    f"<name>_size=N, e.g. dp_size=2, tp_size=4"
                )
            sizes[key[: -len("_size")]] = _check_size(key, value)
        world = math.prod(sizes.values())  # python ints: no overflow for absurd sizes
        check_rank_count(f"DeviceMesh.from_sizes({_sizes_text(sizes)})", world)
        if world_size is not None and world_size != world:
            raise ConfigurationError(
                f"DeviceMesh.from_sizes: world_size={world_size!r} but the sizes "
                f"({_sizes_text(sizes)}) make {world} ranks; world_size is not a dimension. "
                f"Drop world_size, or give sizes whose product is it (e.g. dp_size={world_size})"
            )
        if ranks is None:
            rank_array = np.arange(world)
        else:
            rank_array = np.asarray(list(ranks))
            if rank_array.size != world:
                raise ConfigurationError(
                    f"DeviceMesh.from_sizes: sizes {sizes} need {world} ranks, "
                    f"but {rank_array.size} were given"
                )
        return cls(rank_array.reshape(tuple(sizes.values())), tuple(sizes))

    # ----------------------------------------------------------------- queries
    def _remember(self, key: Any, compute: Any) -> Any:
        memo = self._memo
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    @property
    def world_size(self) -> int:
        return len(self._coords)  # one entry per rank; read on every call, so no numpy here

    @property
    def ranks(self) -> list[int]:
        """All ranks in row-major order."""
        return list(self._remember("ranks", lambda: [int(r) for r in self.mesh.reshape(-1)]))

    def dim_size(self, name: str) -> int:
        """Size of dimension `name`, 1 when the mesh has no such dimension."""
        if name in self.mesh_dim_names:
            return int(self.mesh.shape[self.mesh_dim_names.index(name)])
        return 1

    def coordinate(self, rank: int, name: str) -> int:
        """Index of `rank` along dimension `name` (0 when the dimension is absent)."""
        coords = self._coordinates(rank)
        if name not in self.mesh_dim_names:
            return 0
        return coords[self.mesh_dim_names.index(name)]

    def _coordinates(self, rank: int) -> tuple[int, ...]:
        try:
            return self._coords[int(rank)]
        except KeyError:
            raise ConfigurationError(
                f"DeviceMesh: rank {rank} is not in this mesh (ranks {self.ranks})"
            ) from None

    @property
    def data_world_size(self) -> int:
        """How many distinct data shards the mesh consumes (dp x fsdp)."""
        return int(
            self._remember("dws", lambda: int(np.prod([self.dim_size(d) for d in DATA_DIMS])))
        )

    def data_rank_of(self, rank: int) -> int:
        """Which data shard `rank` consumes; tp/pp/cp/ep peers share the same data rank."""

        def compute() -> int:
            data_rank = 0
            for dim in DATA_DIMS:
                data_rank = data_rank * self.dim_size(dim) + self.coordinate(rank, dim)
            return data_rank

        return int(self._remember(("data_rank", int(rank)), compute))

    # ----------------------------------------------------------------- the worker's own place
    def _own_rank(self) -> int | None:
        """The rank of the worker running this code, when it is in this mesh."""
        from .context import get_worker_context

        ctx = get_worker_context()
        if ctx is None or ctx.rank not in self._coords:
            return None
        return ctx.rank

    @property
    def data_rank(self) -> int | None:
        """The data shard of the worker running this code (`dp_rank * fsdp_world_size +
        fsdp_rank`); None on the driver or outside the mesh."""
        rank = self._own_rank()
        return None if rank is None else self.data_rank_of(rank)

    def _known_dim(self, name: str) -> bool:
        return name in self.mesh_dim_names or name in STANDARD_DIMS

    def __getattr__(self, name: str) -> Any:
        """`<dim>_rank` (the running worker's coordinate along `dim`, None on the driver or
        outside the mesh) and `<dim>_world_size` (the dimension's size), for every dimension
        of the mesh and the standard ones (a standard dimension the mesh lacks has size 1 and
        coordinate 0, as `dim_size` and `coordinate` answer)."""
        if not name.startswith("_"):
            if name.endswith("_world_size") and self._known_dim(name[: -len("_world_size")]):
                return self.dim_size(name[: -len("_world_size")])
            if name.endswith("_rank") and self._known_dim(name[: -len("_rank")]):
                rank = self._own_rank()
                return None if rank is None else self.coordinate(rank, name[: -len("_rank")])
        raise AttributeError(
            f"'DeviceMesh' object has no attribute {name!r} (dimensions: "
            f"{', '.join(self.mesh_dim_names)}; per dimension: <name>_rank, <name>_world_size)"
        )

    def get_slice(self, total: int, data_rank: int) -> slice:
        """The share of `total` items that data shard `data_rank` receives.

        Shares differ in length by at most one, earlier shards taking the extra items, so the
        shards in order concatenate back to the whole.
        """
        n = self.data_world_size
        if not 0 <= data_rank < n:
            raise ConfigurationError(f"DeviceMesh: data_rank {data_rank} outside 0..{n - 1}")
        base, extra = divmod(total, n)
        start = data_rank * base + min(data_rank, extra)
        stop = start + base + (1 if data_rank < extra else 0)
        return slice(start, stop)

    def pp_last_ranks(self) -> list[int]:
        """Ranks on the last pipeline stage, in rank order."""
        last = self.dim_size("pp") - 1
        return sorted(r for r in self._coords if self.coordinate(r, "pp") == last)

    def collect_ranks(self) -> list[int]:
        """One rank per data shard whose output stands for its peers, ordered by data rank.

        It is the rank on the last pipeline stage with index 0 on every other non-data dimension.
        """
        return list(self._remember("collect_ranks", self._collect_ranks))

    def _collect_ranks(self) -> list[int]:
        chosen: dict[int, int] = {}
        for rank in sorted(self._coords):
            if any(
                self.coordinate(rank, d) != (self.dim_size("pp") - 1 if d == "pp" else 0)
                for d in self.mesh_dim_names
                if d not in DATA_DIMS
            ):
                continue
            chosen.setdefault(self.data_rank_of(rank), rank)
        return [chosen[d] for d in sorted(chosen)]

    def parallelism(self) -> dict[str, int]:
        """Dimension sizes larger than one, e.g. `{'dp': 2, 'tp': 4}`; `{'dp': 1}` when serial."""
        sizes = {
            n: int(s) for n, s in zip(self.mesh_dim_names, self.mesh.shape, strict=True) if s > 1
        }
        return sizes or {"dp": 1}

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.parallelism().items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceMesh):
            return NotImplemented
        return self.mesh_dim_names == other.mesh_dim_names and np.array_equal(self.mesh, other.mesh)

    def __hash__(self) -> int:
        return hash((self.mesh_dim_names, self.mesh.shape, tuple(self.ranks)))

    def __repr__(self) -> str:
        return f"DeviceMesh({self.describe()}, world_size={self.world_size})"

    def __reduce__(self):
        return (DeviceMesh, (self.mesh, self.mesh_dim_names))


def _sizes_text(sizes: dict[str, int]) -> str:
    """`dp_size=2, tp_size=4` for the sizes other than 1 (all of them when every one is 1)."""
    shown = {k: v for k, v in sizes.items() if v != 1} or sizes
    return ", ".join(f"{k}_size={v}" for k, v in shown.items())

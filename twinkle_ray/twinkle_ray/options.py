"""The options of `initialize(mode='ray', **options)`, validated with errors that say how to fix."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from twinkle_core import ConfigurationError


@dataclass
class RayOptions:
    """Settings of the Ray backend.

    - `address`: a running cluster to connect to (default `$RAY_ADDRESS`; none starts an
      embedded local cluster with the dashboard off, bound to 127.0.0.1).
    - `num_cpus`, `num_gpus`, `resources`, `object_store_memory`: the embedded cluster's size
      (`num_cpus` defaults to enough logical CPUs for the requested groups). Workers that
      cannot fit this machine's cores and memory fail at `initialize` (see
      `resources.embedded_cluster_cpus`); an explicit `num_cpus` skips the CPU check.
    - `oversubscribe`: start an embedded cluster's workers even when they exceed this machine's
      cores or memory (default False).
    - `placement_timeout`: seconds to wait for placement groups before failing (default 60).
    - `start_timeout`: seconds to wait for actors to start and construct (default 300).
    - `cpus_per_worker`: CPUs each CPU-group worker reserves; a number, or a dict by group
      name (fractions allowed, default 1).
    - `env_passthrough`: extra environment variable names (`PREFIX_*` allowed) sent to workers.
    - `namespace`: the Ray namespace of the run's actors (default: an anonymous one).
    - `direct_transport`: declare actors for Ray Direct Transport (the `cuda_ipc` and `nixl`
      transports). None (default): the actors of accelerator groups only; True/False: every
      group's. Declared actors start slower and run their methods on a thread Ray starts, not
      on the process's main thread (see docs/data.md, "Ray Direct Transport").
    - `relay_min_nodes`: a group whose workers span at least this many nodes gets a relay per
      node, and each call goes once to each node's relay instead of once to each worker
      (default 2; 0 turns relays off; see docs/ray.md, "Relays").
    - `relay_fanout`: how many nodes one relay task from the driver reaches. The nodes are
      taken in runs of this many; the first node's relay hands each call on to the others'
      relays of its run, so the driver sends one task per run (default 8: a call to 4 nodes
      costs the driver one task, to 128 nodes 16); 1: the driver sends one to every node.
    """

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    object_store_memory: int | None = None
    placement_timeout: float = 60.0
    start_timeout: float = 300.0
    cpus_per_worker: float | dict[str, float] = 1.0
    env_passthrough: tuple[str, ...] = ()
    namespace: str | None = None
    oversubscribe: bool = False
    direct_transport: bool | None = None
    relay_min_nodes: int = 2
    relay_fanout: int = 8

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> RayOptions:
        known = {f.name for f in fields(cls)}
        if "restart" in options:
            raise ConfigurationError(
                "initialize(mode='ray', restart=...) is gone: restarts belong to the group now, "
                "in every mode. Give the group a budget instead: DeviceGroup('name', ..., "
                "max_restarts=3)"
            )
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"initialize(mode='ray') got unknown options {unknown}; the Ray backend accepts: "
                f"{', '.join(sorted(known))}"
            )
        opts = cls(**dict(options))
        if opts.address is None:
            opts.address = os.environ.get("RAY_ADDRESS") or None
        if opts.address is not None and (not isinstance(opts.address, str) or not opts.address):
            raise ConfigurationError(
                f"initialize(mode='ray', address=...) must be a cluster address such as "
                f"'10.0.0.1:6379' or 'auto', got {opts.address!r}"
            )
        for name in ("num_cpus", "num_gpus", "object_store_memory"):
            value = getattr(opts, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or (value < 0)
            ):
                raise ConfigurationError(
                    f"initialize(mode='ray', {name}=...) must be a non-negative integer, "
                    f"got {value!r}"
                )
        if opts.direct_transport not in (None, True, False):
            raise ConfigurationError(
                "initialize(mode='ray', direct_transport=...) must be True, False or None "
                f"(decide from the run), got {opts.direct_transport!r}"
            )
        for name, least, meaning in (
            (
                "relay_min_nodes",
                0,
                "a non-negative integer (the number of nodes from which a group's calls go "
                "through per-node relays; 0 turns relays off)",
            ),
            (
                "relay_fanout",
                1,
                "a positive integer (how many nodes one relay task from the driver reaches; "
                "1: one task per node)",
            ),
        ):
            value = getattr(opts, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigurationError(
                    f"initialize(mode='ray', {name}=...) must be {meaning}, got {value!r}"
                )
        for name in ("placement_timeout", "start_timeout"):
            value = getattr(opts, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(
                    f"initialize(mode='ray', {name}=...) must be a positive number of seconds, "
                    f"got {value!r}"
                )
        if not isinstance(opts.resources, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and v >= 0
            for k, v in opts.resources.items()
        ):
            raise ConfigurationError(
                f"initialize(mode='ray', resources=...) must map resource names to amounts, "
                f"e.g. {{'NPU': 8}}; got {opts.resources!r}"
            )
        cpw = opts.cpus_per_worker
        values = cpw.values() if isinstance(cpw, Mapping) else [cpw]
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values
        ):
            raise ConfigurationError(
                f"initialize(mode='ray', cpus_per_worker=...) must be a positive number or a "
                f"dict of group name -> positive number, got {cpw!r}"
            )
        if isinstance(opts.env_passthrough, str) or not all(
            isinstance(v, str) and v for v in opts.env_passthrough
        ):
            raise ConfigurationError(
                f"initialize(mode='ray', env_passthrough=...) must be a list of variable names "
                f"(a trailing '*' matches a prefix), got {opts.env_passthrough!r}"
            )
        opts.env_passthrough = tuple(opts.env_passthrough)
        if not isinstance(opts.oversubscribe, bool):
            raise ConfigurationError(
                f"initialize(mode='ray', oversubscribe=...) must be True or False, "
                f"got {opts.oversubscribe!r}"
            )
        return opts

    def cpus_for(self, group: str) -> float:
        """CPUs one worker of CPU group `group` reserves."""
        cpw = self.cpus_per_worker
        if isinstance(cpw, Mapping):
            return float(cpw.get(group, 1.0))
        return float(cpw)

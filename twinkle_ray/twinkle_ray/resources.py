"""The ResourceManager: turns the run's device groups into placement groups and worker slots.

Accelerator groups share one device-rank space per device type: node `i` (in the stable node
order) holds device ranks `i*nproc_per_node ... (i+1)*nproc_per_node-1`, reserved by one
placement group pinned to that node (`{GPU or NPU: nproc_per_node, CPU: node CPUs // 2}`).
Each CPU group gets a placement group of one bundle per worker. The request is checked against
the live nodes before anything is asked for, and placement waits at most `placement_timeout`.

Inside its bundle an actor asks only for a token share: the placement group already holds the
devices, twinkle itself decides which physical device each worker sees, and several remote
classes can live on the same group (as on torchrun, where one process hosts all of them).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from twinkle_core import ConfigurationError, DeviceGroup, TwinkleError
from twinkle_core.plugin import get_platform

from .cluster import NodeInfo, describe_nodes, live_nodes
from .waitlog import wait_for_placement

#: The share of its bundle's resources one actor requests (see the module docstring).
TOKEN_SHARE = 0.01


class ClusterResourceError(TwinkleError):
    """The cluster cannot hold what the run asks for (or not within `placement_timeout`)."""


@dataclass
class NodeReservation:
    """One accelerator placement group on one node, and the physical devices it holds."""

    device_type: str
    resource: str
    node: NodeInfo
    node_index: int
    pg: PlacementGroup
    devices: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerSlot:
    """Where worker `rank` of a group runs and what it sees."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: NodeInfo
    pg: PlacementGroup
    bundle_index: int
    device_type: str
    devices: tuple[int, ...]
    visible_env: dict[str, str]
    resources: dict[str, float]


def _ask(value: float) -> str:
    return f"{value:g}"


class ResourceManager:
    """Plans and holds the run's placement groups; releases them all in `release()`."""

    def __init__(
        self,
        run_name: str,
        groups: dict[str, DeviceGroup],
        nproc_per_node: int | None,
        cpus_for: Any,
        placement_timeout: float,
    ) -> None:
        self.run_name = run_name
        self.groups = groups
        self.nproc_per_node = nproc_per_node
        self.cpus_for = cpus_for
        self.placement_timeout = placement_timeout
        self.nodes: list[NodeInfo] = []
        self.reservations: dict[str, list[NodeReservation]] = {}
        self.npn: dict[str, int] = {}
        self.cpu_pgs: dict[str, PlacementGroup] = {}
        self.cpu_bundle_nodes: dict[str, list[NodeInfo]] = {}
        self._all_pgs: list[PlacementGroup] = []

    # ------------------------------------------------------------------ planning
    def accelerator_types(self) -> list[str]:
        return sorted({g.device_type for g in self.groups.values() if not g.is_cpu})

    def _resource_of(self, device_type: str) -> str:
        platform = get_platform(device_type)
        if not platform.ray_resource:
            raise ConfigurationError(
                f"device_type {device_type!r} has no Ray resource (its platform sets "
                "ray_resource=None), so Ray cannot place it; use a platform with a Ray resource "
                "such as 'cuda' (GPU) or 'npu' (NPU), or 'cpu'"
            )
        return platform.ray_resource

    def _plan_accelerators(self, nodes: list[NodeInfo]) -> dict[str, tuple[str, int, list]]:
        plan = {}
        for dt in self.accelerator_types():
            resource = self._resource_of(dt)
            groups = [g for g in self.groups.values() if g.device_type == dt]
            top_rank = max(max(g.rank_list) for g in groups)
            holders = [n for n in nodes if n.amount(resource) >= 1]
            npn = self.nproc_per_node or (
                int(min(n.amount(resource) for n in holders)) if holders else 0
            )
            asked = (
                f"device groups {', '.join(repr(g.name) for g in groups)} use {dt} device ranks "
                f"up to {top_rank}, with nproc_per_node={self.nproc_per_node or npn}"
            )
            if npn < 1:
                raise self._cannot(asked, f"no live node has any {resource}", nodes, resource)
            n_nodes = top_rank // npn + 1
            eligible = [n for n in holders if n.amount(resource) >= npn]
            if len(eligible) < n_nodes:
                raise self._cannot(
                    asked,
                    f"that needs {n_nodes} node(s) with {npn} {resource} each, and only "
                    f"{len(eligible)} live node(s) have that many",
                    nodes,
                    resource,
                )
            for g in groups:
                for w in range(g.num_workers):
                    spans = g.spanning_message(w, npn)
                    if spans is not None:
                        raise ConfigurationError(f"DeviceGroup {g.name!r}: {spans}")
            self.npn[dt] = npn
            plan[dt] = (resource, npn, eligible[:n_nodes])
            self._check_visible_devices(dt, [(n, None) for n in eligible[:n_nodes]], resource)
        return plan

    def _cannot(self, asked: str, why: str, nodes: list[NodeInfo], *res: str) -> Exception:
        return ClusterResourceError(
            f"the Ray cluster cannot hold this run: {asked}; {why}.\nLive nodes:\n"
            f"{describe_nodes(nodes, tuple(res))}\nAsk for less (groups, nproc_per_node, "
            "cpus_per_worker) or add nodes/resources to the cluster"
        )

    def reserve(self) -> None:
        """Check the request against the live nodes, then create and await the placement groups."""
        self.nodes = nodes = live_nodes()
        plan = self._plan_accelerators(nodes)
        cpu_used = {n.node_id: 0.0 for n in nodes}
        accel_bundles: list[tuple[str, str, int, NodeInfo, int, dict[str, float]]] = []
        for dt, (resource, npn, chosen) in plan.items():
            for index, node in enumerate(chosen):
                cpus = float(int(node.amount("CPU") // 2))
                bundle = {resource: float(npn)}
                if cpus:
                    bundle["CPU"] = cpus
                cpu_used[node.node_id] += cpus
                accel_bundles.append((dt, resource, npn, node, index, bundle))
        cpu_groups = [g for g in self.groups.values() if g.is_cpu]
        total_cpu = sum(n.amount("CPU") for n in nodes)
        free = total_cpu - sum(cpu_used.values())
        asked_cpu = sum(self.cpus_for(g.name) * g.num_workers for g in cpu_groups)
        if asked_cpu > free + 1e-9:
            detail = ", ".join(
                f"{g.name!r}: {g.num_workers} x {_ask(self.cpus_for(g.name))} CPU"
                for g in cpu_groups
            )
            raise self._cannot(
                f"CPU groups ask for {_ask(asked_cpu)} CPUs ({detail})",
                f"the cluster has {_ask(total_cpu)} CPUs, {_ask(free)} of them left after "
                f"the accelerator placement groups",
                nodes,
            )
        biggest = max((n.amount("CPU") for n in nodes), default=0.0)
        for g in cpu_groups:
            if self.cpus_for(g.name) > biggest:
                raise self._cannot(
                    f"group {g.name!r} asks for {_ask(self.cpus_for(g.name))} CPUs per worker",
                    f"the largest node has {_ask(biggest)} CPUs",
                    nodes,
                )
        try:
            self._create(accel_bundles, cpu_groups)
            self._await(nodes)
        except BaseException:
            self.release()
            raise

    def _create(self, accel_bundles: list, cpu_groups: list[DeviceGroup]) -> None:
        for dt, resource, _npn, node, index, bundle in accel_bundles:
            pg = placement_group(
                [bundle],
                strategy="STRICT_PACK",
                name=f"{self.run_name}:{dt}:node{index}",
                bundle_label_selector=[{"ray.io/node-id": node.node_id}],
            )
            self._all_pgs.append(pg)
            self.reservations.setdefault(dt, []).append(
                NodeReservation(dt, resource, node, index, pg)
            )
        for g in cpu_groups:
            pg = placement_group(
                [{"CPU": self.cpus_for(g.name)} for _ in range(g.num_workers)],
                strategy="PACK",
                name=f"{self.run_name}:cpu:{g.name}",
            )
            self._all_pgs.append(pg)
            self.cpu_pgs[g.name] = pg

    def _await(self, nodes: list[NodeInfo]) -> None:
        if not self._all_pgs:
            return
        ready_refs = {pg.ready(): pg for pg in self._all_pgs}
        # Logs every 10 s what is still waiting and what the nodes have free (waitlog.py).
        ready, missing = wait_for_placement(self, ready_refs, self.placement_timeout)
        if missing:
            names = []
            for ref in missing:
                pg = ready_refs[ref]
                names.append(f"{pg.bundle_specs} ({placement_group_table(pg).get('name', '')})")
            raise self._cannot(
                "placement groups " + "; ".join(names),
                f"Ray could not place them within placement_timeout="
                f"{self.placement_timeout:g}s (resources busy or held by other jobs)",
                nodes,
                *{r.resource for rs in self.reservations.values() for r in rs},
            )
        ray.get(ready)
        by_id = {n.node_id: n for n in nodes}
        for name, pg in self.cpu_pgs.items():
            table = placement_group_table(pg)
            placed = table.get("bundles_to_node_id", {})
            self.cpu_bundle_nodes[name] = [
                by_id.get(placed.get(i, ""), NodeInfo(placed.get(i, "?"), "?", {}))
                for i in range(len(pg.bundle_specs))
            ]
        self._discover_devices()

    def _discover_devices(self) -> None:
        """Ask each accelerator placement group which physical devices Ray gave it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probes = []
        for reservations in self.reservations.values():
            for res in reservations:
                npn = self.npn[res.device_type]
                strategy = PlacementGroupSchedulingStrategy(res.pg, placement_group_bundle_index=0)
                probe = _probe_devices.options(
                    **ray_request({res.resource: float(npn)}), scheduling_strategy=strategy
                )
                probes.append((res, probe.remote(res.resource, npn)))
        refs = [ref for _, ref in probes]
        _, missing = ray.wait(refs, num_returns=len(refs), timeout=self.placement_timeout)
        if missing:
            raise ClusterResourceError(
                f"could not discover the devices of {len(missing)} accelerator placement "
                f"group(s) within {self.placement_timeout:g}s"
            )
        for res, ref in probes:
            node_id, devices = ray.get(ref)
            if node_id != res.node.node_id:
                raise ClusterResourceError(
                    f"placement group for {res.device_type} node {res.node_index} landed on node "
                    f"{node_id[:8]} instead of {res.node.label}"
                )
            res.devices = devices
        for dt, reservations in self.reservations.items():
            self._check_visible_devices(
                dt, [(r.node, r.devices) for r in reservations], reservations[0].resource
            )

    def _check_visible_devices(
        self, device_type: str, nodes: list[tuple[NodeInfo, list[int] | None]], resource: str
    ) -> None:
        """`visible_devices` must name devices this run holds on each worker's node, once each.

        Ray hands a placement group some of a node's devices (all of them when
        `nproc_per_node` equals the node's count); pinning a worker to any other device
        would share it with whoever holds it, so that is an error, not a silent overlap.
        `nodes` are the run's nodes for `device_type` in rank order, each with the device ids
        the run holds there, or None before they are known (the plan checks ids and
        duplicates before anything is reserved; the held ids are checked once discovered).
        """
        npn = self.npn[device_type]
        for group in self.groups.values():
            if group.device_type != device_type or group.visible_devices is None:
                continue
            g = group.gpus_per_worker
            used: dict[tuple[str, int], int] = {}
            for w in range(group.num_workers):
                ranks = group.worker_ranks(w)
                node, held = nodes[group.worker_node(w, npn)]
                for i, rank in enumerate(ranks):
                    device = group.visible_devices[w * g + i]
                    where = (
                        f"DeviceGroup {group.name!r}: visible_devices[{w * g + i}]={device!r} "
                        f"(device rank {rank}, worker {w}) is on node {node.label}"
                    )
                    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
                        raise ConfigurationError(
                            f"{where}, but a device id must be a non-negative integer such as 0"
                        )
                    if held is not None and device not in held:
                        raise ClusterResourceError(
                            f"{where}, but this run holds only {device_type} devices {held} "
                            f"there (the node has {node.amount(resource):g} {resource}); give "
                            "each rank one of those ids, or set nproc_per_node to the node's "
                            "device count so the run holds all of them"
                        )
                    key = (node.node_id, device)
                    if key in used:
                        raise ConfigurationError(
                            f"{where}, where device rank {used[key]} of the same group already "
                            "uses it; give every rank of a group its own device"
                        )
                    used[key] = rank

    # ------------------------------------------------------------------ slots
    def slots(self, group: DeviceGroup, num_workers: int) -> list[WorkerSlot]:
        """Where each of the `num_workers` workers of `group` goes (ranks by node, then device)."""
        if group.is_cpu:
            return self._cpu_slots(group, num_workers)
        return self._accelerator_slots(group, num_workers)

    def _cpu_slots(self, group: DeviceGroup, num_workers: int) -> list[WorkerSlot]:
        pg = self.cpu_pgs[group.name]
        nodes = self.cpu_bundle_nodes[group.name]
        order = {n.node_id: i for i, n in enumerate(self.nodes)}
        bundles = sorted(range(len(nodes)), key=lambda b: (order.get(nodes[b].node_id, 1e9), b))
        bundles = bundles[:num_workers]
        share = self.cpus_for(group.name) * TOKEN_SHARE
        return self._finish(
            group,
            [(nodes[b], pg, b, (), {}, {"CPU": share}) for b in bundles],
        )

    def _accelerator_slots(self, group: DeviceGroup, num_workers: int) -> list[WorkerSlot]:
        dt = group.device_type
        npn = self.npn[dt]
        reservations = self.reservations[dt]
        platform = get_platform(dt)
        raw = []
        for w in range(num_workers):
            ranks = group.worker_ranks(w)
            res = reservations[group.worker_node(w, npn)]
            local = group.worker_devices(w, npn)
            if group.visible_devices is not None:
                # Pinned by the user (checked against the node in `_check_visible_devices`).
                devices = local
            else:  # the rule's places on the node, as the devices this run holds there
                devices = tuple(res.devices[i] for i in local)
            cpu = float(res.pg.bundle_specs[0].get("CPU", 0.0))
            request = {res.resource: round(len(ranks) * TOKEN_SHARE, 4)}
            if cpu:
                request["CPU"] = round(cpu / npn * len(ranks) * TOKEN_SHARE, 4)
            env = platform.visible_devices_environment(devices)
            raw.append((res.node, res.pg, 0, devices, env, request))
        return self._finish(group, raw)

    def _finish(self, group: DeviceGroup, raw: list) -> list[WorkerSlot]:
        per_node: dict[str, int] = {}
        for node, *_ in raw:
            per_node[node.node_id] = per_node.get(node.node_id, 0) + 1
        seen: dict[str, int] = {}
        slots = []
        for rank, (node, pg, bundle, devices, env, request) in enumerate(raw):
            local = seen.get(node.node_id, 0)
            seen[node.node_id] = local + 1
            slots.append(
                WorkerSlot(
                    rank=rank,
                    world_size=len(raw),
                    local_rank=local,
                    local_world_size=per_node[node.node_id],
                    node=node,
                    pg=pg,
                    bundle_index=bundle,
                    device_type=group.device_type,
                    devices=devices,
                    visible_env=env,
                    resources=request,
                )
            )
        return slots

    def check_standing(self, group: str, slots: list[WorkerSlot]) -> None:
        """Raise if a node or placement group holding `slots` is gone (before a restart)."""
        alive = {n.node_id for n in live_nodes()}
        lost = []
        for slot in slots:
            try:
                state = placement_group_table(slot.pg).get("state", "?")
            except Exception:  # the placement group is unknown to the cluster
                state = "unknown"
            if slot.node.node_id not in alive or state != "CREATED":
                lost.append(
                    f"rank {slot.rank} on node {slot.node.label} "
                    f"({'node alive' if slot.node.node_id in alive else 'node dead'}, "
                    f"placement group {state})"
                )
        if lost:
            raise ClusterResourceError(
                f"cannot restart group {group!r}: its reserved resources are gone: "
                f"{'; '.join(lost)}; shut down and initialize again on the remaining nodes"
            )

    # ------------------------------------------------------------------ release
    def release(self) -> None:
        """Remove every placement group this run created (idempotent)."""
        pgs, self._all_pgs = self._all_pgs, []
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # already gone with its cluster
                pass
        self.reservations.clear()
        self.cpu_pgs.clear()


@ray.remote(num_cpus=0)
def _probe_devices(resource: str, count: int) -> tuple[str, list[int]]:
    """Runs inside one accelerator placement group: the node and the device ids Ray assigned."""
    ctx = ray.get_runtime_context()
    ids = ctx.get_accelerator_ids().get(resource) or []
    devices = sorted(int(i) for i in ids if str(i).isdigit())
    if len(devices) != count:
        devices = list(range(count))  # a resource Ray does not track by id: use local indices
    return ctx.get_node_id(), devices


# ----------------------------------------------------------------------- embedded cluster
#: Memory of one idle worker process, before user code allocates anything: a twinkle actor (a Ray
#: worker with twinkle-core and torch imported, which seeding needs) measured 274 MiB RSS, 189
#: MiB PSS, 171 MiB private (Ray 2.60, torch 2.13 CPU, Python 3.11). Rounded up.
WORKER_MEMORY_MIB = 280
#: Memory of the embedded cluster's own processes (GCS, raylet, log monitor, agents): ~500 MiB.
CLUSTER_MEMORY_MIB = 512
#: CPU workers may ask for up to this many times the machine's cores (small tests and examples
#: run on laptops and 2-core CI machines); beyond it a run only thrashes.
MAX_CPU_OVERSUBSCRIPTION = 4


@dataclass(frozen=True)
class MachineCapacity:
    """What this machine can give an embedded cluster: usable cores and memory (MiB)."""

    cpus: int
    available_mib: int
    total_mib: int


def _cgroup_value(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def machine_capacity() -> MachineCapacity:
    """Cores this process may run on (affinity, cgroup v2 `cpu.max`) and its memory
    (`MemAvailable`/`MemTotal`, capped by cgroup v2 `memory.max`)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = (_cgroup_value("/sys/fs/cgroup/cpu.max") or "max").split()
    if len(quota) == 2 and quota[0] != "max":
        cpus = max(1, min(cpus, math.ceil(int(quota[0]) / int(quota[1]))))
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value, *_ = line.split()
                info[key.rstrip(":")] = int(value) // 1024
    except (OSError, ValueError):
        pass
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", total)
    limit = _cgroup_value("/sys/fs/cgroup/memory.max")
    used = _cgroup_value("/sys/fs/cgroup/memory.current")
    if limit and limit != "max" and limit.isdigit():
        total = min(total, int(limit) >> 20) if total else int(limit) >> 20
        in_use = int(used) >> 20 if used and used.isdigit() else 0
        available = min(available, max(0, total - in_use)) if available else total - in_use
    return MachineCapacity(cpus, available, total)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def embedded_cluster_cpus(
    groups: dict[str, DeviceGroup],
    cpus_for: Any,
    *,
    num_cpus: int | None,
    oversubscribe: bool,
    machine: MachineCapacity | None = None,
) -> int:
    """The `num_cpus` an embedded cluster declares for `groups`; raises `ClusterResourceError`
    when their worker processes cannot fit this machine.

    Sizing: `num_cpus` when given, else enough logical CPUs for the CPU groups (twice that with
    accelerator groups, whose placement groups hold half a node's CPUs), at least the cores.
    Checks (skipped with `oversubscribe=True`): the CPU groups' CPUs at most
    `MAX_CPU_OVERSUBSCRIPTION` times the cores (skipped when `num_cpus` is given: the user sized
    the cluster), and one `WORKER_MEMORY_MIB` per worker process plus `CLUSTER_MEMORY_MIB`
    within the memory available now. A worker process per worker of each group is counted
    (one remote class per group; every further class on a group starts as many again).
    """
    cpu_groups = [g for g in groups.values() if g.is_cpu]
    demand = sum(cpus_for(g.name) * g.num_workers for g in cpu_groups)
    has_accel = len(cpu_groups) < len(groups)
    size = num_cpus
    if size is None:
        size = max(os.cpu_count() or 1, ceil_cpus(demand) * (2 if has_accel else 1))
    if oversubscribe:
        return size
    machine = machine or machine_capacity()
    processes = sum(g.num_workers for g in groups.values())
    memory = processes * WORKER_MEMORY_MIB + CLUSTER_MEMORY_MIB
    cpu_limit = machine.cpus * MAX_CPU_OVERSUBSCRIPTION
    too_many_cpus = num_cpus is None and demand > cpu_limit + 1e-9
    too_much_memory = bool(machine.available_mib) and memory > machine.available_mib
    if not (too_many_cpus or too_much_memory):
        return size
    detail = ", ".join(
        f"{g.name!r}: {g.num_workers} x "
        + (f"{_ask(cpus_for(g.name))} CPU" if g.is_cpu else f"{g.device_type} worker")
        for g in groups.values()
    )
    why = []
    if too_many_cpus:
        why.append(
            f"{_ask(demand)} CPUs is more than {MAX_CPU_OVERSUBSCRIPTION} x its {machine.cpus} "
            f"cores ({cpu_limit})"
        )
    if too_much_memory:
        why.append(
            f"{_gib(memory)} is more than the {_gib(machine.available_mib)} of memory available "
            f"now ({_gib(machine.total_mib)} total)"
        )
    fixes = ["fewer workers", "address= of a cluster that holds them"]
    if too_many_cpus:
        fixes.append(
            f"a fraction of a CPU each (cpus_per_worker={_ask(_fraction(demand, cpu_limit))}) "
            f"or num_cpus={ceil_cpus(demand)} to size the embedded cluster yourself"
        )
    fixes.append("oversubscribe=True to start them anyway")
    raise ClusterResourceError(
        f"the embedded Ray cluster cannot hold this run on this machine: the groups start "
        f"{processes} worker process(es) ({detail}), asking for {_ask(demand)} CPUs and about "
        f"{_gib(memory)} of memory ({processes} x {WORKER_MEMORY_MIB} MiB per idle worker "
        f"process, plus {CLUSTER_MEMORY_MIB} MiB for Ray's own processes); this machine has "
        f"{machine.cpus} CPU cores and {_gib(machine.available_mib)} of memory available: "
        f"{'; '.join(why)}. Ask for {', or '.join(fixes)}"
    )


def _fraction(demand: float, limit: float) -> float:
    share = limit / demand if demand else 1.0
    return math.floor(share * 100) / 100 or 0.01


def ray_request(amounts: dict[str, float]) -> dict[str, Any]:
    """Ray's task/actor options for `amounts` (CPU and GPU have keywords of their own)."""
    rest = {k: v for k, v in amounts.items() if k not in ("CPU", "GPU")}
    return {
        "num_cpus": amounts.get("CPU", 0.0),
        "num_gpus": amounts.get("GPU", 0.0),
        "resources": rest or None,
    }


def ceil_cpus(value: float) -> int:
    return math.ceil(value - 1e-9)

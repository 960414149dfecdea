"""`RayBackend`: mode `ray`. Ray schedules, transports and stores; twinkle plans and wires.

`initialize()` connects to a cluster (or starts an embedded one), reserves placement groups for
every device group (checked against the live nodes first, bounded by `placement_timeout`), and
`create_workers()` starts one actor per worker with its rank environment, visible devices,
seed and worker context. `shutdown()` removes exactly what the run made.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from twinkle_core import CallTimeoutError, ConfigurationError, DeviceGroup, DeviceMesh, LazyCollect
from twinkle_core.plugin import (
    ExecutionBackend,
    WorkerCall,
    WorkerContext,
    WorkerGroup,
    WorkerPlacement,
    WorkersFailedError,
    class_options,
    get_platform,
    recorder,
    registered_names,
    waiting_for,
)

from . import collective as ray_collective
from . import health_board, relay, transports
from . import tracing as ray_tracing
from .actor import ActorBoot, actor_class_for, call_key
from .cluster import ClusterConnection
from .envvars import passthrough_patterns, select
from .hosts import Hosts, Member
from .options import RayOptions
from .payload_check import checked_arguments
from .pending import RayPendingCall
from .relay import NodeRelay, Route, register, remote_on, unregister
from .rerouting import Rerouter
from .resources import ClusterResourceError, ResourceManager, embedded_cluster_cpus, ray_request
from .restarts import Restarter
from .shadowing import check_worker_imports, connected_code_paths
from .shipping import ship_all
from .transfer import register_tensor_serializer, reset_tensor_serializer
from .workers import RayWorkerGroup

log = logging.getLogger("twinkle")

#: user class -> (its Ray actor class, the methods it exposes directly); per connection.
_actor_classes: dict[tuple[type, bool], tuple[Any, frozenset[str]]] = {}
#: How much longer than a collective group's timeout a restart waits for the surviving members
#: to leave the broken world (`RayBackend._reform_collectives`).
LEAVE_MARGIN_S = 30.0

#: The relays' Ray actor class (`relay.NodeRelay`), made once per connection.
_relay_class: list[Any] = []


def actor_class(cls: type, rdt: bool) -> tuple[Any, frozenset[str]]:
    """The Ray actor class hosting workers of `cls` (made once per class, declaration and
    connection); `rdt`: declared for Ray Direct Transport."""
    made = _actor_classes.get((cls, rdt))
    if made is None:
        hosting, direct = actor_class_for(cls)
        if rdt:
            # enable_tensor_transport gives the actors Ray's `_ray_system` concurrency group,
            # where Ray Direct Transport runs its sends and receives (`transports.RdtTransport`);
            # the `RDT_GROUP` thread hands held results to it while the actor runs a call.
            remote = ray.remote(
                enable_tensor_transport=True, concurrency_groups={transports.RDT_GROUP: 1}
            )
            made = (remote(hosting), direct)
        else:
            made = (ray.remote(hosting), direct)
        _actor_classes[(cls, rdt)] = made
    return made


def wants_direct_transport(group: Any, option: bool | None) -> bool:
    """Whether a group's actors are declared for Ray Direct Transport: as `option` (the run's
    `direct_transport=`) says, else for accelerator groups only, where `cuda_ipc` and `nixl`
    can serve (RDT moves tensors between workers of one device type, and `auto` never picks it
    for CPU tensors). A declaration costs actor start-up (measured: 4 CPU actors 7.2-7.6 s
    undeclared, 10.4-11.4 s declared), and declared actors run their methods on a thread Ray
    starts instead of the process's main thread, so CPU groups stay plain unless asked."""
    if option is not None:
        return option
    return not group.is_cpu


def noset_variables() -> dict[str, str]:
    """`RAY_EXPERIMENTAL_NOSET_*` of every registered platform, set to 1."""
    out = {}
    for name in registered_names("platforms"):
        try:
            platform = get_platform(name)
        except Exception as exc:  # a broken platform plugin must not stop the run
            log.debug("twinkle: platform %r could not be loaded: %s", name, exc)
            continue
        for var in getattr(platform, "ray_noset_env_vars", ()):
            out[var] = "1"
    return out


def _resolve_lazies(value: Any) -> Any:
    if isinstance(value, LazyCollect):
        return value()
    if isinstance(value, dict):
        return {k: _resolve_lazies(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_resolve_lazies(v) for v in value)
    return value


class RayBackend(ExecutionBackend):
    """Mode `ray`: every worker of a remote class is a Ray actor on the run's placement groups."""

    name = "ray"

    def __init__(self) -> None:
        super().__init__()
        self.options: RayOptions | None = None
        self.connection = ClusterConnection()
        self.resources: ResourceManager | None = None
        self.worker_groups: list[RayWorkerGroup] = []
        #: The actors of each group hosting colocated objects, by group name (`Hosts`).
        self.hosts: dict[str, Hosts] = {}
        self.passthrough_env: dict[str, str] = {}
        self.noset: dict[str, str] = {}
        self._set_env: list[str] = []
        self._instances = itertools.count()
        #: Collective groups of this run, by name: their members, formed again after a restart
        #: of a member's group, left at shutdown.
        self.collectives: dict[str, FormedCollective] = {}
        #: Held while deciding which collective groups a finished rebuild forms again.
        self._reform_lock = threading.Lock()
        #: Turns a worker's death into a restart or a teardown (`restarts.py`).
        self.restarter = Restarter(self)
        #: Replaces a group's relays after one died on its own (`rerouting.py`).
        self.rerouter = Rerouter(self)

    # ------------------------------------------------------------------ lifecycle
    def initialize(self, config) -> None:
        super().initialize(config)
        self.restarter = Restarter(self)
        self.rerouter = Rerouter(self)
        self.options = opts = RayOptions.parse(config.backend_options)
        config.health.listen(self._publish_health)
        for group in config.groups.values():
            if not group.is_cpu:
                get_platform(group.device_type)  # an unknown device type fails here, clearly
        num_cpus = opts.num_cpus
        if opts.address is None and not ray.is_initialized():  # twinkle starts the cluster
            num_cpus = embedded_cluster_cpus(
                config.groups, opts.cpus_for, num_cpus=num_cpus, oversubscribe=opts.oversubscribe
            )
        self.noset = noset_variables()
        for var, value in self.noset.items():
            if var not in os.environ:
                os.environ[var] = value  # an embedded cluster's raylets inherit it
                self._set_env.append(var)
        patterns = passthrough_patterns(opts.env_passthrough)
        self.passthrough_env = select(os.environ, patterns)
        # The NOSET variables matter only where Ray would set a device visibility variable (an
        # actor that asks for accelerators). A run of CPU groups alone does not send them, and
        # with nothing else to send gives Ray no runtime_env at all: Ray then starts the
        # workers without its runtime-env agent (measured: 4 actors ~1.5 s sooner). The actors
        # still get every variable through ActorBoot.env.
        accelerated = any(not group.is_cpu for group in config.groups.values())
        job_env = {**self.passthrough_env, **(self.noset if accelerated else {})}
        adopting = ray.is_initialized()
        if not adopting and not str(opts.address or "").startswith("ray://"):
            check_worker_imports()  # before a cluster starts: Ray client jobs add no paths
        try:
            if adopting and (paths := connected_code_paths()) is not None:
                check_worker_imports(paths)  # the paths Ray gave this job (none: a client job)
            self.connection.open(
                opts.address,
                runtime_env={"env_vars": job_env},
                namespace=opts.namespace,
                num_cpus=num_cpus,
                num_gpus=opts.num_gpus,
                resources=dict(opts.resources),
                object_store_memory=opts.object_store_memory,
                keep_env=(*patterns, *self.noset),
            )
            self.resources = ResourceManager(
                config.name,
                config.groups,
                config.nproc_per_node,
                opts.cpus_for,
                opts.placement_timeout,
            )
            self.resources.reserve()
            register_tensor_serializer()
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Kill every actor and remove every placement group of this run; safe twice."""
        self.restarter.close()  # no restart may start actors while the run is taken down
        self.rerouter.close()
        groups, self.worker_groups = self.worker_groups, []
        self.hosts = {}
        collectives, self.collectives = self.collectives, {}
        if ray.is_initialized():
            transports.GROUPS.leave_all()
            for name, formed in collectives.items():
                for (
                    handle
                ) in formed.handles:  # queued behind running calls; the kill below ends them
                    try:
                        handle._tw_apply.remote(ray_collective.leave, name)
                    except Exception:
                        pass
            for workers in groups:
                workers.teardown("the run shut down")
            if self.resources is not None:
                self.resources.release()
            try:
                from ray.experimental import internal_kv

                if self.config is not None:
                    internal_kv._internal_kv_del(
                        f"twinkle:{self.config.name}:".encode(), del_by_prefix=True
                    )
            except Exception:  # the cluster may already be gone
                pass
        relay.clear()
        for workers in groups:
            # Ray leaks one socket per actor handle still alive at ray.shutdown() (the user's
            # remote objects keep their group): drop the handles (docs/ray.md, Reliability).
            workers.handles = []
        self.resources = None
        if self.connection.connected_here:
            _actor_classes.clear()  # bound to this connection's cluster
            _relay_class.clear()
            reset_tensor_serializer()
        self.connection.close()
        for var in self._set_env:
            os.environ.pop(var, None)
        self._set_env = []

    # ------------------------------------------------------------------ workers
    def create_workers(
        self,
        cls: type,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        args: tuple,
        kwargs: dict,
        *,
        num_workers: int,
    ) -> WorkerGroup:
        config, opts, resources = self.config, self.options, self.resources
        assert config is not None and opts is not None and resources is not None
        slots = resources.slots(group, num_workers)
        instance = next(self._instances)
        placements = [
            WorkerPlacement(
                s.rank,
                s.node.label,
                s.devices if not group.is_cpu else group.worker_ranks(s.rank),
                group.device_type,
            )
            for s in slots
        ]
        # LazyCollect arguments become values once: a restart replays the constructor with
        # the same values, never re-running the call they came from.
        args, kwargs = _resolve_lazies(args), _resolve_lazies(kwargs)
        rdt = wants_direct_transport(group, opts.direct_transport)
        # One process per rank per group: an object joins the actors of the group's earlier
        # objects, unless it asks for its own (colocate=False) or needs other actors
        # (execute='first' beside a full group, another Ray Direct Transport declaration).
        shares = class_options(cls)["colocate"]
        hosts = self.hosts.get(group.name) if shares else None
        if hosts is not None and hosts.fits(num_workers, rdt):
            return self._colocate(hosts, cls, group, device_mesh, args, kwargs, instance)
        health = config.health.of(group)
        hosting, direct = actor_class(cls, rdt)
        workers = RayWorkerGroup(
            group,
            device_mesh,
            cls.__name__,
            [],
            placements,
            config.name,
            restartable=health.max_restarts > 0,
            direct=direct,
            direct_transport=rdt,
        )
        workers.restarts = health.generation
        workers.health = health
        workers.restart_wait = opts.start_timeout
        self.worker_groups.append(workers)
        workers.tag = f"{group.name}:{cls.__name__}:{instance}.0"
        workers.handles = self._spawn(hosting, cls, group, slots, f"{instance}.0")
        route = self._relays(workers, slots, f"{instance}.0")
        try:
            self._start(workers, slots, cls, args, kwargs, config, opts.start_timeout)
            self._take_route(workers, route, opts.start_timeout)
        except BaseException:
            if route is not None:
                route.kill()
            workers.teardown("its start-up failed")
            self.worker_groups.remove(workers)
            raise
        hosts = Hosts(workers, slots, rdt, hosting, instance, route=route)
        if route is not None:
            self.rerouter.watch(hosts, route)
        self._host(hosts, workers, cls, args, kwargs, 0)
        self._publish_health(health.snapshot())
        if shares and (group.name not in self.hosts or not self.hosts[group.name].alive):
            self.hosts[group.name] = hosts
        if workers.restartable:
            self.restarter.watcher.watch(hosts)
        return workers

    def _relays(self, workers: RayWorkerGroup, slots: list, instance: str) -> Route | None:
        """Start a relay on each node of `slots` (`relay.py`) when they span at least
        `relay_min_nodes` nodes; they start while the workers do. None: calls go straight to
        the workers."""
        config, opts = self.config, self.options
        assert config is not None and opts is not None
        by_node: dict[str, list[int]] = {}
        for slot in slots:
            by_node.setdefault(slot.node.node_id, []).append(slot.rank)
        if opts.relay_min_nodes == 0 or len(by_node) < opts.relay_min_nodes:
            return None
        if not _relay_class:
            # Each call in flight is one coroutine of the relay: allow as many as a driver
            # pipelines (Ray's default for async actors is 1000).
            _relay_class.append(
                ray.remote(num_cpus=0, max_restarts=0, max_concurrency=100_000)(NodeRelay)
            )
        group = workers.group
        rec = recorder()
        traced = rec is not None and rec.role == "driver"  # relays then note trace links
        ranks_by_node = list(by_node.values())
        fanout = min(opts.relay_fanout, len(ranks_by_node))
        relays: list[Any] = [None] * len(ranks_by_node)
        # A branch's first relay is given the others' handles: they are started first.
        for n in sorted(range(len(ranks_by_node)), key=lambda n: n % fanout == 0):
            ranks = ranks_by_node[n]
            first = slots[ranks[0]]
            peers = relays[n + 1 : n + fanout] if n % fanout == 0 and fanout > 1 else []
            relays[n] = (
                _relay_class[0]
                .options(
                    name=f"{config.name}:{group.name}:relay:{instance}:{n}",
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        first.pg, placement_group_bundle_index=first.bundle_index
                    ),
                )
                .remote([workers.handles[r] for r in ranks], traced, peers)
            )
        return Route(relays, ranks_by_node, fanout)

    def _take_route(self, workers: RayWorkerGroup, route: Route | None, timeout: float) -> None:
        """Once the relays answer, `workers`' calls go through them (its earlier tasks, the
        start-up, have finished: nothing sent directly can be overtaken)."""
        if route is None:
            return
        what = f"the per-node relays of group {workers.group.name!r} to start"
        with waiting_for(what):
            try:
                ray.get([r._tw_ready.remote() for r in route.relays], timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise CallTimeoutError(f"{what}: not within {timeout:g}s") from None
        workers.route = route
        register(route, workers.handles)

    def _publish_health(self, state: Any) -> None:
        """Write a group's health where `twinkle doctor --ray` reads it (`health_board.py`)."""
        if self.config is not None and ray.is_initialized():
            health_board.publish(self.config.name, state)

    def _host(self, hosts: Hosts, workers: RayWorkerGroup, cls, args, kwargs, slot: int) -> None:
        """Record an object hosted by `hosts`, and route its deaths to the restarter."""
        hosts.members.append(Member(workers, cls, args, kwargs, slot))
        workers.hosts = hosts
        restarter, rerouter = self.restarter, self.rerouter
        workers.restarter = lambda cause: restarter.died(hosts, cause)
        workers.rerouter = lambda route: rerouter.relay_died(hosts, route)

    def rebuild(self, hosts: Hosts, generation: int) -> None:
        """Build `hosts`' actors again as `generation` (`restarts.Restarter`): new processes on
        the same placement, every hosted object's constructor replayed with its original
        arguments in slot order, then `on_restart(generation)` where an object defines it."""
        config, opts, resources = self.config, self.options, self.resources
        assert config is not None and opts is not None and resources is not None
        members = hosts.members
        first = members[0]
        group = first.workers.group
        # A restart reuses the group's placement groups: they must still stand, and an actor
        # that cannot start in a bundle already held means its node is gone (a node killed
        # without warning still looks alive for ~15 s): its start is bounded by
        # placement_timeout; the user's constructor keeps start_timeout.
        resources.check_standing(group.name, hosts.slots)
        handles = self._spawn(
            hosts.hosting, first.cls, group, hosts.slots, f"{hosts.instance}.{generation}"
        )
        old, hosts.route = hosts.route, None
        if old is not None:
            unregister(first.workers.handles)
            old.kill()
        for member in members:
            member.workers.route = None  # the rebuild's own tasks go straight to the actors
            member.workers.restarts = generation
            member.workers.handles = handles
            member.workers.tag = f"{group.name}:{member.cls.__name__}:{hosts.instance}.{generation}"
        route = self._relays(first.workers, hosts.slots, f"{hosts.instance}.{generation}")
        try:
            timeout = opts.start_timeout
            self._start(
                first.workers,
                hosts.slots,
                first.cls,
                first.args,
                first.kwargs,
                config,
                timeout,
                min(timeout, opts.placement_timeout),
            )
            for member in members[1:]:
                member.workers.placements = first.workers.placements  # the same processes
                self._construct_more(hosts, member.workers, member.cls, member.args, member.kwargs)
            self._reform_collectives(hosts, generation)
            self._on_restart(hosts, generation)
            self._take_route(first.workers, route, timeout)
            hosts.route = route
            for member in members:
                member.workers.route = route
            if route is not None:
                self.rerouter.watch(hosts, route)
        except BaseException:
            if route is not None:
                route.kill()
            for handle in handles:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:
                    pass
            raise

    def _on_restart(self, hosts: Hosts, generation: int) -> None:
        """Run `on_restart(generation)` on every rank of every hosted object defining it."""
        opts = self.options
        assert opts is not None
        for member in hosts.members:
            if not callable(getattr(member.cls, "on_restart", None)):
                continue
            workers = member.workers
            ranks = list(range(workers.size))
            refs = [
                handle._tw_call.remote(call_key(member.slot, "on_restart", False), generation)
                for handle in workers.handles
            ]
            pending = RayPendingCall(workers, "on_restart", ranks, refs, generation)
            what = f"{workers.class_name}.on_restart({generation}) on group {workers.group.name!r}"
            with waiting_for(what):
                _raise_first(pending, opts.start_timeout, "bring itself up to date (on_restart)")

    def _colocate(
        self,
        hosts: Hosts,
        cls: type,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        args: tuple,
        kwargs: dict,
        instance: int,
    ) -> RayWorkerGroup:
        """Build another object in the actors of the group's first one (its next slot): its
        `__init__` runs there, seeded as a fresh worker; no process starts."""
        config, opts = self.config, self.options
        assert config is not None and opts is not None
        first = hosts.first
        slot = hosts.take_slot()
        workers = RayWorkerGroup(
            group,
            device_mesh,
            cls.__name__,
            first.handles,
            first.placements,
            config.name,
            restartable=first.restartable,
            direct_transport=first.direct_transport,
            slot=slot,
            send_lock=first._send_lock,
        )
        workers.restarts = first.restarts
        workers.health = first.health
        workers.restart_wait = first.restart_wait
        workers.tag = f"{group.name}:{cls.__name__}:{hosts.instance}.{first.restarts}"
        workers.route = hosts.route
        self._construct_more(hosts, workers, cls, args, kwargs)
        self._host(hosts, workers, cls, args, kwargs, slot)
        self.worker_groups.append(workers)
        return workers

    def _construct_more(self, hosts: Hosts, workers: RayWorkerGroup, cls, args, kwargs) -> None:
        """Build `cls(*args, **kwargs)` in slot `workers.slot` of every actor of `hosts`."""
        config, opts = self.config, self.options
        assert config is not None and opts is not None
        ranks = list(range(workers.size))
        calls = [WorkerCall(r, args, kwargs) for r in ranks]
        with checked_arguments(workers.class_name, "__init__", calls):
            shipped = ship_all(calls)
        per_rank = [
            (
                (
                    workers.slot,
                    self._context(workers, hosts.slots[r]),
                    config.seed,
                    config.full_determinism,
                    cls,
                    *a,
                ),
                k,
            )
            for r, (a, k) in enumerate(shipped)
        ]
        route = workers.route
        if route is not None:  # after the calls of the objects already there
            with workers._send_lock:
                refs = route.send("_tw_construct_more", ranks, per_rank)
        else:
            refs = [
                handle._tw_construct_more.remote(*a, **k)
                for handle, (a, k) in zip(workers.handles, per_rank, strict=True)
            ]
        construct = RayPendingCall(workers, "__init__", ranks, refs, workers.restarts)
        group = workers.group
        what = f"group {group.name!r} ({cls.__name__} in the group's {workers.size} actors)"
        with waiting_for(f"{cls.__name__}.__init__ on every actor of {what}"):
            _raise_first(construct, opts.start_timeout, "construct")

    def _spawn(
        self, hosting: Any, cls: type, group: DeviceGroup, slots: list, instance: str
    ) -> list[Any]:
        """One actor per slot, each with its environment; returns the handles at once."""
        config = self.config
        assert config is not None
        noset = tuple(self.noset)
        handles = []
        for slot in slots:
            env = {
                **self.passthrough_env,
                **slot.visible_env,
                "RANK": str(slot.rank),
                "WORLD_SIZE": str(slot.world_size),
                "LOCAL_RANK": str(slot.local_rank),
                "LOCAL_WORLD_SIZE": str(slot.local_world_size),
                "TWINKLE_RUN_NAME": config.name,
                "TWINKLE_GROUP": group.name,
                "TWINKLE_WORKER_GROUP": f"{group.name}:{cls.__name__}:{instance}",
            }
            boot = ActorBoot(
                group=group.name,
                class_name=cls.__name__,
                rank=slot.rank,
                expected_node=slot.node.node_id,
                device_type=group.device_type,
                devices=slot.devices,
                env=env,
                noset_env=noset,
            )
            options: dict[str, Any] = {
                "name": f"{config.name}:{group.name}:{cls.__name__}:{instance}:{slot.rank}",
                **ray_request(slot.resources),
                "max_restarts": 0,
                "max_task_retries": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    slot.pg, placement_group_bundle_index=slot.bundle_index
                ),
            }
            handles.append(hosting.options(**options).remote(boot))
        return handles

    def _start(
        self, workers, slots, cls, args, kwargs, config, timeout, hello_timeout=None
    ) -> None:
        """Check every actor landed as planned, then build the user's object in each.

        The whole start is bounded by `timeout`; the actors' coming up (before the user's
        constructor runs) by `hello_timeout` when given.
        """
        deadline = time.monotonic() + timeout
        handles = workers.handles
        ranks = list(range(len(slots)))
        generation = workers.restarts
        hello = RayPendingCall(
            workers,
            "__init__ (start-up)",
            ranks,
            [h._tw_hello.remote() for h in handles],
            generation,
        )
        # Queued right behind each actor's check, so the constructors start without another
        # round trip: rank 0's free port reaches every constructor as an object ref.
        master = handles[0]._tw_free_port.remote()
        calls = [WorkerCall(r, args, kwargs) for r in ranks]
        with checked_arguments(workers.class_name, "__init__", calls):
            refs = self._construct(workers, slots, cls, calls, config, master)
        construct = RayPendingCall(workers, "__init__", ranks, refs, generation)
        what = f"group {workers.group.name!r} ({workers.class_name}, {len(ranks)} actors)"
        try:
            with waiting_for(f"the actors of {what} to start"):
                started = _raise_first(hello, min(timeout, hello_timeout or timeout), "start")
            # Each rank's process, for get_device_placement(detail=True) (and whoever must
            # find a worker to kill it).
            workers.placements = [
                dataclasses.replace(p, process=f"pid {info['pid']}")
                for p, info in zip(workers.placements, started, strict=True)
            ]
        except CallTimeoutError as exc:
            if hello_timeout is None or hello_timeout >= timeout:
                raise
            raise ClusterResourceError(
                f"the actors of group {workers.group.name!r} ({workers.class_name}) did not "
                f"start within placement_timeout={hello_timeout:g}s in the bundles the run "
                f"already holds, so their node is most likely gone ({exc})"
            ) from None
        with waiting_for(f"{workers.class_name}.__init__ on every actor of {what}"):
            _raise_first(construct, max(1.0, deadline - time.monotonic()), "construct")

    def _construct(self, workers, slots, cls, calls, config, master) -> list[Any]:
        """Queue the user's constructor on every actor (its arguments shipped once)."""
        shipped = ship_all(calls)
        refs = []
        for slot, handle, (a, k) in zip(slots, workers.handles, shipped, strict=True):
            ctx = self._context(workers, slot)
            refs.append(
                handle._tw_construct.remote(
                    master, ctx, config.seed, config.full_determinism, cls, *a, **k
                )
            )
        return refs

    def _context(self, workers: RayWorkerGroup, slot: Any) -> WorkerContext:
        """The worker context of `workers`' rank `slot.rank` (a `resources.WorkerSlot`)."""
        return WorkerContext(
            rank=slot.rank,
            world_size=slot.world_size,
            local_rank=slot.local_rank,
            local_world_size=slot.local_world_size,
            group_name=workers.group.name,
            device_mesh=workers.device_mesh,
            node_id=slot.node.label,
            device_type=workers.group.device_type,
            # As torch sees them: visibility is narrowed to the worker's own devices, so
            # they are 0..k-1 (the physical ids are in the placements and the env).
            device_ids=(
                tuple(range(len(slot.devices)))
                if not workers.group.is_cpu
                else workers.placements[slot.rank].devices
            ),
            mode=self.name,
            generation=workers.restarts,
        )

    # ------------------------------------------------------------------ collective groups
    def create_collective_group(self, group, workers) -> None:
        """A separate torch.distributed world over the member actors (`collective.py`)."""
        for w in workers:
            if not isinstance(w, RayWorkerGroup):
                raise ConfigurationError(
                    f"collective_group({group.name!r}): {w.class_name} does not belong to this "
                    "Ray run"
                )
        handles = ray_collective.create(group, workers)
        self.collectives[group.name] = FormedCollective(group, list(workers), handles)

    def _reform_collectives(self, hosts: Hosts, generation: int) -> None:
        """Form again, over the new actors, every collective group `hosts`' objects belong to
        (after the constructor replay, before `on_restart`, so it can use them). The surviving
        members leave the broken world first (queued behind their running calls). A group
        whose other members are torn down for good stays broken; one whose other members
        restart too is formed by whichever rebuild finishes last."""
        with self._reform_lock:
            hosts.rebuilt = True
            due = [
                formed
                for formed in self.collectives.values()
                if any(w.hosts is hosts for w in formed.workers)
                and all(_up(w) for w in formed.workers)
            ]
        for formed in due:
            name = formed.spec.name
            leaving = []
            for handle, workers in zip(formed.handles, formed.member_workers(), strict=True):
                if workers.hosts is not hosts:  # a survivor: it leaves the broken world first
                    try:
                        leaving.append(remote_on(handle, "_tw_apply", ray_collective.leave, name))
                    except Exception:
                        pass
            if leaving:
                # A survivor still in a collective call of the broken world runs its leave (and
                # then its join) only once that call gives up, after at most the group's
                # timeout: wait for the leaves, so that the new world's rendezvous, bounded by
                # the same timeout, starts with every member free to join (else a survivor
                # freed late misses it, and each later attempt queues behind the last).
                with waiting_for(f"the survivors of collective group {name!r} to leave it"):
                    ray.wait(
                        leaving,
                        num_returns=len(leaving),
                        timeout=formed.spec.timeout + LEAVE_MARGIN_S,
                        fetch_local=False,
                    )
            what = f"collective group {name!r} formed again for group {hosts.group.name!r}"
            with waiting_for(what):
                formed.handles = ray_collective.create(formed.spec, formed.workers, up=_up)
            log.info("twinkle: %s (generation %d)", what, generation)

    # ------------------------------------------------------------------ facts
    def gather_trace(self, recorder: Any) -> None:
        """Every actor's trace events, merged with its clock offset (tracing.py)."""
        ray_tracing.gather(recorder, self)

    def worker_stacks(self, workers: Any, timeout: float) -> list[tuple[str, str]]:
        """Every actor's stacks through its probe, answered while it runs (tracing.py)."""
        return ray_tracing.worker_stacks(self, workers, timeout)

    def describe(self) -> dict[str, Any]:
        if not ray.is_initialized():
            return {"ray": "not connected"}
        how = "embedded" if self.connection.started_cluster else "connected"
        nodes = len(self.resources.nodes) if self.resources is not None else 0
        return {"ray": f"{self.connection.address} ({how})", "nodes": nodes}


@dataclasses.dataclass
class FormedCollective:
    """A collective group of the run: its spec, its members' worker groups (in rank order)
    and the member actors that joined it (formed again when a member's group restarts)."""

    spec: Any
    workers: list[RayWorkerGroup]
    handles: list[Any]

    def member_workers(self) -> list[RayWorkerGroup]:
        """The worker group of each member, in member order (one entry per handle)."""
        return [w for w in self.workers for _ in range(w.size)]


def _up(workers: RayWorkerGroup) -> bool:
    """Whether `workers`' actors can join a collective group: alive, or rebuilt by a restart
    that has not finished yet (its constructors ran; the group takes calls after it)."""
    hosts = workers.hosts
    return workers.torn_down is None or (hosts is not None and hosts.rebuilt)


def _raise_first(pending: RayPendingCall, timeout: float, what: str) -> list[Any]:
    """Wait for a start-up step (its results); raise the lowest failing rank's own exception,
    with where."""
    try:
        return pending.wait(timeout)
    except WorkersFailedError as errors:
        first = errors.failures[0]
        exc = first.exception
        exc.add_note(
            f"twinkle: {pending.workers.class_name} failed to {what} in group "
            f"{pending.workers.group.name!r} on rank {first.rank} node {first.node or '?'}",
        )
        raise exc from None

"""Mode `local`: the driver script runs in every process of a torchrun job.

`torchrun --nproc_per_node=N train.py` starts N copies of the script; `initialize(mode='local')`
in each joins them. Every group is colocated on the torchrun world (a group of k workers lives on
ranks 0..k-1), each process holds at most one worker of each remote class, and the outcome of
every call is exchanged over a private gloo group so all processes collect the same value as the
Ray driver would. Without torchrun's variables the script runs as one process (world size 1).
"""

from __future__ import annotations

import copy
import datetime
import logging
import socket
from typing import Any

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    TwinkleError,
    WorkerContext,
    WorkerDiedError,
)
from twinkle_core.plugin import (
    AcceleratorPlatform,
    ExecutionBackend,
    WorkerGroup,
    WorkerPlacement,
    WorkerState,
    detect_platform,
    get_platform,
    worker_failure,
)

from .calls import portable_failure
from .channel import ChannelError, ControlChannel
from .distributed import DEFAULT_TIMEOUT_S, as_timeout, init_distributed
from .env import TorchrunEnv
from .signals import AlertFlushOnTerm
from .workers import LocalWorkerGroup

log = logging.getLogger("twinkle")

# How many runs this process started in mode 'local'. Every process of a job starts them in the
# same order, so (run name, count) names a run's keys in the shared store alike everywhere.
_runs_started = 0

#: Options of `initialize(mode='local', ...)` and their defaults.
DEFAULT_OPTIONS: dict[str, Any] = {
    # Seconds a twinkle call waits for the other processes before the job is declared broken
    # (the timeout of twinkle's own gloo group).
    "timeout": DEFAULT_TIMEOUT_S,
    # Timeout of the default process group, when twinkle creates it (start-up included).
    "dist_timeout": DEFAULT_TIMEOUT_S,
    # Copy arguments and results as a real transport would (like mode 'inprocess').
    "isolate": True,
    # torch.distributed backend of the default group; None: the platform's (nccl/hccl/gloo).
    "dist_backend": None,
    # Seconds the other processes wait at shutdown for the elected one to send its alerts.
    "notify_wait": 30.0,
}


class LocalBackend(ExecutionBackend):
    """Mode `local` (alias `torchrun`): one process per device, all running the driver script."""

    name = "local"

    def __init__(self) -> None:
        super().__init__()
        self.env = TorchrunEnv()
        self.channel = ControlChannel(1, 0)
        self.platform: AcceleratorPlatform | None = None
        self.node = socket.gethostname()
        self.nodes: list[str] = [self.node]
        self.isolate = True
        self.broken: BaseException | None = None
        self._broken_at = ""
        self._sequence = 0
        self._owns_default_group = False
        self._control_group: Any = None
        self._claims: list[tuple[str, bool]] = []
        self._notify_wait = float(DEFAULT_OPTIONS["notify_wait"])
        self._on_term: AlertFlushOnTerm | None = None
        self._closed = False

    # ----------------------------------------------------------------- start
    def initialize(self, config) -> None:
        super().initialize(config)
        options = self._options(config.backend_options)
        self.isolate = options["isolate"]
        self._notify_wait = options["notify_wait"]
        self.env = env = TorchrunEnv.detect()
        self.platform = platform = detect_platform()
        self._plan(config, env, platform)
        try:
            if env.launched:
                self._start_distributed(
                    platform, options["dist_backend"], options["dist_timeout"], options["timeout"]
                )
            elif platform.device_type != "cpu":
                platform.set_device(env.local_rank)
            self._agree(config)
            if env.launched:
                self._on_term = AlertFlushOnTerm(self._flush_alerts, self._notify_wait)
                self._on_term.install()
        except BaseException:
            self.shutdown()
            raise

    def _options(self, given: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"initialize(mode='local') got unknown options {unknown}; the local backend "
                f"accepts: {', '.join(DEFAULT_OPTIONS)}"
            )
        options = {**DEFAULT_OPTIONS, **given}
        for key in ("timeout", "dist_timeout"):
            options[key] = as_timeout(options[key], f"initialize(mode='local', {key}=...)")
        options["notify_wait"] = as_timeout(
            options["notify_wait"], "initialize(mode='local', notify_wait=...)"
        ).total_seconds()
        if not isinstance(options["isolate"], bool):
            raise ConfigurationError(
                f"initialize(mode='local', isolate=...) must be True or False, "
                f"got {options['isolate']!r}"
            )
        backend = options["dist_backend"]
        if backend is not None and (not isinstance(backend, str) or not backend):
            raise ConfigurationError(
                "initialize(mode='local', dist_backend=...) must be a torch.distributed backend "
                f"name such as 'gloo' or 'nccl', or None for the platform's; got {backend!r}"
            )
        return options

    def _plan(self, config, env: TorchrunEnv, platform: AcceleratorPlatform) -> None:
        """Default group and mesh, and every check that can fail before any process waits."""
        world = env.world_size
        how = (
            f"the torchrun world has {world} process(es)"
            if env.launched
            else "this process was not started by torchrun, so the world is this one process"
        )
        fix = "start the script with `torchrun --nproc_per_node=N script.py` for a larger N"
        if config.nproc_per_node is not None and config.nproc_per_node != env.local_world_size:
            raise ConfigurationError(
                f"initialize(nproc_per_node={config.nproc_per_node}) but {how} "
                f"({env.local_world_size} on this node); in mode 'local' torchrun decides the "
                f"number of processes: pass the same --nproc_per_node to torchrun, or drop "
                f"nproc_per_node"
            )
        mesh = config.global_device_mesh
        if mesh is not None and mesh.world_size > world:
            raise ConfigurationError(
                f"initialize(global_device_mesh={mesh!r}) needs {mesh.world_size} workers but "
                f"{how}; use a mesh of at most {world} ranks or {fix}"
            )
        if not config.groups:
            size = mesh.world_size if mesh is not None else world
            config.groups = {"default": DeviceGroup("default", size, platform.device_type)}
            if mesh is None:
                config.global_device_mesh = DeviceMesh.from_sizes(dp_size=world)
        for group in config.groups.values():
            if group.num_workers > world:
                raise ConfigurationError(
                    f"DeviceGroup {group.name!r} has {group.num_workers} workers but {how}; in "
                    f"mode 'local' a group of k workers runs on ranks 0..k-1 of the torchrun "
                    f"world: use at most {world} workers or {fix}"
                )
            if group.device_type != "cpu":
                group_platform = get_platform(group.device_type)
                if not group_platform.is_available():
                    raise ConfigurationError(
                        f"DeviceGroup {group.name!r} asks for device_type "
                        f"{group.device_type!r}, but this process sees no such device (detected "
                        f"platform: {platform.device_type!r}); use device_type="
                        f"{platform.device_type!r} or run where the devices are"
                    )

    def _start_distributed(
        self,
        platform: AcceleratorPlatform,
        dist_backend: str | None,
        dist_timeout: datetime.timedelta,
        timeout: datetime.timedelta,
    ) -> None:
        import torch.distributed as dist

        env = self.env
        if dist.is_initialized():
            if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
                raise ConfigurationError(
                    f"torch.distributed is already initialized with world size "
                    f"{dist.get_world_size()} and rank {dist.get_rank()}, but torchrun's "
                    f"environment says {env.world_size} and {env.rank}"
                )
            if platform.device_type != "cpu":
                platform.set_device(env.local_rank)
        else:
            init_distributed(
                platform, backend=dist_backend, timeout=dist_timeout, local_rank=env.local_rank
            )
            self._owns_default_group = True
        # twinkle's own exchanges never share a group with the user's collectives.
        self._control_group = dist.new_group(backend="gloo", timeout=timeout)
        store = dist.distributed_c10d._get_default_store()
        self.channel = ControlChannel(env.world_size, env.rank, self._control_group, store)

    def _agree(self, config) -> None:
        """Exchange node names; check every process was initialized the same way; share the
        run name (rank 0's) so alerts and logs name the run alike on every process."""
        fingerprint = (
            config.seed,
            config.full_determinism,
            config.lazy_collect,
            [(g.name, g.num_workers, g.device_type) for g in config.groups.values()],
            None if config.global_device_mesh is None else repr(config.global_device_mesh),
        )
        hello = self.channel.all_gather((self.node, config.name, fingerprint))
        for rank, (_, _, theirs) in enumerate(hello):
            if theirs != fingerprint:
                raise ConfigurationError(
                    f"mode 'local': process {rank} called initialize() differently from process "
                    f"{self.env.rank} ({theirs} vs {fingerprint}); every process of the job must "
                    "run the same script with the same seed, groups and mesh"
                )
        global _runs_started
        _runs_started += 1
        self.nodes = [h[0] for h in hello]
        config.name = hello[0][1]
        self.channel.namespace = f"twinkle/{config.name}/{_runs_started}"

    # ----------------------------------------------------------------- workers
    def node_of(self, rank: int) -> str | None:
        return self.nodes[rank] if 0 <= rank < len(self.nodes) else None

    def next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def check_same_call(self, gathered: list, seq: int, label: str, n_calls: int) -> None:
        """Raise on every process when the processes are not at the same twinkle call."""
        seen = [(g[0], g[1], g[2]) for g in gathered]
        if any(s != (seq, label, n_calls) for s in seen):
            where = "; ".join(
                f"process {r}: call #{s[0]} {s[1]} on {s[2]} worker(s)" for r, s in enumerate(seen)
            )
            raise TwinkleError(
                f"mode 'local': the torchrun processes diverged ({where}); every process must "
                "make the same remote calls in the same order, so do not call remote methods "
                "inside `if rank == ...` blocks of the driver script"
            )

    def mark_broken(self, exc: BaseException, label: str) -> None:
        """Remember the first failed exchange: later calls fail at once instead of waiting."""
        if self.broken is None:
            self.broken = exc
            self._broken_at = label

    def broken_message(self) -> str:
        return (
            f"a torchrun process died or stopped answering during {self._broken_at}; twinkle's "
            "exchanges cannot continue (see that process's own output for the cause)"
        )

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
        env = self.env
        if self.broken is not None:
            raise WorkerDiedError(self.broken_message())
        if num_workers > env.world_size:
            raise ConfigurationError(
                f"{cls.__name__} needs {num_workers} workers on group {group.name!r} but the "
                f"torchrun world has {env.world_size} process(es)"
            )
        placements = [
            WorkerPlacement(r, self.node_of(r), self._devices(group, r), group.device_type)
            for r in range(num_workers)
        ]
        instance, state, failure = None, None, None
        if env.rank < num_workers:
            context = self._context(group, device_mesh, num_workers)
            instance, state, failure = self._construct(cls, args, kwargs, context)
        self._agree_on_construction(cls, group, failure)
        return LocalWorkerGroup(
            self, group, device_mesh, cls, num_workers, placements, instance, state
        )

    def _devices(self, group: DeviceGroup, rank: int) -> tuple[int, ...]:
        if group.device_type == "cpu":
            return tuple(group.worker_ranks(rank))
        # One process per device: a worker uses its process's local device.
        return (rank % self.env.local_world_size,)

    def _context(self, group: DeviceGroup, mesh: DeviceMesh, num_workers: int) -> WorkerContext:
        env = self.env
        same_node = sum(1 for r in range(num_workers) if self.node_of(r) == self.node)
        return WorkerContext(
            rank=env.rank,
            world_size=num_workers,
            local_rank=env.local_rank,
            local_world_size=max(same_node, 1),
            group_name=group.name,
            device_mesh=mesh,
            node_id=self.node,
            device_type=group.device_type,
            device_ids=self._devices(group, env.rank),
        )

    def _construct(self, cls: type, args: tuple, kwargs: dict, context: WorkerContext):
        """Build this process's instance from the run's seed, with its own generators."""
        config = self.config
        a, k = copy.deepcopy((args, kwargs)) if self.isolate else (args, kwargs)
        try:
            instance, state = WorkerState.construct(
                cls, a, k, context, seed=config.seed, full_determinism=config.full_determinism
            )
        except Exception as exc:
            return None, None, worker_failure(context.rank, exc, self.node)
        return instance, state, None

    def _agree_on_construction(self, cls: type, group: DeviceGroup, failure) -> None:
        """Every process learns whether every instance was built, and raises the same error."""
        label = f"{cls.__name__}(remote_group={group.name!r})"
        entry = None if failure is None else portable_failure(failure)
        if not self.channel.distributed:
            gathered = [(0, label, 0, {0: entry} if entry else {})]
        else:
            seq = self.next_sequence()
            try:
                gathered = self.channel.all_gather((seq, label, 0, {0: entry} if entry else {}))
            except ChannelError as exc:
                self.mark_broken(exc, label)
                raise WorkerDiedError(self.broken_message()) from exc
            self.check_same_call(gathered, seq, label, 0)
        failures = [e for g in gathered for e in g[3].values() if e is not None]
        if failures:
            first = min(failures, key=lambda f: f.rank)
            own = failure is not None and failure.rank == first.rank
            exc = failure.exception if own else first.exception
            note = f"twinkle: constructing {label} failed on rank {first.rank}"
            if first.node:
                note += f" (node {first.node})"
            if not own and first.traceback:
                note += "\n" + first.traceback.rstrip()
            _add_note(exc, note)
            raise exc

    # ----------------------------------------------------------------- failures
    def claim_notification(self, key: str) -> bool:
        """One process of the whole job sends each alert: elected through the store."""
        try:
            won = self.channel.claim(key)
        except Exception as exc:  # the store is gone (launcher died): rank 0 speaks
            log.warning("twinkle: could not elect the notifying process: %s", exc)
            won = self.env.rank == 0
        self._claims.append((key, won))
        return won

    def _flush_alerts(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until this process's queued alerts are sent."""
        return self.flush_alerts(timeout)

    def _settle_notifications(self) -> None:
        """Keep every process alive until the elected ones have sent their alerts.

        torchrun stops the other processes as soon as one exits with an error; without this
        hand-shake the process that won the election could be killed before sending.
        """
        if not self._claims:
            return
        won = [k for k, w in self._claims if w]
        lost = [k for k, w in self._claims if not w]
        if won:
            if not self._flush_alerts(self._notify_wait):
                log.warning("twinkle: alerts still unsent after %.0fs", self._notify_wait)
            for key in won:
                try:
                    self.channel.mark_done(key)
                except Exception as exc:
                    log.warning("twinkle: could not tell the other processes: %s", exc)
        if lost:
            self.channel.wait_done(lost, self._notify_wait)
        self._claims = []

    # ----------------------------------------------------------------- stop
    @property
    def closed(self) -> bool:
        """Whether `shutdown()` ran: workers and process groups of this run are gone."""
        return self._closed

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._settle_notifications()
        finally:
            if self._on_term is not None:
                self._on_term.uninstall()
            self._destroy_groups()

    def _destroy_groups(self) -> None:
        """Destroy the process groups this backend created, and only those."""
        if self._control_group is None and not self._owns_default_group:
            return
        import torch.distributed as dist

        group, self._control_group = self._control_group, None
        self.channel = ControlChannel(1, 0)
        try:
            if group is not None and dist.is_initialized():
                dist.destroy_process_group(group)
        except Exception as exc:
            log.warning("twinkle: destroying the control group failed: %s", exc)
        if self._owns_default_group:
            self._owns_default_group = False
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception as exc:
                log.warning("twinkle: destroying the default group failed: %s", exc)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "world": self.env.world_size,
            "rank": self.env.rank,
            "node": self.node,
        }
        if self.platform is not None:
            out["device"] = self.platform.device_type
        return out


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]

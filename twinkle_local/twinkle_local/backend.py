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
import threading
import time
from collections import deque
from typing import Any

from twinkle_core import (
    CallTimeoutError,
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    PluginNotFoundError,
    WorkerContext,
    WorkerDiedError,
)
from twinkle_core.plugin import (
    AcceleratorPlatform,
    ExecutionBackend,
    WorkerFailure,
    WorkerGroup,
    WorkerPlacement,
    WorkerState,
    detect_platform,
    get_platform,
    worker_failure,
)

from . import collective as local_collective
from .calls import LocalPendingCall
from .callsite import driver_call_site
from .channel import ChannelError, ControlChannel
from .distributed import DEFAULT_TIMEOUT_S, as_timeout, init_distributed
from .env import TorchrunEnv
from .exchange import KIND_CONSTRUCT, CallInfo, Exchange
from .rng import RngSwitch
from .signals import AlertFlushOnTerm
from .tracing import start as start_tracing
from .watchdog import Watchdog
from .workers import LocalWorkerGroup

log = logging.getLogger("twinkle")

#: Seconds a process whose wait timed out gives the others to report where they are.
STACK_WAIT_S = 2.0


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
    # Each call's first exchange over Unix sockets when every process runs on this machine
    # (about 10x faster than gloo for these small messages); False: always over gloo.
    "node_sockets": True,
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
        self._local_worlds: list[int] = [1]
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
        self._timeout_s = DEFAULT_TIMEOUT_S
        self.run_name = ""
        #: One call at a time in this process: its workers' run and the start of its exchange
        #: (re-entrant: a worker's method may call another object of the same process).
        self.lock = threading.RLock()
        #: Exchanges started and not finished yet, in start order (finished in that order).
        self._queue: deque[Exchange] = deque()
        #: Structures of sum/mean results every process knows, by `numeric.spec_key`.
        self.spec_cache: dict[int, Any] = {}
        self.rng: RngSwitch | None = None
        self.watchdog = Watchdog(self)
        #: Subgroups of this run's collective groups (destroyed at shutdown).
        self._collective_links: list[Any] = []
        #: Groups of the transports' torch.distributed backends other than gloo (which uses
        #: the control group), by backend name: made on first use, destroyed at shutdown.
        self._transport_groups: dict[str, Any] = {}
        #: Tensors handed to the next call's arguments without a copy (`share`), by id.
        self._shared: dict[int, Any] = {}

    # ----------------------------------------------------------------- start
    def initialize(self, config) -> None:
        super().initialize(config)
        options = self._options(config.backend_options)
        self.isolate = options["isolate"]
        self._notify_wait = options["notify_wait"]
        self._timeout_s = options["timeout"].total_seconds()
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
            if options["node_sockets"] and self._one_machine():
                self.channel.use_node_sockets(self._timeout_s)
            start_tracing(self)  # a traced run: clock offsets to rank 0 (tracing.py)
            self.run_name = config.name
            if env.launched:
                self._on_term = AlertFlushOnTerm(self._flush_alerts, self._notify_wait)
                self._on_term.install()
            self.rng = RngSwitch()
            self.watchdog.start()
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
        for key in ("isolate", "node_sockets"):
            if not isinstance(options[key], bool):
                raise ConfigurationError(
                    f"initialize(mode='local', {key}=...) must be True or False, "
                    f"got {options[key]!r}"
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
                self._check_devices(group, env, platform)

    @staticmethod
    def _check_devices(group: DeviceGroup, env: TorchrunEnv, platform: AcceleratorPlatform) -> None:
        """A group's device type must name a platform with a device for each of its workers
        in this process (one process per device: worker r uses local device LOCAL_RANK)."""
        try:
            group_platform = get_platform(group.device_type)
        except PluginNotFoundError as exc:
            raise ConfigurationError(
                f"DeviceGroup {group.name!r} asks for device_type {group.device_type!r}, for "
                f"which no platform is registered in mode 'local'; use device_type="
                f"{platform.device_type!r} (detected here). {exc}"
            ) from None
        if not group_platform.is_available():
            raise ConfigurationError(
                f"DeviceGroup {group.name!r} asks for device_type "
                f"{group.device_type!r}, but this process sees no such device (detected "
                f"platform: {platform.device_type!r}); use device_type="
                f"{platform.device_type!r} or run where the devices are"
            )
        count = group_platform.device_count()
        if env.rank < group.num_workers and env.local_rank >= count:
            raise ConfigurationError(
                f"DeviceGroup {group.name!r} puts worker rank {env.rank} on local "
                f"{group.device_type} device {env.local_rank} (LOCAL_RANK), but this node has "
                f"{count} such device(s); in mode 'local' each process uses one device: start "
                f"at most {count} process(es) per node (torchrun --nproc_per_node={count})"
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

    def _one_machine(self) -> bool:
        """Whether every process of the job runs on this machine: one host name, and (under
        torchrun) one launcher holding the whole world. Every process answers alike (from
        what `_agree` gathered)."""
        world = self.env.world_size
        return len(set(self.nodes)) == 1 and all(n == world for n in self._local_worlds)

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
        hello = self.channel.all_gather(
            (self.node, config.name, fingerprint, self.env.local_world_size)
        )
        for rank, (_, _, theirs, _) in enumerate(hello):
            if theirs != fingerprint:
                raise ConfigurationError(
                    f"mode 'local': process {rank} called initialize() differently from process "
                    f"{self.env.rank} ({theirs} vs {fingerprint}); every process of the job must "
                    "run the same script with the same seed, groups and mesh"
                )
        global _runs_started
        _runs_started += 1
        self.nodes = [h[0] for h in hello]
        self._local_worlds = [h[3] for h in hello]
        config.name = hello[0][1]
        self.channel.namespace = f"twinkle/{config.name}/{_runs_started}"

    def transport_group(self, torch_backend: str) -> Any:
        """The group a transport of `torch_backend` broadcasts over: twinkle's gloo control
        group for gloo, else a group of that backend over the whole job, made on first use.

        Called in an exchange's second step, which every process takes at the same point, so
        every process makes the new group in the same order (as `new_group` needs)."""
        if torch_backend == "gloo":
            return self.channel.group
        group = self._transport_groups.get(torch_backend)
        if group is None:
            import torch.distributed as dist

            timeout = datetime.timedelta(seconds=self._timeout_s)
            group = dist.new_group(backend=torch_backend, timeout=timeout)
            self._transport_groups[torch_backend] = group
        return group

    def share(self, value: Any) -> None:
        """The tensors in `value` (dicts, lists, tuples) go to the next call's workers as
        they are (see `LocalWorkerGroup.resolve_argument`)."""
        stack = [value]
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind in (list, tuple):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif kind.__name__ == "Tensor" and kind.__module__.startswith("torch"):
                self._shared[id(item)] = item

    def shared_memo(self) -> dict[int, Any]:
        """A `copy.deepcopy` memo that keeps the shared tensors as they are."""
        return dict(self._shared)

    def unshare(self) -> None:
        self._shared.clear()

    # ----------------------------------------------------------------- calls
    def node_of(self, rank: int) -> str | None:
        return self.nodes[rank] if 0 <= rank < len(self.nodes) else None

    def next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    @staticmethod
    def call_site() -> str:
        """The driver's line that made the current call (`file:line`, as core reports it)."""
        return driver_call_site(2)

    def enqueue(self, exchange: Exchange) -> None:
        """Remember a started exchange (lock held); a lone finished one is not kept."""
        if exchange.outcome is None:
            self._queue.append(exchange)

    def drain(self, timeout: float | None) -> None:
        """Finish every started exchange, in order (lock held), before a new call runs.

        A call runs only once the previous calls' exchanges are complete everywhere: a method
        that runs collectives of its own must never wait for a process that is still in an
        earlier call's second step. `timeout` bounds the wait for the last one (None: the
        control group's own timeout); a call that cannot be exchanged in order breaks the run.
        """
        queue = self._queue
        if not queue:
            return
        last = queue[-1]
        work = last.work
        if timeout is not None and work is not None and not work.is_completed():
            try:
                work.wait(datetime.timedelta(seconds=max(timeout, 0.001)))
            except Exception:
                pass
            if not work.is_completed():
                stacks = self.watchdog.request_stacks(STACK_WAIT_S)
                if not work.is_completed():
                    self.mark_broken(
                        CallTimeoutError(
                            f"the exchange of {last.info.describe()} did not finish within "
                            f"{timeout:g}s{self._stacks_text(stacks)}"
                        ),
                        last.info.label,
                    )
                    return
        while queue:
            queue[0].finish()
            queue.popleft()

    def wait_for(self, exchange: Exchange, timeout: float | None) -> None:
        """Wait until `exchange` is finished: at most `timeout` seconds for the other processes
        to reach it (`CallTimeoutError` naming where they are), then finish it in order."""
        work = exchange.work
        if work is not None and not work.is_completed():
            try:
                if timeout is None:
                    work.wait()  # the control group's timeout ends a lost process's wait
                else:
                    work.wait(datetime.timedelta(seconds=max(timeout, 0.001)))
            except Exception:
                pass  # a failed collective is reported by finish()
            if timeout is not None and not work.is_completed():
                error = self.timeout_error(exchange, timeout)
                if not work.is_completed():  # (the others may arrive while asked where)
                    raise error
        with self.lock:
            if exchange.outcome is not None:
                return
            while self._queue:
                head = self._queue.popleft()
                head.finish()
                if head is exchange:
                    return
            exchange.finish()

    def timeout_error(self, exchange: Exchange, timeout: float) -> CallTimeoutError:
        """The other processes did not reach `exchange` in time: where are they?"""
        exchange.timed_out = True
        stacks = self.watchdog.request_stacks(STACK_WAIT_S)
        return CallTimeoutError(
            f"did not finish within {timeout:g}s: not every torchrun process reached "
            f"{exchange.info.describe()}{self._stacks_text(stacks)}"
        )

    def _stacks_text(self, stacks: dict[int, str]) -> str:
        """The other processes' own reports of where they are, for an error message."""
        world = self.channel.world_size
        if world <= 1:
            return ""
        silent = [r for r in range(world) if r != self.env.rank and r not in stacks]
        parts = [stacks[r] for r in sorted(stacks)]
        if silent:
            parts.append(
                f"process{'es' if len(silent) > 1 else ''} {', '.join(map(str, silent))}: no "
                f"answer within {STACK_WAIT_S:g}s (dead, or stuck without releasing Python's GIL)"
            )
        return "; where the other processes are:\n" + "\n".join(parts)

    def try_finish(self, exchange: Exchange) -> bool:
        """Finish `exchange` (and those before it) if that needs no waiting; for `done()`."""
        if exchange.outcome is not None:
            return True
        if not exchange.arrived() or not self.lock.acquire(blocking=False):
            return False
        try:
            queue = self._queue
            while queue and exchange.outcome is None:
                head = queue[0]
                if not head.arrived() or (self.channel.distributed and head.needs_second_step()):
                    return False
                head.finish()
                queue.popleft()
            return exchange.outcome is not None
        finally:
            self.lock.release()

    def progress(self) -> bool:
        """Finish the exchanges every process has reached, in order (for the watchdog, which
        never waits for the lock). True while exchanges are left."""
        queue = self._queue
        if not queue:
            return False
        if queue[0].arrived() and self.lock.acquire(blocking=False):
            try:
                while queue and queue[0].arrived():
                    queue[0].finish()
                    queue.popleft()
            finally:
                self.lock.release()
        return bool(queue)

    # ----------------------------------------------------------------- broken runs
    def mark_broken(self, exc: BaseException, label: str) -> None:
        """Remember the first failed exchange: later calls fail at once instead of waiting."""
        if self.broken is not None:
            return
        detail = ""
        if isinstance(exc, ChannelError):
            if exc.timed_out:
                detail = self._stacks_text(self.watchdog.request_stacks(STACK_WAIT_S))
            else:
                detail = self._shutdown_notes()
        self.broken = exc
        self._broken_at = label
        self._broken_detail = detail

    def broken_message(self) -> str:
        return (
            f"a torchrun process died or stopped answering during {self._broken_at}; twinkle's "
            "exchanges cannot continue (see that process's own output for the cause)"
            f"{getattr(self, '_broken_detail', '')}"
        )

    def lost_outcome(
        self, info: CallInfo, ranks: list[int], exc: BaseException
    ) -> LocalPendingCall:
        """A collective broke: every surviving process reports the same WorkerDiedError."""
        self.mark_broken(exc, info.label)
        error = WorkerDiedError(self.broken_message())
        detail = f"{type(exc).__name__}: {exc}"
        me = self.env.rank
        others = sorted({r for r in ranks if r != me})
        failures = [WorkerFailure(r, error, self.node_of(r), detail) for r in others or [me]]
        return LocalPendingCall(None, failures, label=info.label)

    def _shutdown_notes(self) -> str:
        """Which other processes already shut twinkle down (an extra call on this one?)."""
        store = self.channel.store
        if store is None:
            return ""
        notes = []
        for rank in range(self.channel.world_size):
            if rank == self.env.rank:
                continue
            key = self.channel.key("shutdown", rank)
            try:
                if store.check([key]):
                    notes.append(f"process {rank} {store.get(key).decode(errors='replace')}")
            except Exception:
                return ""
        if not notes:
            return ""
        return (
            f"; {'; '.join(notes)}, while this process (rank {self.env.rank}) made call "
            f"#{self._sequence}: every process must make the same remote calls"
        )

    # ----------------------------------------------------------------- workers
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
        label = f"{cls.__name__}(remote_group={group.name!r})"
        site = self.call_site()
        instance, state, failure = None, None, None
        with self.lock:
            self.drain(None)
            if self.broken is not None:
                raise WorkerDiedError(self.broken_message())
            info = CallInfo(
                self.next_sequence(),
                KIND_CONSTRUCT,
                label,
                site,
                num_workers,
                threading.current_thread().name,
            )
            if env.rank < num_workers:
                context = self._context(group, device_mesh, num_workers)
                instance, state, failure = self._construct(cls, args, kwargs, context)
            mine = None if failure is None else (env.rank, False, failure)
            exchange = Exchange(self, info, list(range(num_workers)), mine)
            exchange.start()
            outcome = exchange.finish()
        self._raise_construction(outcome, label, failure)
        party = None
        if state is not None and self.rng is not None and self.rng.supported(state.rng_state):
            party = self.rng.party(f"{label} rank {env.rank}", state.rng_state)
        return LocalWorkerGroup(
            self, group, device_mesh, cls, num_workers, placements, instance, state, party
        )

    def create_collective_group(self, group, workers) -> None:
        """Members are workers of this job's processes (worker r in process r); processes meet
        over a new subgroup made by every process in the same order (`collective.py`)."""
        for w in workers:
            if not isinstance(w, LocalWorkerGroup) or w.backend is not self:
                raise ConfigurationError(
                    f"collective_group({group.name!r}): {w.class_name} does not belong to this run"
                )
        with self.lock:
            self.drain(None)  # every process makes the subgroup at the same point of its calls
            if self.broken is not None:
                raise WorkerDiedError(self.broken_message())
            link = local_collective.create(group, workers, self.env.rank, self.channel.distributed)
        if link is not None:
            self._collective_links.append(link)

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

    @staticmethod
    def _raise_construction(outcome: LocalPendingCall, label: str, failure) -> None:
        """Every process raises the same error when any instance could not be built."""
        if outcome.error is not None:
            raise outcome.error
        if not outcome.failures:
            return
        first = min(outcome.failures, key=lambda f: f.rank)
        if isinstance(first.exception, WorkerDiedError):
            raise first.exception
        own = failure is not None and failure.rank == first.rank
        exc = failure.exception if own else first.exception
        note = f"twinkle: constructing {label} failed on rank {first.rank}"
        if first.node:
            note += f" (node {first.node})"
        if not own and first.traceback:
            note += "\n" + first.traceback.rstrip()
        _add_note(exc, note)
        raise exc

    @property
    def owns_console(self) -> bool:
        """Only rank 0 draws the live status line: every process of the job is a driver
        writing to the same terminal. Read from the environment, as core asks before
        `initialize` has run."""
        try:
            return TorchrunEnv.detect().rank == 0
        except Exception:  # an inconsistent environment: initialize() will say so
            return False

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
            # Within the shutdown's deadline (`shutdown(timeout=...)`), as the sender's flush.
            alerts = getattr(self, "_alerts", None)
            wait = self._notify_wait if alerts is None else alerts.time_left(self._notify_wait)
            self.channel.wait_done(lost, wait)
        self._claims = []

    # ----------------------------------------------------------------- stop
    @property
    def closed(self) -> bool:
        """Whether `shutdown()` ran: workers and process groups of this run are gone."""
        return self._closed

    def shutdown(self) -> None:
        if self._closed:
            return
        try:
            self._finish_exchanges()
        finally:
            self._closed = True
            try:
                self._settle_notifications()
            finally:
                self.watchdog.stop()
                if self._on_term is not None:
                    self._on_term.uninstall()
                self._destroy_groups()

    def _finish_exchanges(self) -> None:
        """Take part in the exchanges still open (another process may be collecting them), and
        tell the others through the store where this process stopped.

        Bounded: an exchange another process never reached is waited for at most
        min(timeout, notify_wait) seconds, and not at all when a wait for it already timed out.
        """
        if self.channel.distributed and self.broken is None:
            bound = min(self._timeout_s, self._notify_wait)
            with self.lock:
                queue = self._queue
                while queue and self.broken is None:
                    head = queue[0]
                    if not head.arrived():
                        if head.timed_out:
                            break
                        deadline = time.monotonic() + bound
                        while not head.arrived() and time.monotonic() < deadline:
                            time.sleep(0.01)
                        if not head.arrived():
                            break
                    head.finish()
                    queue.popleft()
        self._queue.clear()
        store = self.channel.store
        if store is not None and self.channel.world_size > 1:
            try:
                store.set(
                    self.channel.key("shutdown", self.env.rank),
                    f"shut twinkle down after call #{self._sequence} (shutdown() from "
                    f"{self.call_site()})",
                )
            except Exception as exc:
                log.debug("twinkle: could not leave the shutdown note: %s", exc)

    def _destroy_groups(self) -> None:
        """Destroy the process groups this backend created, and only those."""
        links, self._collective_links = self._collective_links, []
        for link in links:
            link.destroy()
        transport_groups, self._transport_groups = self._transport_groups, {}
        if transport_groups:
            import torch.distributed as dist

            for name, pg in transport_groups.items():
                try:
                    if dist.is_initialized():
                        dist.destroy_process_group(pg)
                except Exception as exc:
                    log.warning("twinkle: destroying the %s transport group failed: %s", name, exc)
        if self._control_group is None and not self._owns_default_group:
            return
        import torch.distributed as dist

        group, self._control_group = self._control_group, None
        self.channel.close()
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
        if self.channel.distributed:  # how each call's first exchange travels
            out["exchange"] = "unix-sockets" if self.channel.sockets is not None else "gloo"
        return out


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]

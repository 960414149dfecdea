"""The execution backend interface: everything a mode needs, and nothing else.

Core's decorators talk only to these classes. A backend creates the workers of a remote class
(`WorkerGroup`), runs a method on chosen workers with per-worker arguments (`PendingCall`), and
tells who the current process is. Dispatch, execute and collect are done by core on top of
them, so every backend gives the same meaning to the same driver code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from .device_group import DeviceGroup
from .device_mesh import DeviceMesh

if TYPE_CHECKING:
    from .collect import Collector
    from .collective import CollectiveGroup
    from .lazy import LazyCollect
    from .runtime import RuntimeConfig


class WorkerCall(NamedTuple):
    """Run a method on worker `rank` (index within its group) with these arguments.

    Immutable, and a named tuple rather than a frozen dataclass: core makes one per worker on
    every call, and a tuple is made in half the time.
    """

    rank: int
    args: tuple
    kwargs: dict


class PreparedCall:
    """One call on its way to a `WorkerGroup`, made by core for each call and dropped with it.

    Core fills `method`, `dispatcher`, then (after dispatching) `calls`, `collector` and
    `device_mesh`. What a backend learns while core resolves the call's LazyCollect arguments
    (`WorkerGroup.resolve_argument`) it keeps in `backend_data`, and reads back in `submit`:
    state that belongs to one call travels with that call, never in a thread-local or a
    backend-wide memo, so a dispatcher that raises between the two leaves nothing behind.
    """

    __slots__ = (
        "backend_data",
        "calls",
        "collector",
        "device_mesh",
        "dispatcher",
        "method",
        "plain_args",
        "stand_ins",
    )

    def __init__(self, method: str, dispatcher: Any = None) -> None:
        self.method = method
        self.dispatcher = dispatcher
        self.calls: list[WorkerCall] = []
        self.collector: Collector | None = None
        self.device_mesh: DeviceMesh | None = None
        #: Anything the backend keeps for this call between `resolve_argument` and `submit`.
        self.backend_data: Any = None
        #: The positional arguments as the user passed them, when core found them plain data
        #: (`twinkle_core.plugin.is_plain_data`), else None: a worker call whose `args` is this
        #: very tuple (`dispatch='all'` hands every worker the same one) need not be looked
        #: at again.
        self.plain_args: tuple | None = None
        #: Whether a resolved argument holds `RankParts` (a by-reference hand-off, see
        #: `twinkle_core.handoff`): core turns those a dispatcher left whole into arrays.
        self.stand_ins = False

    def __repr__(self) -> str:
        return f"PreparedCall({self.method!r}, {len(self.calls)} worker call(s))"


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one worker runs: for `get_device_placement()`."""

    rank: int
    node: str | None = None
    devices: tuple[int, ...] = ()
    device_type: str = "cpu"
    #: The worker process hosting it, as the backend names it (`pid 4242`, `actor 1f2e3d4c`,
    #: `torchrun rank 3`): colocated objects show the same one.
    process: str | None = None


class PendingCall(ABC):
    """One method call in flight on some workers.

    Declares no instance attributes (`__slots__ = ()`), so a backend's subclass that declares
    its own slots keeps no `__dict__` per call: with thousands of calls in flight, each object
    a call keeps is one more for the garbage collector to look at and promote.
    """

    __slots__ = ()

    @abstractmethod
    def wait(self, timeout: float | None) -> list[Any]:
        """Results in the order of the calls submitted.

        Raises `twinkle_core.failures.WorkersFailedError` as soon as any worker failed (fail fast),
        and `CallTimeoutError` when `timeout` seconds pass first.
        """

    @abstractmethod
    def done(self) -> bool:
        """Whether `wait` would return or raise without blocking."""

    @classmethod
    def ask_many(cls, calls: list[PendingCall]) -> None:
        """About to ask `done()` of each of `calls` (all of this class): a backend whose
        question is a round trip may ask about all of them at once here and have `done()`
        answer from that (Ray: one `ray.wait`). `twinkle_core.wait`, `as_completed` and the
        runtime's bookkeeping call it before they go through many calls. Does nothing by
        default: `done()` then answers each on its own."""

    @classmethod
    def fetch_many(cls, calls: list[PendingCall], timeout: float | None) -> None:
        """About to collect each of `calls` (all of this class) in turn (`twinkle_core.get`):
        a backend whose fetch is a round trip may wait for all of them at once here and keep
        what it fetched, so each `wait` then returns at once (Ray: one `ray.get` of every
        call's refs, as raw Ray code gets a list). Returns when every call finished, when one
        failed (fail fast) or after `timeout` seconds, raising nothing: each call's own `wait`
        then raises its failure or its timeout. Does nothing by default."""

    def trace_links(self) -> list[str] | None:
        """The ids this call's workers record for their executions of it (e.g. Ray task
        ids), so a trace draws arrows from the call to them; None by default."""
        return None

    def succeeded(self) -> bool:
        """True when every worker is known to have finished without error, without fetching
        the results; False when unknown. The runtime then need not collect a finished call
        nobody looked at (its results may have gone to another group directly)."""
        return False

    def collect(self, collector: Collector, device_mesh: DeviceMesh, timeout: float | None) -> Any:
        """Wait and collect; backends that can reduce numbers in place may override."""
        return collector.collect(self.wait(timeout), device_mesh)


class CompletedCall(PendingCall):
    """A call that has finished: either values or failures are known."""

    def __init__(self, results: list[Any], failures: list | None = None) -> None:
        self.results = results
        self.failures = failures or []

    def wait(self, timeout: float | None) -> list[Any]:
        if self.failures:
            from .failures import WorkersFailedError

            raise WorkersFailedError(self.failures)
        return self.results

    def done(self) -> bool:
        return True

    def succeeded(self) -> bool:
        return not self.failures


class WorkerGroup(ABC):
    """The workers of one remote class instance, bound to one `DeviceGroup`.

    It travels with the driver-side object: when that object is passed into another group's
    worker, the worker submits calls through this same WorkerGroup, so it must be picklable
    on backends with several processes.
    """

    def __init__(
        self,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        class_name: str,
        size: int,
        placements: list[WorkerPlacement] | None = None,
    ) -> None:
        self.group = group
        self.device_mesh = device_mesh
        self.class_name = class_name
        self.size = size
        self.placements = placements or [WorkerPlacement(r) for r in range(size)]

    @abstractmethod
    def submit(self, call: PreparedCall) -> PendingCall:
        """Start `call.method` on each of `call.calls`' workers; must not block on their results.

        `call.collector` and `call.device_mesh` are how the results will be collected, for
        backends that exchange results eagerly or reduce them in place; `call.backend_data`
        is what this group's `resolve_argument` kept for the call.
        """

    def resolve_argument(self, value: LazyCollect, call: PreparedCall) -> Any:
        """How a LazyCollect argument of `call` is handed to this group.

        `call.dispatcher` is the call's dispatcher: a backend that hands on stand-ins for
        values not collected yet can tell whether the dispatcher will look inside them, and
        keeps what the submission needs in `call.backend_data`.

        The default hands a finished result of another object on this group (same class of
        worker group, same group, same size) on by reference (`twinkle_core.handoff`): the
        objects the producer's `PendingCall.wait` returns are placed in the argument as they
        are, which is the very object each rank returned when the backend's results are the
        workers' own objects (a backend that copies results overrides this). Anything else
        gets the LazyCollect's value.
        """
        from .handoff import by_reference

        handed = by_reference(value, self, call)
        return value() if handed is None else handed


class ExecutionBackend(ABC):
    """A mode of execution (`initialize(mode=name)`), registered by a plugin."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.config: RuntimeConfig | None = None
        #: The run's failure-alert queue (`twinkle_core.plugin.AlertQueue`), None without a
        #: notifier; given by core through `attach_alerts` when the run starts.
        self.alerts: Any = None

    def attach_alerts(self, alerts: Any) -> None:
        """Core gives the backend the run's alert queue (or None), before any call is made."""
        self.alerts = alerts

    def initialize(self, config: RuntimeConfig) -> None:
        """Prepare the mode; may add default groups to `config.groups`. Validate early."""
        self.config = config

    @abstractmethod
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
        """Create `num_workers` instances of `cls(*args, **kwargs)` on `group`, one per rank."""

    @classmethod
    def plan_placement(
        cls, groups: list[DeviceGroup], nproc_per_node: int | None
    ) -> dict[str, list[WorkerPlacement]]:
        """Where each worker of `groups` would run, without a cluster: what `twinkle
        placement --mode NAME` draws. By default the device-rank rule of `DeviceGroup`
        (`worker_node`, `worker_devices`), which both built-in backends follow; CPU workers
        (or any worker when `nproc_per_node` is None) get no node, the backend picks it. A
        backend that places differently overrides this, so the tool shows its rule."""
        out: dict[str, list[WorkerPlacement]] = {}
        for group in groups:
            placements = []
            for w in range(group.num_workers):
                if group.is_cpu or nproc_per_node is None:
                    placements.append(WorkerPlacement(w, None, (), group.device_type))
                    continue
                node = f"node{group.worker_node(w, nproc_per_node)}"
                devices = group.worker_devices(w, nproc_per_node)
                placements.append(WorkerPlacement(w, node, devices, group.device_type))
            out[group.name] = placements
        return out

    def shutdown(self) -> None:
        """Release everything the backend made; safe to call twice."""

    def create_collective_group(self, group: CollectiveGroup, workers: list[WorkerGroup]) -> None:
        """Make every worker of `workers` a member of `group` (`twinkle_core.collective_group`).

        Optional. Member `i` of `group.members` gets rank `i`; each member's worker context must
        then hold its `Collective` under `group.name` (`context.collectives`), so
        `twinkle_core.collective(name)` finds it inside the worker. Waits are bounded by
        `group.timeout`; the backend destroys its groups in `shutdown()`.
        """
        from .errors import ConfigurationError

        raise ConfigurationError(
            f"collective_group({group.name!r}): mode {self.name!r} does not support collective "
            f"groups (its backend does not implement ExecutionBackend.create_collective_group); "
            "use mode 'ray', 'local' or 'inprocess'"
        )

    @property
    def owns_console(self) -> bool:
        """Whether this process draws the live status line on its terminal (slow_calls.py).

        True by default; a backend whose every process is a driver on one terminal (torchrun)
        returns True in one of them only.
        """
        return True

    def claim_notification(self, key: str) -> bool:
        """Whether this process should send the alert `key` (one sender per job)."""
        return True

    def describe(self) -> dict[str, Any]:
        """Facts shown in the header of `get_device_placement()`."""
        return {}

    def worker_stacks(self, workers: WorkerGroup | None, timeout: float) -> list[tuple[str, str]]:
        """[(who, stack text)] of the workers in other processes (only `workers`' when given),
        each asked for at most `timeout` s, for `dump_stacks()` and a timed-out call's note.
        Empty by default: a backend whose workers share the driver's process has none."""
        return []

    def gather_trace(self, recorder: Any) -> None:
        """Merge the events the workers' processes recorded into `recorder` (this process's
        trace), before the run stops. Nothing by default (workers in this process record
        straight into it)."""

    def flush_alerts(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until this process's queued failure alerts are sent.

        For backends that must keep a process alive until its alerts are out (e.g. before
        torchrun stops it). True when nothing is left to send.
        """
        return True if self.alerts is None else bool(self.alerts.flush(timeout))


def read_options(
    mode: str, given: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """`defaults` updated with `given` (a backend's `initialize(**options)`); an unknown
    option is a `ConfigurationError` naming it and listing the ones the backend accepts."""
    from .errors import ConfigurationError

    unknown = sorted(set(given) - set(defaults))
    if unknown:
        accepted = ", ".join(sorted(defaults)) or "none"
        raise ConfigurationError(
            f"initialize(mode={mode!r}) got unknown options {unknown}; the {mode!r} backend "
            f"accepts: {accepted}"
        )
    return {**defaults, **given}

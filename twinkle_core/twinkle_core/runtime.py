"""`initialize()` and `shutdown()`: the process-wide runtime that remote classes run against."""

from __future__ import annotations

import atexit
import inspect
import itertools
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import slow_calls as _slow_calls
from . import stacks as _stacks
from . import trace as _trace
from .backend import ExecutionBackend, WorkerGroup
from .device_group import DeviceGroup
from .device_mesh import DeviceMesh
from .errors import ConfigurationError, NotInitializedError
from .failures import CallFailure
from .health import GroupState, HealthBook
from .lazy import LazyCollect, ask_many
from .notify import AlertQueue, Notifier, as_notifier
from .plugins import get_plugin, plugin_system
from .seeding import seed_everything
from .swapping import Turns

log = logging.getLogger("twinkle")

DEFAULT_MODE = "local"


@dataclass
class RuntimeConfig:
    """The validated arguments of `initialize()`, handed to the backend."""

    mode: str
    seed: int = 42
    groups: dict[str, DeviceGroup] = field(default_factory=dict)
    nproc_per_node: int | None = None
    global_device_mesh: DeviceMesh | None = None
    lazy_collect: bool = True
    name: str = ""
    notifier: Notifier | None = None
    full_determinism: bool = False
    backend_options: dict[str, Any] = field(default_factory=dict)
    #: Where the call timeline is written at shutdown (None: not traced); see trace.py.
    trace: str | None = None
    #: Every group's health (`twinkle_core.health`): a backend that restarts workers drives it.
    health: HealthBook = field(default_factory=HealthBook)


@dataclass
class BoundClass:
    """A remote class instance created in this run: shown by `get_device_placement()`."""

    class_name: str
    workers: WorkerGroup


def _trace_health(state: Any) -> None:
    """Record a group's health transition in the run's trace, when one is recorded."""
    recorder = _trace.RECORDER
    if recorder is not None:
        recorder.group_health(state)


class Runtime:
    """The state of one `initialize()` ... `shutdown()` span.

    Lock order (review note): `Runtime._lock` guards only the runtime's own lists and is never
    held while calling other code (backends, hooks, notifiers, a LazyCollect's resolution).
    A LazyCollect's own lock is held while it resolves, which may report a failure and so
    take `Runtime._lock` briefly: the order is always LazyCollect -> Runtime, never the
    reverse. `tests/core/test_runtime_locks.py` holds this.
    """

    def __init__(self, config: RuntimeConfig, backend: ExecutionBackend) -> None:
        self.config = config
        self.backend = backend
        self.alerts = AlertQueue(config.notifier) if config.notifier is not None else None
        backend.attach_alerts(self.alerts)
        config.health.on_restarted = self.group_restarted
        config.health.listen(_trace_health)
        self.bound: list[BoundClass] = []
        #: Which object of each group ran last (roles taking turns: `swapping.py`).
        self.turns = Turns()
        #: Calls watched for failures nobody collects (`track`), by `id`, oldest first; each
        #: leaves the moment it resolves (`LazyCollect.watch`).
        self._pending: dict[int, LazyCollect] = {}
        #: Finished calls nobody collected yet, taken off `_pending`, settled together.
        self._finished: list[LazyCollect] = []
        self._settled_at = time.monotonic()
        #: When the next call looks at the tracked calls (`track`), and who is looking.
        self._next_look = 0.0
        self._look_lock = threading.Lock()
        #: The thread that also looks when no call is made (`_watch`), and its stop signal.
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        self._unobserved: list[tuple[LazyCollect, BaseException]] = []
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    def group(self, name: str) -> DeviceGroup:
        try:
            return self.config.groups[name]
        except KeyError:
            known = ", ".join(repr(n) for n in self.config.groups) or "none"
            raise ConfigurationError(
                f"remote_group={name!r} is not a group of this run (groups: {known}); pass "
                f"DeviceGroup(name={name!r}, ...) in initialize(groups=[...])"
            ) from None

    # ----------------------------------------------------------------- failures
    def report(self, failure: CallFailure) -> None:
        """Tell hooks and the notifier about a failure, once per distinct error."""
        fresh = []
        with self._lock:
            for key, _ in failure.distinct():
                dedupe = failure.dedupe_key(key)
                if dedupe not in self._reported:
                    self._reported.add(dedupe)
                    fresh.append((key, dedupe))
        if not fresh:
            return
        try:
            plugin_system().hook.twinkle_remote_failure(failure=failure)
        except Exception as exc:
            log.warning("twinkle: a twinkle_remote_failure hook raised: %s", exc)
        if self.alerts is None:
            return
        for key, dedupe in fresh:
            try:
                if self.backend.claim_notification(dedupe):
                    self.alerts.submit(dedupe, *failure.alert(key))
            except Exception as exc:
                log.warning("twinkle: could not queue the failure alert: %s", exc)

    def group_restarted(self, group: str, generation: int, cause: str) -> None:
        """A group's workers were rebuilt: one log line, the `twinkle_group_restarted` hook,
        and one alert (per restart, never per rank)."""
        health = self.config.health.get(group)
        budget = health.budget_text() if health is not None else ""
        log.warning(
            "twinkle: group %r restarted as generation %d (%s; %s)",
            group,
            generation,
            cause,
            budget,
        )
        try:
            plugin_system().hook.twinkle_group_restarted(
                group=group, generation=generation, cause=cause
            )
        except Exception as exc:
            log.warning("twinkle: a twinkle_group_restarted hook raised: %s", exc)
        if self.alerts is None:
            return
        title = f"twinkle run {self.config.name}: group {group} restarted"
        text = "\n".join(
            [
                f"### {title}",
                f"- **run**: {self.config.name} (mode {self.config.mode})",
                f"- **group**: {group}, now generation {generation} ({budget})",
                f"- **cause**: {cause}",
            ]
        )
        try:
            self.alerts.submit(f"restart:{group}:{generation}", title, text)
        except Exception as exc:
            log.warning("twinkle: could not queue the restart alert: %s", exc)

    @staticmethod
    def _known_ok(item: LazyCollect) -> bool:
        """A finished call known to have succeeded: nothing to report, nothing to fetch."""
        pending = getattr(item.source, "pending", None)
        try:
            return bool(pending is not None and pending.succeeded())
        except Exception:
            return False

    #: How often, at most, a new call looks at the oldest tracked calls for finished ones. A
    #: look asks each call whether it is done, which for some backends (Ray) is a question to
    #: the backend costing far more than the rest of a call; asked at most this often, its
    #: cost is independent of how fast calls are made. A failure nobody collects is noticed
    #: this much later at most (and reported after `SETTLE_AFTER_S`).
    LOOK_EVERY_S = 0.01
    #: A look asks only calls made at least this long ago. Calls are mostly collected by the
    #: code that made them soon after (a batch issued, then collected): those are never
    #: asked, fetched or settled here, which for Ray cost calls in flight 20-30% when every
    #: call was asked. A failure nobody collects is reported this much later.
    LOOK_AFTER_S = 1.0
    #: ... or when more calls than this are held, the oldest beyond it, whatever their age:
    #: calls dropped unresolved faster than `LOOK_AFTER_S` lets them age are not all kept.
    TRACK_MAX = 4096
    #: How many tracked calls one look goes through, at most: it stops at the first one still
    #: running (calls behind a running one most likely run too). Larger than the calls that
    #: can be made in `LOOK_EVERY_S`, so that the list keeps to a small multiple of the calls
    #: really in flight even when their LazyCollects are dropped unresolved.
    SWEEP = 512
    #: Finished, uncollected calls are settled together once this many wait, or
    #: `SETTLE_AFTER_S` after the last settling: settling asks the backend for each call's
    #: outcome, which for Ray is a fetch, and one fetch of many calls costs about one of a
    #: single call (1000 calls in flight would otherwise make hundreds of small fetches). A
    #: failure nobody collected is reported that much later, and at shutdown at the latest.
    SETTLE_BATCH = 32
    SETTLE_AFTER_S = 0.05

    #: How often the runtime's own thread (`_watch`) looks at the watched calls, so that
    #: calls dropped uncollected are settled (their failures reported, their results freed)
    #: also while no further call is made.
    WATCH_EVERY_S = 0.25
    #: How long `shutdown()` waits for that thread to end (it is a daemon thread).
    WATCH_JOIN_S = 2.0

    def _start_watching(self) -> None:
        """Start the thread that looks at the watched calls (once per runtime)."""
        with self._lock:
            if self._watcher is not None:
                return
            self._watcher = threading.Thread(
                target=_watch,
                args=(weakref.ref(self), self._stop_watching, self.WATCH_EVERY_S),
                name="twinkle-watch",
                daemon=True,
            )
        self._watcher.start()

    def track(self, lazy: LazyCollect, now: float | None = None) -> None:
        """Remember a call so its failure is reported even if nobody collects it.

        The call joins `_pending` (`LazyCollect.watch`), which it leaves when resolved: a
        collected call is not kept. At most every `LOOK_EVERY_S` a new call also looks at the
        oldest calls still there, if they were made at least `LOOK_AFTER_S` ago (`_look`).
        `now` is when the call was made (`time.monotonic()`), given by callers that already
        read the clock.
        """
        if now is None:
            now = time.monotonic()
        if self._watcher is None:
            self._start_watching()
        with self._lock:
            lazy.watch(self._pending, now)
            look = now >= self._next_look
            if look:
                self._next_look = now + self.LOOK_EVERY_S
        if look:
            self._look(now)

    def _look(self, now: float) -> None:
        """Set the finished calls at the front of `_pending` aside, and settle them in a batch.

        Goes through the oldest calls made at least `LOOK_AFTER_S` ago (or beyond
        `TRACK_MAX`) until one still runs, which goes to the back (so that one long call does
        not keep finished ones behind it from being settled; the calls after it most likely
        run too, and are not asked). The calls are asked whether they are done without
        holding `self._lock` (the question is backend code); one thread looks at a time
        (`_look_lock`). A call resolved meanwhile has left `_pending` on its own. Called by
        new calls (`track`) and by the watcher thread (`_watch`).
        """
        if not self._look_lock.acquire(blocking=False):
            return  # another thread is looking right now
        try:
            made_before = now - self.LOOK_AFTER_S
            calls = self._pending
            with self._lock:
                over = len(calls) - self.TRACK_MAX
                oldest = list(itertools.islice(calls.values(), self.SWEEP))
            taken: list[LazyCollect] = []
            for item in oldest:
                if len(taken) >= over and item._since > made_before:
                    break
                taken.append(item)
            finished: list[LazyCollect] = []
            ask_many([item for item in taken if not item.resolved])
            for item in taken:
                if item.resolved:
                    continue  # collected meanwhile: it left `_pending` itself
                if not item.done():
                    key = id(item)
                    with self._lock:
                        if calls.pop(key, None) is not None:
                            calls[key] = item  # to the back
                    if item.resolved:  # resolved while moved: its own removal may have missed
                        calls.pop(key, None)
                    break
                finished.append(item)
            settle: list[LazyCollect] = []
            with self._lock:
                for item in finished:
                    calls.pop(id(item), None)
                self._finished.extend(finished)
                waiting = self._finished
                if waiting and (
                    len(waiting) >= self.SETTLE_BATCH
                    or now - self._settled_at >= self.SETTLE_AFTER_S
                ):
                    settle, self._finished = waiting, []
                    self._settled_at = now
        finally:
            self._look_lock.release()
        if settle:
            self._settle(settle)

    def _settle(self, items: list[LazyCollect]) -> None:
        """Collect finished calls nobody collected; remember failures for the shutdown report.

        Must be called without holding `self._lock`: a failure is reported through `report`.
        """
        for item in items:
            if item.resolved or self._known_ok(item):
                continue
            error = item.settle()
            if error is not None:
                with self._lock:
                    self._unobserved.append((item, error))

    def settle_all(self) -> None:
        """Report failures of calls that finished but were never collected by user code."""
        self._stop_watching.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(self.WATCH_JOIN_S)
        with self._look_lock, self._lock:  # after a look in progress
            pending = list(self._pending.values())
            self._pending.clear()  # no longer watched: the run ends
            finished, self._finished = self._finished, []
        done = [item for item in pending if not item.resolved and item.done()]
        self._settle(finished + done)
        with self._lock:
            unobserved, self._unobserved = self._unobserved, []
        for item, error in unobserved:
            if not item.observed:
                log.error(
                    "twinkle: %r failed and its result was never collected: %s: %s",
                    item,
                    type(error).__name__,
                    error,
                )


def _watch(runtime: weakref.ref[Runtime], stop: threading.Event, every: float) -> None:
    """The runtime's watcher thread: a look every `every` seconds until `stop` is set or the
    runtime is gone (it holds the runtime only weakly, and only during a look)."""
    while not stop.wait(every):
        current = runtime()
        if current is None:
            return
        try:
            current._look(time.monotonic())
        except Exception as exc:  # never let the watcher die; the next look tries again
            log.debug("twinkle: looking at the calls in flight failed: %s", exc)
        del current


_runtime: Runtime | None = None
_runtime_lock = threading.RLock()


def current_runtime() -> Runtime:
    """The active runtime; raises `NotInitializedError` with the fix when there is none."""
    if _runtime is None:
        raise NotInitializedError(
            "twinkle is not initialized: call twinkle_core.initialize(mode=...) before creating "
            "remote objects (or construct the class without remote_group to use it locally)"
        )
    return _runtime


def current_runtime_or_none() -> Runtime | None:
    return _runtime


def is_initialized() -> bool:
    return _runtime is not None


def _positive_int_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"initialize({name}=...) must be a positive integer, got {value!r}"
        )
    return value


def _check_groups(groups: Iterable[DeviceGroup] | None) -> dict[str, DeviceGroup]:
    if groups is None:
        return {}
    if isinstance(groups, DeviceGroup) or not isinstance(groups, Iterable):
        raise ConfigurationError(
            f"initialize(groups=...) must be a list of DeviceGroup, got {groups!r}"
        )
    out: dict[str, DeviceGroup] = {}
    for g in groups:
        if not isinstance(g, DeviceGroup):
            raise ConfigurationError(
                f"initialize(groups=...) must contain DeviceGroup objects, got {g!r}"
            )
        if g.name in out:
            raise ConfigurationError(f"initialize(groups=...): group name {g.name!r} repeats")
        out[g.name] = g
    return out


def _load_backend(mode: str) -> ExecutionBackend:
    backend_cls = get_plugin("backends", mode)
    backend = backend_cls() if inspect.isclass(backend_cls) else backend_cls
    if not isinstance(backend, ExecutionBackend):
        raise ConfigurationError(
            f"backend {mode!r} is registered as {backend_cls!r}, which is not an ExecutionBackend"
        )
    return backend


def initialize(
    mode: str | None = None,
    *,
    seed: int = 42,
    groups: Iterable[DeviceGroup] | None = None,
    nproc_per_node: int | None = None,
    global_device_mesh: DeviceMesh | None = None,
    lazy_collect: bool = True,
    name: str | None = None,
    notifier: Any = None,
    full_determinism: bool = False,
    trace: str | os.PathLike | None = None,
    **backend_options: Any,
) -> RuntimeConfig:
    """Start twinkle in `mode` (default: `$TWINKLE_MODE`, then 'local').

    `groups` are the device groups remote classes are placed on; `backend_options` go to the
    backend (e.g. `address=` for Ray). `trace` (default: `$TWINKLE_TRACE`) records every
    remote call and writes a Chrome trace there at `shutdown()` (docs/tracing.md). Returns
    the validated configuration.
    """
    global _runtime
    if "ncpu_proc_per_node" in backend_options:
        raise ConfigurationError(
            "initialize(ncpu_proc_per_node=...) was removed in twinkle-core 0.2: no backend "
            "used it. Size CPU groups with DeviceGroup(name, ranks=<workers>, device_type='cpu') "
            "and, on Ray, initialize(..., cpus_per_worker=...); remove the argument"
        )
    mode = mode if mode is not None else os.environ.get("TWINKLE_MODE") or DEFAULT_MODE
    if not isinstance(mode, str) or not mode:
        raise ConfigurationError(f"initialize(mode=...) must be a backend name, got {mode!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigurationError(f"initialize(seed=...) must be an integer, got {seed!r}")
    for flag, value in (("lazy_collect", lazy_collect), ("full_determinism", full_determinism)):
        if not isinstance(value, bool):
            raise ConfigurationError(f"initialize({flag}=...) must be True or False, got {value!r}")
    if global_device_mesh is not None and not isinstance(global_device_mesh, DeviceMesh):
        raise ConfigurationError(
            f"initialize(global_device_mesh=...) must be a DeviceMesh, got {global_device_mesh!r}"
        )
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigurationError(f"initialize(name=...) must be a non-empty string, got {name!r}")
    config = RuntimeConfig(
        mode=mode,
        seed=seed,
        groups=_check_groups(groups),
        nproc_per_node=_positive_int_or_none("nproc_per_node", nproc_per_node),
        global_device_mesh=global_device_mesh,
        lazy_collect=lazy_collect,
        name=name or f"twinkle-{uuid.uuid4().hex[:8]}",
        notifier=as_notifier(notifier),
        full_determinism=full_determinism,
        backend_options=dict(backend_options),
        trace=_trace.check_path(trace),
    )
    with _runtime_lock:
        if _runtime is not None:
            raise ConfigurationError(
                f"twinkle is already initialized (mode={_runtime.config.mode!r}, run "
                f"{_runtime.config.name!r}); call twinkle_core.shutdown() before initializing again"
            )
        backend = _load_backend(mode)
        seed_everything(seed, full_determinism)
        if config.trace is not None:
            _trace.start(config.trace)  # before the backend starts: its workers record too
        # Before the backend starts, so its own waits (placement) show on the status line.
        _slow_calls.configure_status_line(
            _slow_calls.status_line_wanted() and bool(backend.owns_console)
        )
        try:
            backend.initialize(config)
        except BaseException:
            _trace.discard()
            _slow_calls.configure_status_line(False)
            raise
        _runtime = Runtime(config, backend)
        _stacks.install_signal_handler()  # SIGUSR1 dumps every stack (stacks.py)
        # Registered after the backend started so it runs before the backend's own exit hooks
        # (atexit is last-in, first-out): unobserved failures are still reported and alerts
        # flushed while the workers exist.
        atexit.register(shutdown)
    return config


def shutdown(timeout: float = 10.0) -> None:
    """Report unobserved failures, stop the backend and flush alerts. Safe twice.

    All waiting for alerts shares one deadline `timeout` seconds from the call: the flush
    before the backend stops, any flush the backend does while stopping (torchrun's hand-over
    to the other ranks) and the final close of the alert queue and the notifier.
    """
    global _runtime
    with _runtime_lock:
        rt = _runtime
        if rt is None:
            return
        if rt.alerts is not None:
            rt.alerts.limit_waits(timeout)  # the one deadline for every wait below
        atexit.unregister(shutdown)
        try:
            rt.settle_all()  # while the run is still current, so failures reach the notifier
            if rt.alerts is not None:
                # Deliver alerts while the backend still runs: a backend's shutdown may end
                # the process group other processes wait on, or the process itself.
                rt.alerts.flush(timeout)
        finally:
            _trace.gather(rt.backend)  # other processes' trace events, while they still run
            _runtime = None
            try:
                rt.backend.shutdown()
            finally:
                _stacks.uninstall_signal_handler()
                _slow_calls.configure_status_line(False)
                _trace.finish()  # writes the trace when one is recorded (trace.py)
                if rt.alerts is not None:
                    rt.alerts.close(timeout)  # only what is left of the deadline


def group_state(obj: Any) -> GroupState:
    """The health of a remote object's device group (or of the group named `obj`): `state`
    ("healthy", "restarting", "dead"), the `generation` of workers serving it, the restarts
    begun and the budget (`DeviceGroup(max_restarts=...)`), and the `last_cause` of a death."""
    runtime = current_runtime()
    if isinstance(obj, str):
        group = runtime.config.groups.get(obj)
        if group is None:
            known = ", ".join(repr(n) for n in runtime.config.groups) or "none"
            raise ConfigurationError(
                f"group_state({obj!r}): no group of that name in this run (groups: {known})"
            )
    else:
        binding = getattr(obj, "__dict__", {}).get("_twinkle_binding")
        if binding is None:
            raise ConfigurationError(
                f"group_state(...) takes a remote object or a group name, got "
                f"{type(obj).__name__}; pass the object a @remote_class made, or its group's name"
            )
        group = binding.workers.group
    return runtime.config.health.of(group).snapshot()

"""One remote call: resolve arguments, dispatch, choose workers, submit, collect.

This is the single place that gives dispatch/execute/collect their meaning; backends only
create workers and run what they are told on them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import plugins as _plugins
from . import runtime as _runtime
from . import slow_calls as _slow_calls
from . import stacks as _stacks
from . import trace as _trace
from .backend import PreparedCall, WorkerCall, WorkerGroup
from .callsite import CallSite
from .collect import Collector, as_collector
from .context import get_worker_context
from .device_mesh import DeviceMesh
from .dispatch import Dispatcher, as_dispatcher
from .errors import (
    CallTimeoutError,
    CollectError,
    ConfigurationError,
    NotInitializedError,
    TwinkleError,
)
from .failures import CALLER_TAG, CallFailure, WorkersFailedError, tag_exception
from .handoff import finish_hand_off, has_stand_ins
from .lazy import _ASK_SOURCE, _UNSET, COLLECT_ITSELF, LazyCollect
from .plain import is_plain_data
from .plugins import plugin_system
from .transport import check_registered

EXECUTE_MODES = ("all", "first", "peer")


@dataclass(frozen=True)
class MethodSpec:
    """How a `@remote_function` method is dispatched, executed and collected."""

    name: str
    qualname: str
    dispatch: Any = "slice"
    execute: str = "all"
    collect: Any = "none"
    sync: bool = False
    lazy_collect: bool | None = None
    timeout: float | None = None
    #: How large tensor results travel to other groups (`twinkle_core.transport`).
    transport: str = "auto"
    #: The method writes in place into its tensor/array arguments: backends that hand out
    #: read-only (shared) views of large arguments give it private copies instead.
    writable_args: bool = False

    def resolved(self) -> tuple[Dispatcher, Collector]:
        """The dispatcher and collector this method names, looked up once per plugin state.

        The lookup (plugin registry, conflict checks) is cached per spec and redone when the
        plugin system is reset or a plugin is added at run time.
        """
        hit = _RESOLVED.get(id(self))
        if hit is not None and hit[0] is self:
            loaded = _plugins._system  # `plugin_system()` once loaded, without the calls
            if hit[1] is loaded and loaded._loaded and hit[2] == loaded.generation:
                return hit[3], hit[4]
        system = plugin_system()
        dispatcher = as_dispatcher(self.dispatch, argument=f"{self.qualname}: dispatch")
        collector = as_collector(self.collect, argument=f"{self.qualname}: collect")
        check_registered(self.transport, f"{self.qualname}: transport")
        _RESOLVED[id(self)] = (self, system, system.generation, dispatcher, collector)
        return dispatcher, collector


#: `MethodSpec.resolved()` results by spec id: (spec, plugin system, generation, d, c). Specs
#: live as long as their classes, so the table holds one entry per remote method.
_RESOLVED: dict[int, tuple[Any, Any, int, Dispatcher, Collector]] = {}


class RemoteBinding:
    """What ties a driver-side object to its workers. Copies of it are the same binding."""

    def __init__(
        self,
        workers: WorkerGroup,
        run_name: str,
        mode: str,
        lazy_collect: bool,
        offload: str | None = None,
        onload: str | None = None,
    ) -> None:
        self.workers = workers
        self.run_name = run_name
        self.mode = mode
        self.lazy_collect = lazy_collect
        #: The object's `offload`/`onload` methods when roles take turns (`swapping.py`).
        self.offload = offload
        self.onload = onload

    def __deepcopy__(self, memo: dict) -> RemoteBinding:
        return self

    def __copy__(self) -> RemoteBinding:
        return self


def target_ranks(execute: str, workers: WorkerGroup) -> list[int]:
    """Which workers run a call: all, the first, or the caller's peer (same rank, modulo size)."""
    if execute == "all":
        return list(range(workers.size))
    if execute == "first":
        return [0]
    if execute == "peer":
        ctx = get_worker_context()
        if ctx is None:
            return list(range(workers.size))
        return [ctx.rank % workers.size]
    raise ConfigurationError(f"execute must be one of {EXECUTE_MODES}, got {execute!r}")


#: Element types that can never hold a LazyCollect: a list made only of these is passed on
#: without walking it element by element in Python.
_LEAF_TYPES = frozenset({int, float, bool, str, bytes, complex, type(None)})


def _may_hold_lazy(items: Any) -> bool:
    """Whether a list/tuple/dict-values may contain a LazyCollect: decided from the set of
    element types (computed at C speed), so long batches of numbers or arrays cost little."""
    for kind in set(map(type, items)):
        if kind in _LEAF_TYPES:
            continue
        if kind in (list, tuple) or issubclass(kind, (LazyCollect, dict)):
            return True
    return False


def replace_lazy(value: Any, resolve: Callable[[LazyCollect], Any]) -> Any:
    """`value` with every LazyCollect in it (also in dicts, lists and tuples) replaced by
    `resolve(lazy)`; containers without one are returned as they are, without copying."""
    if isinstance(value, LazyCollect):
        return resolve(value)
    if isinstance(value, dict):
        if not _may_hold_lazy(value.values()):
            return value
        changed = None  # copied on the first replacement only: most dicts hold no lazy
        for key, item in value.items():
            replaced = replace_lazy(item, resolve)
            if replaced is not item:
                if changed is None:
                    changed = dict(value)
                changed[key] = replaced
        return value if changed is None else changed
    if type(value) in (list, tuple):
        if not _may_hold_lazy(value):
            return value
        new_items = [replace_lazy(v, resolve) for v in value]
        if any(a is not b for a, b in zip(new_items, value, strict=True)):
            return type(value)(new_items)
    return value


def resolve_lazy_values(value: Any) -> Any:
    """`value` with every LazyCollect in it replaced by its collected value."""
    return replace_lazy(value, lambda lazy: lazy())


def _resolve_lazy(value: Any, workers: WorkerGroup, prepared: PreparedCall) -> Any:
    def resolve(lazy: LazyCollect) -> Any:
        resolved = workers.resolve_argument(lazy, prepared)
        if not prepared.stand_ins and has_stand_ins(resolved):
            prepared.stand_ins = True
        return resolved

    return replace_lazy(value, resolve)


def _strategy_name(strategy: Any) -> str:
    return getattr(strategy, "name", "") or type(strategy).__name__


def call_mesh(targets: list[int], workers: WorkerGroup) -> DeviceMesh:
    """The mesh a call is dispatched and collected with: the class's mesh when the call goes to
    every worker, else a plain `dp` mesh over the targets (e.g. `execute='first'`)."""
    mesh = workers.device_mesh
    if len(targets) == mesh.world_size:
        return mesh
    return DeviceMesh.from_sizes(dp_size=len(targets))


def _wait_text(call: CallSource, deadline: float | None) -> str:
    """What a wait for `call` shows (built only if the wait lasts long enough to be shown)."""
    limit = "" if deadline is None else f", timeout {deadline:g} s"
    return f"{call.method} on group {call.workers.group.name!r} (called at {call.call_site}{limit})"


class CallSource(LazyCollect):
    """One submitted call, as the LazyCollect user code gets: where its value comes from (the
    pending call and how it will be collected) and what collects it (`_collect`: waits for
    the workers and combines their results, or raises their failure tagged with the call
    site, and reports it to the runtime).

    Backends read `source.workers`, `pending`, `collector`, `device_mesh` and `method` to
    hand a result to another group without fetching it to the driver; `source` is the object
    itself. One slotted object per call, the handle and its source in one, holding no bound
    method or closure of itself (which would be a reference cycle): with thousands of calls
    in flight, each object a call keeps is one more for the garbage collector to promote.
    """

    __slots__ = (
        "binding",
        "call_site",
        "collector",
        "device_mesh",
        "pending",
        "spec",
        "took",
        "trace",
        "workers",
    )

    def __init__(
        self,
        workers: WorkerGroup,
        pending: Any,
        collector: Collector,
        device_mesh: DeviceMesh,
        binding: RemoteBinding,
        spec: MethodSpec,
        call_site: CallSite,
        took: float,
        trace: tuple[Any, int] | None = None,
    ) -> None:
        # LazyCollect's state, set here (its __init__ stores a `source`, which is this).
        self._describe = ""
        self._resolve = COLLECT_ITSELF
        self._is_done = _ASK_SOURCE
        self._value = _UNSET
        self._error = None
        self._lock = None
        self._observed = False
        self._watched = None
        self._since = 0.0
        self.workers, self.pending, self.collector = workers, pending, collector
        self.device_mesh, self.binding, self.spec = device_mesh, binding, spec
        self.call_site, self.took = call_site, took
        #: (trace recorder, call id) when the driver records a trace (`trace.py`), else None.
        self.trace = trace

    @property
    def source(self) -> CallSource:  # type: ignore[override]
        """This call itself (plain LazyCollects keep their source in a slot)."""
        return self

    @property
    def method(self) -> str:
        """`Class.method`: made when read (errors, hand-offs), not on every call."""
        return f"{self.workers.class_name}.{self.spec.name}"

    def _what(self) -> object:
        """What the call is, for the LazyCollect's repr: formatted only when shown."""
        return f"{self.method} from {self.call_site}"

    def _collect(self, timeout: float | None) -> Any:
        trace = self.trace
        if trace is None:
            return self._collect_now(timeout)
        recorder, call_id = trace
        start = _trace.now_ns()
        try:
            return self._collect_now(timeout)
        finally:
            recorder.collect_span(call_id, start, self.method, self.workers.group.name)

    def _collect_now(self, timeout: float | None) -> Any:
        # Runs on every collected call: few Python calls on the way (`method` is formatted
        # only for an error, the wait is registered with two plain calls, not a `with`).
        spec, pending = self.spec, self.pending
        deadline = timeout if timeout is not None else spec.timeout
        overran = spec.timeout is not None and self.took > spec.timeout
        try:
            if overran and pending.done():
                raise CallTimeoutError(
                    f"{self.method} on group {self.workers.group.name!r} did not finish "
                    f"within its timeout={spec.timeout:g}s (it ran for {self.took:.3g}s "
                    "while being submitted)"
                )
            # No `done()` check first: for some backends (Ray) asking costs more than a wait
            # that ends at once; the description is built only if the wait is shown.
            token = _slow_calls.enter(functools.partial(_wait_text, self, deadline))
            try:
                return pending.collect(self.collector, self.device_mesh, deadline)
            finally:
                _slow_calls.leave(token)
        except WorkersFailedError as errors:
            workers, method, call_site = self.workers, self.method, self.call_site
            failure = CallFailure(
                run_name=self.binding.run_name,
                method=method,
                group=workers.group.name,
                call_site=call_site,
                failures=errors.failures,
                mode=self.binding.mode,
            )
        except CallTimeoutError as exc:
            workers, method, call_site = self.workers, self.method, self.call_site
            tag = CALLER_TAG.format(site=call_site)
            if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith(tag):
                text = exc.args[0]  # a backend's message may name the method itself
                named = text if text.startswith(f"{method} ") else f"{method}: {text}"
                exc.args = (f"{tag} {named}", *exc.args[1:])
            if not overran and (deadline is None or deadline >= _stacks.NOTE_MIN_TIMEOUT_S):
                _stacks.note_for_timeout(exc, workers)  # where every worker is (stacks.py)
            raise
        except TwinkleError:
            raise
        except Exception as exc:  # the collector could not combine the results
            tag, strategy = CALLER_TAG.format(site=self.call_site), self.collector
            raise CollectError(
                f"{tag} {self.method}: collect={_strategy_name(strategy)!r} could not combine "
                f"the workers' results: {type(exc).__name__}: {exc}. Return values it can "
                "combine (numbers, arrays or tensors for 'mean'/'sum'), or use collect='none'"
            ) from exc
        current = _runtime.current_runtime_or_none()
        if current is not None and not isinstance(failure.exception, StopIteration):
            current.report(failure)
        raise tag_exception(failure)


def invoke(
    binding: RemoteBinding,
    spec: MethodSpec,
    args: tuple,
    kwargs: dict,
    call_site: CallSite,
    *,
    swapping: bool = True,
) -> Any:
    """Run `spec` on the bound workers; a LazyCollect, or the value when lazy collection is off.

    On the driver the object first becomes the active role of its group (`swapping.py`),
    unless `swapping` is False (the switch's own calls)."""
    runtime = _runtime._runtime  # `current_runtime_or_none()`, without the call
    this_run = runtime is not None and runtime.config.name == binding.run_name
    if swapping and this_run and runtime is not None:
        turns = runtime.turns
        if turns.active.get(binding.workers.group.name) is not binding:
            if get_worker_context() is None:  # calls inside workers do not switch roles
                turns.before_call(binding, call_site)
    if not this_run and get_worker_context() is None:
        # On a driver, an object outlives its run only by mistake; inside a worker the run
        # lives in the driver and this process has no runtime of its own.
        raise NotInitializedError(
            f"{binding.workers.class_name}.{spec.name}: this object belongs to run "
            f"{binding.run_name!r}, which was shut down; its workers are gone. Create the "
            "object again after initialize()"
        )
    dispatcher, collector = spec.resolved()
    workers = binding.workers
    rec = _trace.RECORDER  # None unless a trace is recorded: all the off path costs
    if rec is not None:
        call_id, traced_at = rec.begin_call()
    targets = target_ranks(spec.execute, workers)
    prepared = PreparedCall(spec.name, dispatcher)
    # Plain data (a config dict, token ids) holds no LazyCollect: not walked (`plain.py`).
    if args:
        if is_plain_data(args):
            prepared.plain_args = args
        else:
            args = _resolve_lazy(args, workers, prepared)
    if kwargs and not is_plain_data(kwargs):
        kwargs = _resolve_lazy(kwargs, workers, prepared)
    mesh = call_mesh(targets, workers)
    per_worker = dispatcher.dispatch(args, kwargs, len(targets), mesh)
    if not isinstance(per_worker, list) or len(per_worker) != len(targets):
        raise ConfigurationError(
            f"dispatcher {dispatcher!r} returned {type(per_worker).__name__} of "
            f"{len(per_worker) if hasattr(per_worker, '__len__') else '?'} entries for "
            f"{len(targets)} workers; it must return a list of one (args, kwargs) per worker"
        )
    if prepared.stand_ins:  # a by-reference hand-off's stand-ins the dispatcher left whole
        per_worker = finish_hand_off(per_worker)
    calls = [
        WorkerCall(
            rank, a if type(a) is tuple else tuple(a), dict(k) if k else {}
        )  # each call its own kwargs dict: a backend may fill it
        for rank, (a, k) in zip(targets, per_worker, strict=True)
    ]
    prepared.calls, prepared.collector, prepared.device_mesh = calls, collector, mesh
    started = time.monotonic()
    pending = workers.submit(prepared)
    if rec is not None:
        on_driver = get_worker_context() is None  # calls inside workers: no driver track
        name, links = f"{workers.class_name}.{spec.name}", _trace.links_of(pending)
        nbytes = _trace.payload_bytes(calls) if on_driver else None
        rec.end_dispatch(
            call_id,
            traced_at,
            name,
            workers.group.name,
            record=on_driver,
            links=links,
            nbytes=nbytes,
        )
    # Backends that run a call while submitting it (in-process, torchrun) cannot interrupt it;
    # a call that outlived its method's timeout there fails as it would where it could be.
    now = time.monotonic()
    lazy = CallSource(
        workers,
        pending,
        collector,
        mesh,
        binding,
        spec,
        call_site,
        now - started,
        (rec, call_id) if rec is not None and on_driver else None,
    )
    if this_run and runtime is not None:
        runtime.track(lazy, now)
    lazy_on = spec.lazy_collect if spec.lazy_collect is not None else binding.lazy_collect
    if spec.sync or not lazy_on:
        value = lazy()
        return lazy if lazy_on else value
    return lazy

"""The workers of one remote class on Ray: `RayWorkerGroup`, one actor handle per worker.

The group submits calls and decides what a failure means for the whole group; the rest of a
call lives in modules of its own, each below this one:

- `shipping`: arguments shared by several workers go to the object store once;
- `pending`: the call in flight (`RayPendingCall`): done or not, replies, failures;
- `late_failures`: ranks failing after their call raised become notes on that exception;
- `deaths`: a worker that died, told apart from user code that raised;
- `placeholders`: a LazyCollect argument handed on as stand-ins, not collected here.

The group is picklable, so a driver object passed into another group's worker can be called
from there. A call is one actor task per worker: the method under its own name with exactly
the user's arguments (`handle.<method>.remote(...)`) when the actor exposes it, else twinkle's
generic `_tw_call` with the method's name (arguments holding remote placeholders, or a method
the actor does not expose, such as one named `_tw_*`), or `_tw_call_rdt` when Ray Direct
Transport carries some of the arguments. Each task has one return value. A dead worker tears
its whole group down (and restarts it when restart is on for it).
"""

from __future__ import annotations

import collections
import logging
import operator
import sys
import threading
from typing import Any

import ray
import ray.exceptions as rex

from twinkle_core import CallTimeoutError, DeviceGroup, DeviceMesh, LazyCollect, WorkerDiedError
from twinkle_core.plugin import (
    RESTARTING,
    CompletedCall,
    PendingCall,
    PreparedCall,
    WorkerCall,
    WorkerFailure,
    WorkerGroup,
    WorkerPlacement,
    WorkersFailedError,
    format_remote_traceback,
    rebuilt,
    waiting_for,
)

from . import transfer as _transfer
from .actor import RESERVED_PREFIX, call_key
from .deaths import DEATH_ERRORS, how_it_died
from .payload_check import all_plain_data, checked_arguments
from .pending import RayPendingCall, keep_until_done
from .placeholders import PLACEHOLDER_DISPATCHERS, build_placeholder
from .read_ahead import ReadAhead
from .relay import unregister
from .shipping import ship_all
from .submission import Submitters
from .transfer import placeholder_refs, register_tensor_serializer
from .transports import before_submit, held_replies

#: A `WorkerCall`'s rank (its first field), read in C.
_RANK = operator.itemgetter(0)

log = logging.getLogger("twinkle")


class _CallArguments:
    """What one call carries besides its arguments, learned while they were resolved
    (`resolve_argument`) and kept on the call's `PreparedCall.backend_data`: the producers'
    results its placeholders stand for, held by a transport, and the producers' calls to keep
    alive until the call finished. Made only for a call with a placeholder argument; one
    that never reaches `submit` (its dispatcher raised) takes it along when it is dropped."""

    __slots__ = ("held", "producers")

    def __init__(self) -> None:
        self.held: dict | None = None
        self.producers: tuple = ()


class RayWorkerGroup(WorkerGroup):
    """The workers of one remote object: one actor per rank, shared with the other objects
    colocated on the group (the object lives in slot `slot` of each actor); picklable
    (handles travel), so workers can call other groups."""

    def __init__(
        self,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        class_name: str,
        handles: list[Any],
        placements: list[WorkerPlacement],
        run_name: str,
        restartable: bool = False,
        direct: frozenset[str] = frozenset(),
        direct_transport: bool = True,
        slot: int = 0,
        send_lock: threading.Lock | None = None,
    ) -> None:
        super().__init__(group, device_mesh, class_name, len(placements), placements)
        #: Which object of the actors this is (0: the one their class was made for).
        self.slot = slot
        self.run_name = run_name
        self.restartable = restartable
        #: Whether the actors are declared for Ray Direct Transport (`backend.actor_class`).
        self.direct_transport = direct_transport
        #: Methods the actors expose under their own name (see `actor.actor_class_for`).
        self.direct = direct
        #: Driver-side only: `restarter(cause)` turns a death into a restart or a teardown
        #: (set by the backend: `restarts.Restarter.died` for this object's actors).
        self.restarter: Any = None
        #: Driver-side only: `rerouter(route)` replaces the relays of `route` after one of them
        #: died on its own (set by the backend: `rerouting.Rerouter.relay_died`).
        self.rerouter: Any = None
        #: Driver-side only: the actors hosting this object (`hosts.Hosts`; set by the backend).
        self.hosts: Any = None
        #: The generation of the workers serving this object (0 until the group restarts).
        self.restarts = 0
        #: Driver-side only: the group's health (`twinkle_core.plugin.GroupHealth`).
        self.health: Any = None
        #: Seconds a call waits for a restart under way (the backend sets its start timeout).
        self.restart_wait = 300.0
        self.torn_down: str | None = None
        #: Held while one call's tasks are handed to Ray, so that every rank receives the
        #: calls of this process in the same order (Ray keeps each caller's order per actor):
        #: two driver threads calling at once must not run as call A then B on rank 0 and B
        #: then A on rank 1, which would pair mismatched results and deadlock collectives.
        #: Shared by every object colocated on the same actors: their calls reach every rank
        #: in one order too.
        self._send_lock = send_lock or threading.Lock()
        #: Calls of this group whose workers all finished, not yet fetched (weak references,
        #: appended by `RayPendingCall.ask_many`): fetched together by `pending.fetch_finished`.
        self.finished: collections.deque = collections.deque()
        #: Driver-side only: this group's unsettled calls in issue order (`read_ahead.py`);
        #: None in a worker process (nothing there settles the calls it drops).
        self.ahead: ReadAhead | None = ReadAhead()
        self.handles = handles
        #: This generation's `TWINKLE_WORKER_GROUP` (names its transport groups).
        self.tag = ""
        #: Driver-side only: the per-node relays calls go through (`relay.Route`), when the
        #: workers span enough nodes (set by the backend); None: one task per worker.
        self.route: Any = None

    @property
    def handles(self) -> list[Any]:
        return self._handles

    @handles.setter
    def handles(self, handles: list[Any]) -> None:
        self._handles = handles
        self._methods = Submitters(handles)  # those bound to the previous actors are gone

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_send_lock", None)
        state.pop("finished", None)
        state.pop("ahead", None)
        state["_methods"] = None  # made again from the handles (`__setstate__`)
        state["restarter"] = None
        state["rerouter"] = None
        state["health"] = None
        state["hosts"] = None  # driver-side only (and holds a lock)
        state["route"] = None  # a worker calling this group is a caller of its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._methods = Submitters(self._handles)
        self._send_lock = threading.Lock()
        self.finished = collections.deque()
        self.ahead = None  # a worker calling this group: no runtime settles its calls

    def actor_method(self, rank: int, method: str) -> Any:
        """What submits `method` on worker `rank` (cached per handle): `.remote(*args,
        **kwargs)` returns the task's ObjectRef (`submission.actor_method`)."""
        return self._methods[rank, method]

    # ------------------------------------------------------------------ failures
    def node_of(self, rank: int) -> str | None:
        return self.placements[rank].node if rank < len(self.placements) else None

    def failure(self, rank: int, exc: BaseException) -> WorkerFailure:
        """A worker's failure as a WorkerFailure: the user's own exception, or a death."""
        node = self.node_of(rank)
        if isinstance(exc, DEATH_ERRORS):
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            health = self.health
            if self.restartable and health is not None and health.snapshot().restarts_left:
                after = (
                    f"twinkle restarts the whole group (max_restarts={health.max_restarts}): "
                    "every worker is rebuilt from its constructor and brought up to date by "
                    "on_restart(generation) where the class defines it; later calls run on "
                    "the new generation"
                )
            else:
                after = (
                    "twinkle tore down the whole group, whose other ranks would hang in their "
                    "next collective: create the remote object again to continue"
                )
            died = WorkerDiedError(
                f"worker rank {rank} of group {self.group.name!r} ({self.class_name}) on node "
                f"{node or '?'} {how_it_died(exc)} ({type(exc).__name__}: {reason[:300]}); "
                f"{after}"
            )
            return WorkerFailure(rank, died, node, str(exc))
        if isinstance(exc, rex.RayTaskError):
            cause = getattr(exc, "cause", None)
            if not isinstance(cause, BaseException):
                try:
                    cause = exc.as_instanceof_cause()
                except Exception:
                    cause = exc
            return WorkerFailure(
                rank, rebuilt(cause), node, getattr(exc, "traceback_str", "") or str(exc)
            )
        return WorkerFailure(rank, exc, node, format_remote_traceback(exc))

    def relay_lost(self, route: Any) -> None:
        """A relay of `route` died on its own (the workers live): have the relays replaced,
        once, unless they were already (or the actors restarted, with relays of their own)."""
        if self.rerouter is not None:
            self.rerouter(route)

    def on_failures(self, failures: list[WorkerFailure], generation: int | None = None) -> None:
        """Tear the group down, or have it restarted, after a worker died.

        A call made on an earlier generation (`generation` older than `restarts`) reports its
        own deaths, with a note saying the group has restarted since, and leaves the rebuilt
        group alone.
        """
        died = [f for f in failures if isinstance(f.exception, WorkerDiedError)]
        if not died:
            return
        if generation is not None and generation != self.restarts:
            for failure in died:
                failure.exception.add_note(
                    f"twinkle: this call ran on generation {generation} of group "
                    f"{self.group.name!r}, which has restarted since (now generation "
                    f"{self.restarts}); its workers and results are gone: call again"
                )
            return
        if self.torn_down is not None:
            return
        first = died[0]
        cause = (
            f"worker rank {first.rank} of group {self.group.name!r} ({self.class_name}) on node "
            f"{first.node or '?'} died"
        )
        if self.restarter is not None:
            self.restarter(cause)
        else:
            self.teardown(cause)

    def teardown(self, reason: str) -> None:
        """Kill every actor of this group (a torch.distributed group cannot lose one rank),
        and its relays."""
        self.torn_down = reason
        if self.ahead is not None:
            self.ahead.calls.clear()  # calls never collected need no look: let them go
        route, self.route = self.route, None
        if route is not None:
            unregister(self.handles)
            route.kill()
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already dead, or the cluster is gone
                pass

    # ------------------------------------------------------------------ calls
    def submit(self, prepared: PreparedCall) -> PendingCall:
        method, calls = prepared.method, prepared.calls
        local = prepared.backend_data
        has_remote = local is not None
        if self.torn_down is not None and self.health is not None:
            self._wait_for_restart()
        hosts = self.hosts
        if hosts is not None and hosts.rerouting is not None:
            self._wait_for_relays(hosts.rerouting)
        if self.torn_down is not None:
            return CompletedCall(
                [],
                [
                    WorkerFailure(
                        c.rank,
                        WorkerDiedError(
                            f"group {self.group.name!r} ({self.class_name}) was torn down "
                            f"after {self.torn_down}; create the remote object again"
                        ),
                        self.node_of(c.rank),
                    )
                    for c in calls
                ],
            )
        # Once per process, when torch is there: no call each time (nor while it is not).
        if not _transfer._registered_in_process and "torch" in sys.modules:
            register_tensor_serializer()
        rdt = None
        producers: tuple = ()
        if local is not None and local.held:
            producers = local.producers  # queues the producers' sends first
            wanted = [placeholder_refs((c.args, c.kwargs)) for c in calls]
            rdt = before_submit(self, calls, wanted, local.held)
        has_arguments = False
        for c in calls:  # a loop, not any(<generator>): this runs on every call
            if c.args or c.kwargs:
                has_arguments = True
                break
        # Nothing to refuse, and it pickles:
        if has_arguments and all_plain_data(calls, prepared.plain_args):
            refs = self._send(method, calls, has_remote, rdt)
        elif has_arguments:
            # Arguments Ray would ship wrongly (an open file, a lock) are refused before
            # anything is sent, and one that does not pickle is named without its value.
            with checked_arguments(self.class_name, method, calls):
                refs = self._send(method, calls, has_remote, rdt)
        else:  # the common no-argument call: nothing to ship or check
            refs = self._send(method, calls, has_remote, rdt, has_arguments=False)
        if producers:
            keep_until_done(refs, producers)
        # The ranks as a tuple of ints, which the garbage collector stops tracking.
        pending = RayPendingCall(self, method, tuple(map(_RANK, calls)), refs, self.restarts)
        ahead = self.ahead
        if ahead is not None:
            ahead.issued(pending)
        return pending

    def _wait_for_restart(self) -> None:
        """A call made while the group restarts waits for the new generation (at most the
        run's start timeout); it then runs there, or fails as a torn-down group's would."""
        health = self.health
        if health.state != RESTARTING:
            return
        with waiting_for(f"group {self.group.name!r} to restart"):
            health.serving.wait(self.restart_wait)

    def _wait_for_relays(self, ready: threading.Event) -> None:
        """A call made while a dead relay is replaced waits for the new relays (at most the
        run's start timeout), so that it cannot overtake the calls the old relays handed on."""
        with waiting_for(f"group {self.group.name!r}'s relays to be replaced"):
            ready.wait(self.restart_wait)

    def _send(
        self,
        method: str,
        calls: list[WorkerCall],
        has_remote: bool,
        rdt: dict[int, list[tuple[str, Any]]] | None = None,
        has_arguments: bool = True,
    ) -> list[Any]:
        """One actor task per call: the method under its own name with exactly the user's
        arguments, or (arguments holding remote placeholders, reserved names) by name; a
        call taking held results Ray Direct Transport or the object store carries also takes
        their refs (`rdt`: `transports.before_submit`)."""
        shipped = ship_all(calls) if has_arguments else [((), {})] * len(calls)
        if rdt:
            return self._send_rdt(method, calls, shipped, rdt)
        route = self.route
        with self._send_lock:  # submitting only: never waits on a worker
            if route is not None:
                name = (
                    method if not has_remote and method in self.direct else f"{RESERVED_PREFIX}call"
                )
                if name != method:
                    key = call_key(self.slot, method, has_remote)
                    shipped = [((key, *a), k) for a, k in shipped]
                return route.send(name, [c.rank for c in calls], shipped)
            if not has_remote and method in self.direct:
                bound = self._methods  # `actor_method`'s cache, read inline: on every call
                return [
                    bound[call.rank, method].remote(*args, **kwargs)
                    for call, (args, kwargs) in zip(calls, shipped, strict=True)
                ]
            key = call_key(self.slot, method, has_remote)
            return [
                self.actor_method(call.rank, f"{RESERVED_PREFIX}call").remote(key, *args, **kwargs)
                for call, (args, kwargs) in zip(calls, shipped, strict=True)
            ]

    def _send_rdt(
        self,
        method: str,
        calls: list[WorkerCall],
        shipped: list[tuple[tuple, dict]],
        rdt: dict[int, list[tuple[str, Any]]],
    ) -> list[Any]:
        route = self.route
        with self._send_lock:
            if route is not None:
                per_call = []
                for i, (args, kwargs) in enumerate(shipped):
                    pairs = rdt.get(i, ())
                    keys = tuple(k for k, _ in pairs)
                    refs_in = tuple(r for _, r in pairs)
                    per_call.append(((self.slot, method, keys, *refs_in, *args), kwargs))
                return route.send(f"{RESERVED_PREFIX}call_rdt", [c.rank for c in calls], per_call)
            refs = []
            for i, (call, (args, kwargs)) in enumerate(zip(calls, shipped, strict=True)):
                pairs = rdt.get(i, ())
                keys = tuple(k for k, _ in pairs)
                bound = self.actor_method(call.rank, f"{RESERVED_PREFIX}call_rdt")
                refs.append(
                    bound.remote(self.slot, method, keys, *(r for _, r in pairs), *args, **kwargs)
                )
            return refs

    # ------------------------------------------------------------------ chaining
    def resolve_argument(self, value: LazyCollect, call: PreparedCall) -> Any:
        """Hand a producer's results to this group's workers without fetching them here.

        For every built-in collector, the argument becomes a placeholder built from the
        producer's replies (small results, and envelopes describing large ones): real
        dicts/lists/tuples whose arrays and other leaves stand for parts of the producer's
        results, which dispatchers walk and slice like the real value; each consumer worker
        then fetches only the producer results its share needs, straight from the object
        store. Otherwise (custom collectors, dict subclasses, very large structures) the
        value is collected on the driver as usual, and so it is for a custom `dispatcher`
        when core says which one the call uses (a user's dispatcher may look inside the
        value, where a stand-in only offers `len`, `shape` and slicing).
        """
        source = getattr(value, "source", None)
        pending = getattr(source, "pending", None)
        if value.resolved or not isinstance(pending, RayPendingCall):
            return value()
        dispatcher = call.dispatcher
        if dispatcher is not None and type(dispatcher) not in PLACEHOLDER_DISPATCHERS:
            return value()
        try:
            replies = pending.wait_replies(None)
        except (WorkersFailedError, CallTimeoutError):
            return value()  # raises the producer's failure, tagged with its call site
        refs = pending.reply_refs()  # one per worker (a relayed call's: put once here)
        placeholder = build_placeholder(
            source.collector, source.device_mesh, refs, replies, dispatcher
        )
        if placeholder is None:
            return value()
        local = call.backend_data
        if local is None:
            local = call.backend_data = _CallArguments()
        held = held_replies(refs, replies)
        if held:
            mine = local.held or {}
            mine.update({ref: (h, pending.workers) for ref, h in held.items()})
            local.held = mine
            local.producers = (*local.producers, pending)
        return placeholder

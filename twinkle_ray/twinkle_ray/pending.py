"""A call in flight on a Ray worker group: knowing when it is done, fetching its replies,
and raising its failures.

`RayPendingCall` holds one result ref per worker. It collects them with one `ray.get` of the
list, which raises as soon as any worker failed (fail fast); only then are the workers looked
at one by one: every failure known at that moment is raised together (ranks failing within
`FAILURE_GRACE_SECONDS` of each other are grouped), and failures arriving later are added as
notes to the exception already raised (`late_failures`).

`done()` is not told by completion callbacks (each would take the driver's GIL from Ray's
own thread, for every call): it answers from a look at the call's workers, one `ray.wait` with
timeout 0 that fetches nothing, reused for `LOOK_FRESH_S`. `ask_many` takes that look for many
calls at once, so a loop polling 1000 calls asks Ray a few times per round, not 1000; calls
found finished are queued on their group and fetched together (`fetch_finished`). Ray's
completion callbacks serve only two rarer cases: keeping a consuming call's producers alive
until it finished (`keep_until_done`) and watching ranks that fail late (`late_failures`).

A call needs a few things of its group (`CallGroup`), not the group class: `workers.py`
imports this module, never the other way round.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import ray
import ray.exceptions as rex

from twinkle_core import CallLostError, CallTimeoutError, DeviceGroup
from twinkle_core.plugin import (
    PendingCall,
    WorkerFailure,
    WorkersFailedError,
    add_note,
    note_fallback,
)

from .deaths import DEATH_ERRORS, how_it_died
from .late_failures import HAS_ON_READY, LATE_FAILURES
from .node_reduce import NOT_REDUCED, reduce_per_node
from .read_ahead import ReadAhead
from .relay import NOT_REPORTED, RelayedRefs, RelayFailed, StillRunning, slot_of
from .tracing import link_ids
from .transfer import ENVELOPE_TYPES, ResultMeta, Stored, is_envelope, meta_of, opened_ref
from .transports import Held, track

#: After the first failure of a call, how long to keep looking for other ranks failing with
#: it: each further completion within this window extends the look by as much again, up to
#: `FAILURE_GRACE_MAX_SECONDS` in all. Ranks failing together (a bad batch, a shared bug) fail
#: within milliseconds of each other; a rank still running is not waited for.
FAILURE_GRACE_SECONDS = 0.02
FAILURE_GRACE_MAX_SECONDS = 0.04

#: Held only while a call's own lock is made (`RayPendingCall._lock`).
_MAKE_LOCK = threading.Lock()
#: Held only while a call's replies are checked and kept (`RayPendingCall._keep`): the
#: thread collecting a call and one fetching finished calls together may fetch the same
#: replies; one of them keeps them, and they are noted (`received`) once.
_KEEP_LOCK = threading.Lock()

#: How old a look at a call's workers (`RayPendingCall.ask_many`) may be for `done()` to
#: answer from it: a polling loop that asked about many calls at once (`twinkle_core.wait`,
#: `as_completed`, the runtime's bookkeeping) then costs one `ray.wait`, not one per call.
LOOK_FRESH_S = 0.001
#: At most this many refs go into one `ray.wait` of a look.
LOOK_REFS = 256

#: At most this many finished calls are fetched by one `ray.get` (`fetch_finished`).
FETCH_BATCH = 1024


class CallGroup(Protocol):
    """What a call needs of the group it runs on (`workers.RayWorkerGroup`)."""

    class_name: str
    group: DeviceGroup
    #: Weak references to the group's calls found finished and not fetched yet
    #: (`RayPendingCall.ask_many` appends, `fetch_finished` takes).
    finished: collections.deque
    #: The group's unsettled calls in issue order, looked at after a call fetched its own
    #: replies (None in a worker process).
    ahead: ReadAhead | None
    #: The generation the actors are on (each restart makes new ones), and the actors by rank.
    restarts: int
    handles: list[Any]

    def node_of(self, rank: int) -> str | None:
        """The node rank `rank` runs on, for messages."""
        ...

    def relay_lost(self, route: Any) -> None:
        """A relay of `route` died on its own: have new relays started (once)."""
        ...

    def failure(self, rank: int, exc: BaseException) -> WorkerFailure:
        """A worker's error as a `WorkerFailure` (the user's own exception, or a death)."""
        ...

    def on_failures(self, failures: list[WorkerFailure], generation: int | None = None) -> None:
        """What the group does about failures (a death tears it down)."""
        ...


def keep_until_done(refs: list[Any], producers: Sequence[Any]) -> None:
    """Keep the producers' calls (and so their held results, `transports.track`) alive until
    every task of a consuming call finished: a consumer worker may ask a holder for a held
    result after the driver dropped the LazyCollect it came from (`take(make())` drops it at
    once), and the holder must not have forgotten it by then."""
    if not HAS_ON_READY:  # no callbacks: as long as the refs are referenced, at least
        for ref in refs:
            try:
                _KEEP[ref] = producers
            except TypeError:  # refs that cannot be weakly referenced: kept no longer
                pass
        return
    refs = _fetched_refs(refs)  # a relayed call's: one per node
    left = [len(refs)]
    keep = [producers]

    def done(_exc: Any) -> None:  # on Ray's own thread
        left[0] -= 1
        if left[0] == 0:
            keep.clear()

    for ref in refs:
        ref._on_ready(done)


#: Without `_on_ready`: producers kept per consuming ref (weakly keyed where Ray allows).
_KEEP: Any = weakref.WeakKeyDictionary()


class RayPendingCall(PendingCall):
    """One method running on some actors: one result ref per worker.

    Slotted, every attribute set in `__init__`: no `__dict__` per call (an instance dict
    appeared once a call was collected, one more object per call for the garbage collector).
    """

    __slots__ = (
        "__weakref__",
        "_checked",
        "_failures",
        "_known_done",
        "_lock_made",
        "_looked_at",
        "_own_refs",
        "_replies",
        "_seen",
        "_values",
        "generation",
        "method",
        "ranks",
        "value_refs",
        "workers",
    )

    def __init__(
        self,
        workers: CallGroup,
        method: str,
        ranks: Sequence[int],
        value_refs: list[ray.ObjectRef],
        generation: int = 0,
    ) -> None:
        self.workers = workers
        self.method = method
        self.ranks = ranks
        #: One ref per worker: the worker's reply (its result, or a `Stored` or `Held`
        #: envelope); for a relayed call (`RelayedRefs`), the ref of the relay task of the
        #: worker's node, whose list holds the reply (`RelayedRefs.at`).
        self.value_refs = value_refs
        self.generation = generation
        self._failures: list[WorkerFailure] | None = None
        self._replies: list[Any] | None = None  # what the refs hold, envelopes unopened
        self._values: list[Any] | None = None
        #: Replies of finished workers, fetched by done() (made on first use).
        self._checked: dict[int, Any] | None = None
        #: Whether `done()` once answered True: it answers True from then on.
        self._known_done = False
        self._lock_made: threading.Lock | None = None  # made on first use (`_lock`)
        #: Indices of the workers the last look found finished (`ask_many`), and when that
        #: look was (monotonic seconds; never: -inf).
        self._seen: Sequence[int] = ()
        self._looked_at = -math.inf
        #: For a relayed call: one ref per worker of its own, holding its reply (`reply_refs`).
        self._own_refs: list[Any] | None = None

    @property
    def _lock(self) -> threading.Lock:
        """Held while the replies are fetched. Made on first use, not per call: with
        thousands of calls in flight every object a call keeps makes the garbage collector's
        full collections come sooner (each about 60 ms in a driver that imported Ray)."""
        lock = self._lock_made
        if lock is None:
            with _MAKE_LOCK:
                lock = self._lock_made
                if lock is None:
                    lock = self._lock_made = threading.Lock()
        return lock

    # ------------------------------------------------------------------ state
    def _finished(self, ask: bool = False) -> Sequence[int]:
        """Indices of the workers known to have finished (successfully or not).

        From the last look at it when that is at most `LOOK_FRESH_S` old, else from a new
        look; `ask` always looks (after a wait timed out, the error must not call a finished
        rank running, nor miss its failure).
        """
        if ask or time.monotonic() - self._looked_at > LOOK_FRESH_S:
            self.ask_many([self])
        return self._seen

    @classmethod
    def ask_many(cls, calls: list[PendingCall]) -> None:
        """Ask Ray which workers of `calls` have finished and note it on each call (`_seen`):
        one `ray.wait` (timeout 0, nothing fetched) per `LOOK_REFS` results.

        A `ray.wait` costs about 80 us while any of its refs is pending, nearly whatever their
        number up to a few hundred, so `twinkle_core.wait` or `as_completed` over 1000 calls
        asks Ray a few times per round, not 1000. Calls found finished join their group's
        `finished`, to be fetched together by the first of them collected. No completion
        callbacks: each takes the driver's GIL from Ray's own thread, which cost calls in
        flight 20-30% (docs/performance.md)."""
        asked = [c for c in calls if isinstance(c, RayPendingCall) and not _settled(c)]
        start = 0
        while start < len(asked):
            batch, refs = [], []
            for call in asked[start:]:
                if refs and len(refs) + len(call.value_refs) > LOOK_REFS:
                    break
                batch.append(call)
                refs.extend(call.value_refs)
            start += len(batch)
            refs = list(dict.fromkeys(refs))  # `ray.wait` refuses a ref given twice
            now = time.monotonic()
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            found = set(ready)
            is_found = found.__contains__
            for call in batch:
                own = call.value_refs  # the indices of those found, picked in C
                seen = tuple(itertools.compress(range(len(own)), map(is_found, own)))
                call._seen, call._looked_at = seen, now
                if len(seen) == len(call.value_refs) and not call._known_done:
                    call._known_done = True
                    call.workers.finished.append(weakref.ref(call))
                    call._forget()

    @classmethod
    def fetch_many(cls, calls: list[PendingCall], timeout: float | None) -> None:
        """Fetch the replies of `calls` with one `ray.get` of all their refs, as raw Ray code
        gets a list: `twinkle_core.get` then collects each call without a round trip of its
        own. Ray's `ray.get` of a list ends at the first failure (fail fast); on a failure or
        a timeout nothing is kept, and each call's own `wait` raises it."""
        todo = [c for c in calls if isinstance(c, cls) and c._replies is None and not c._failures]
        if not todo:
            return
        refs = [ref for pending in todo for ref in _fetched_refs(pending.value_refs)]
        try:
            replies = ray.get(refs, timeout=timeout)
        except Exception:
            return
        _keep_replies(todo, replies)

    def done(self) -> bool:
        if self._replies is not None or self._failures or self._known_done:
            return True
        if self._is_done():
            self._known_done = True
            self._forget()
            return True
        return False

    def _is_done(self) -> bool:
        finished = self._finished()
        if len(finished) >= len(self.value_refs):
            return True
        # Some finished, some still run: a failure among the finished means waiting would
        # raise at once (fail fast), so the call counts as done.
        checked = self._checked
        if checked is None:
            checked = self._checked = {}
        for i in finished:
            if i in checked:
                if checked[i] is _FAILED:
                    return True
                continue
            try:
                checked[i] = ray.get(self.value_refs[i], timeout=0)
            except Exception:
                checked[i] = _FAILED
                return True
        return False

    def succeeded(self) -> bool:
        """True when every worker finished without error; fetches only the replies (small:
        large results stay in the object store), never waits."""
        if self._failures:
            return False
        if self._replies is not None:
            return True
        if not self.done():
            return False
        lock = self._lock  # the one released below, even if `wait` drops it meanwhile
        if not lock.acquire(blocking=False):
            return False  # another thread is collecting it right now
        try:
            self._fetch_replies(0)
        except Exception:
            return False
        finally:
            lock.release()
        return True

    # ------------------------------------------------------------------ waiting
    def trace_links(self) -> list[str] | None:
        """The Ray task ids of this call's executions, which each actor records with its
        trace event (`tracing.link_ids`)."""
        return link_ids(self)

    def wait(self, timeout: float | None) -> list[Any]:
        values = self._values
        if values is not None:
            return values
        with self._lock:
            if self._values is None:
                deadline = None if timeout is None else time.monotonic() + timeout
                replies = self._fetch_replies(timeout)
                self._values = self._open(replies, deadline)
            values = self._values
        # Final: later callers take the fast path above. A resolved call keeps no lock (one
        # object fewer per call kept for the garbage collector to look at).
        self._lock_made = None
        return values

    def collect(self, collector: Any, device_mesh: Any, timeout: float | None) -> Any:
        """The collected value. A relayed call's large results that core's `sum` or `mean`
        adds are summed node by node where they are (`node_reduce.py`), else on the driver."""
        if type(self.value_refs) is RelayedRefs:
            start = time.monotonic()
            value = reduce_per_node(self, collector, device_mesh, timeout)
            if value is not NOT_REDUCED:
                return value
            if timeout is not None:  # what a chain that failed on the way took is spent
                timeout = max(0.0, timeout - (time.monotonic() - start))
        return collector.collect(self.wait(timeout), device_mesh)

    def wait_meta(self, timeout: float | None) -> list[ResultMeta]:
        """The results' metadata only (large results stay in the object store); fails like
        `wait`."""
        return [meta_of(reply) for reply in self.wait_replies(timeout)]

    def wait_replies(self, timeout: float | None) -> list[Any]:
        """Every worker's reply: small results themselves, large ones as `Stored` or `Held`
        envelopes (the results stay in the object store, or with their producer); fails like
        `wait`."""
        with self._lock:
            return self._fetch_replies(timeout)

    def _fetch_replies(self, timeout: float | None) -> list[Any]:
        """Every worker's reply: one `ray.get` of the list, which fails fast (or of the
        finished calls queued on its group, this one among them: `fetch_finished`)."""
        if self._replies is not None:
            return self._replies
        if self._failures:
            raise WorkersFailedError(self._failures)
        if self.workers.finished:
            fetch_finished(self.workers.finished)  # this call's too, when it has finished
            if self._replies is not None:
                return self._replies
        refs = self.value_refs
        try:
            if type(refs) is RelayedRefs:
                replies = refs.expand(ray.get(refs.nodes, timeout=timeout))
            else:
                replies = ray.get(refs, timeout=timeout)
        except rex.GetTimeoutError:
            finished = set(self._finished(ask=True))
            if not self._failed_among(finished):
                running = [r for i, r in enumerate(self.ranks) if i not in finished]
                raise CallTimeoutError(
                    f"{self.workers.class_name}.{self.method} on group "
                    f"{self.workers.group.name!r} did not finish within {timeout:g}s; "
                    f"ranks still running: {running}. It keeps running there (wait on the "
                    "call again for its result), and the next calls to those ranks start "
                    "when it ends"
                ) from None
            self._raise_failures()
        except Exception:
            self._raise_failures()
        kept = self._keep(replies)
        # The next calls in flight may have finished too: fetched together next (read_ahead.py).
        ahead = self.workers.ahead
        if ahead is not None:
            ahead.after_fetch(_settled, RayPendingCall.ask_many)
        return kept

    def _keep(self, replies: list[Any]) -> list[Any]:
        """Keep `replies` as this call's, unless another thread (`fetch_finished`,
        `fetch_many`) kept them first: the replies kept, noted once (`received`)."""
        with _KEEP_LOCK:
            kept = self._replies
            if kept is None:
                self._replies = kept = replies
        if kept is replies:
            if not self._known_done:  # else `done()` or `ask_many` forgot it already
                self._forget()
            if not ENVELOPE_TYPES.isdisjoint(map(type, replies)):  # most replies: none
                self.received(replies)
        return kept

    def _forget(self) -> None:
        """Settled: the group's read-ahead has nothing left to ask about this call."""
        ahead = self.workers.ahead
        if ahead is not None:
            ahead.forget(self)

    def received(self, replies: list[Any]) -> None:
        """Note envelopes' transport fallbacks (once per method and reason) and have held
        results dropped when this call is garbage."""
        held = False
        for reply in replies:
            kind = type(reply)
            if kind is Stored and reply.why:
                note_fallback(f"{self.workers.class_name}.{self.method}", reply.why)
            elif kind is Held:
                held = True
        if held:
            track(self, replies)

    def relay_slot(self, i: int, exc: BaseException) -> Any:
        """For a relayed call, what the relay reported for worker `i` when its return raised
        `exc` (`relay.slot_of`): its reply, `RelayFailed` or `StillRunning`; `NOT_REPORTED`
        otherwise (a direct call, or the relay died: `exc` is the worker's error)."""
        refs = self.value_refs
        if type(refs) is not RelayedRefs:
            return NOT_REPORTED
        return slot_of(exc, refs.at[i][1])

    def reply_refs(self) -> list[Any]:
        """One ref per worker holding its reply, for handing the results to another group
        (after `wait_replies`). A relayed call's refs are its nodes' lists, so the driver puts
        the replies it fetched, once per call: they are small (large results are `Stored`
        envelopes, which hold refs of their own)."""
        refs = self.value_refs
        if type(refs) is not RelayedRefs:
            return refs
        with self._lock:
            own = self._own_refs
            if own is None:
                own = self._own_refs = [ray.put(reply) for reply in self._fetch_replies(None)]
            return own

    def _failed_among(self, finished: set[int]) -> bool:
        """Whether a worker among `finished` (indices) failed."""
        for i in finished:
            try:
                ray.get(self.value_refs[i], timeout=0)
            except rex.GetTimeoutError:
                continue
            except Exception:
                return True
        return False

    def _open(self, replies: list[Any], deadline: float | None) -> list[Any]:
        """The results, envelopes of large ones opened (one more `ray.get` for all of them)."""
        if ENVELOPE_TYPES.isdisjoint(map(type, replies)):  # the common case, decided in C
            return replies
        stored = [i for i, reply in enumerate(replies) if is_envelope(reply)]
        values = list(replies)
        refs = [opened_ref(replies[i]) for i in stored]
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            inner = ray.get(refs, timeout=timeout)
        except rex.GetTimeoutError:
            raise CallTimeoutError(
                f"{self.workers.class_name}.{self.method} on group {self.workers.group.name!r}: "
                f"its results could not be fetched within {timeout:g}s"
            ) from None
        except Exception:
            failures = []
            for i, ref in zip(stored, refs, strict=True):
                try:
                    ray.get(ref, timeout=0)
                except Exception as exc:
                    failures.append(self.workers.failure(self.ranks[i], exc))
            if not failures:
                raise
            self._failures = failures
            self._forget()
            self.workers.on_failures(failures, self.generation)
            raise WorkersFailedError(failures) from None
        for i, value in zip(stored, inner, strict=True):
            values[i] = value
        return values

    def _raise_failures(self) -> None:
        """Collect every failure known now (and those arriving within the grace), raise them.

        Workers still running are watched: when one of them fails later, its failure is added
        as a note to the exception raised now.
        """
        refs = self.value_refs
        failures: list[WorkerFailure] = []
        #: Relayed workers still running when their relay reported: index -> what the relay
        #: said (`StillRunning`: the worker's own ref, or its node relay's with its place),
        #: looked at (and waited for in the grace) instead of the call's ref.
        late: dict[int, StillRunning] = {}

        def harvest(indices: list[int]) -> list[int]:
            running = []
            for i in indices:
                still = late.get(i)
                try:
                    ray.get(refs[i] if still is None else still.ref, timeout=0)
                except rex.GetTimeoutError:
                    running.append(i)
                except Exception as exc:
                    slot = self.relay_slot(i, exc) if still is None else still.slot(exc)
                    if slot is NOT_REPORTED:  # the worker's own error, or its relay's death
                        # A death on a relayed call may be a relay's (its task ended with no
                        # report, or the worker's ref it owned went with it) while the worker
                        # lives: `lost_in_relay` asks.
                        lost = self.lost_in_relay(i, exc)
                        if lost is not None:
                            failures.append(lost)
                            continue
                        failure = self.workers.failure(self.ranks[i], exc)
                        if type(refs) is RelayedRefs and (still is None or still.index is not None):
                            _note_relay_death(failure, exc)  # a relay task's death
                        failures.append(failure)
                    elif type(slot) is RelayFailed:
                        # The worker's own error, or (a peer relay of a branch died) the
                        # peer relay's death.
                        error = slot.raised()
                        lost = self.lost_in_relay(i, error)
                        failures.append(
                            lost if lost is not None else self.workers.failure(self.ranks[i], error)
                        )
                    elif type(slot) is StillRunning:
                        late[i] = slot
                        running.append(i)
            return running

        running = harvest(list(range(len(refs))))
        end = time.monotonic() + FAILURE_GRACE_MAX_SECONDS
        while running and time.monotonic() < end:
            step = min(FAILURE_GRACE_SECONDS, max(0.0, end - time.monotonic()))
            ready, _ = ray.wait(
                list(dict.fromkeys([late[i].ref if i in late else refs[i] for i in running])),
                num_returns=1,
                timeout=step,
                fetch_local=False,
            )
            if not ready and failures:
                break
            running = harvest(running)
        if not failures:
            raise RuntimeError(
                f"{self.workers.class_name}.{self.method}: Ray reported a failure that no "
                "worker's result shows"
            )
        self._failures = sorted(failures, key=lambda f: f.rank)
        self._forget()
        self.workers.on_failures(self._failures, self.generation)
        if running:
            LATE_FAILURES.watch(self, running, self._failures[0], late)
        raise WorkersFailedError(self._failures)

    def lost_in_relay(self, i: int, exc: BaseException) -> WorkerFailure | None:
        """Worker `i`'s failure when a relay died on its own (the error is a death, the
        worker's relay is dead and the worker alive: `Route.relay_died_alone`):
        `CallLostError`, and the group's relays are replaced (`rerouting.py`); None when the
        death stands for the worker (it or its node died, or the group restarted since)."""
        workers = self.workers
        if (
            type(self.value_refs) is not RelayedRefs
            or not isinstance(exc, DEATH_ERRORS)
            or self.generation != workers.restarts
        ):
            return None
        rank = self.ranks[i]
        if not self.value_refs.route.relay_died_alone(rank, workers.handles[rank]):
            return None
        node = workers.node_of(rank)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        lost = CallLostError(
            f"{workers.class_name}.{self.method} on group {workers.group.name!r}: the relay "
            f"that handed this call to rank {rank} (node {node or '?'}) {how_it_died(exc)} "
            f"({type(exc).__name__}: {reason[:200]}); rank {rank} is alive, but whether it ran "
            "this call is unknown. The workers and their state are intact and no restart is "
            "spent: twinkle starts new relays and later calls go through them. Call again if "
            "the call is safe to repeat (docs/ray.md, Relays)"
        )
        workers.relay_lost(self.value_refs.route)
        return WorkerFailure(rank, lost, node, str(exc))


_FAILED = object()


def _note_relay_death(failure: WorkerFailure, exc: BaseException) -> None:
    """A relayed worker's failure read from its relay's task, which ended in a death: the
    relay died (with its node, or alone), and a branch's first relay dying ends the calls of
    every node of its branch, so say that the worker itself may be alive."""
    if isinstance(exc, DEATH_ERRORS):
        add_note(
            failure.exception,
            f"twinkle: rank {failure.rank}'s call went through a relay (its node's, or its "
            "branch's first), and that relay's task ended with this death: the relay died, "
            f"with its node or alone; rank {failure.rank} itself may still be alive "
            "(docs/ray.md, Relays)",
        )


def _settled(call: RayPendingCall | None) -> bool:
    """Whether there is nothing left to ask Ray about `call`: gone, fetched, failed or known
    to have finished."""
    return call is None or call._known_done or call._replies is not None or bool(call._failures)


def fetch_finished(finished: collections.deque) -> None:
    """Fetch the replies of the finished, unfetched calls queued in `finished` (one group's,
    `CallGroup.finished`) in one `ray.get`, where raw Ray code would `ray.get` a list of refs;
    calls with a failure among them are left to fetch their own."""
    calls = []
    while finished and len(calls) < FETCH_BATCH:
        try:
            pending = finished.popleft()()
        except IndexError:  # another thread took the last one
            break
        if pending is not None and pending._replies is None and not pending._failures:
            calls.append(pending)
    if not calls:
        return
    refs = [ref for pending in calls for ref in _fetched_refs(pending.value_refs)]
    try:
        replies = ray.get(refs, timeout=0)  # all finished: nothing to wait for
    except Exception:
        return
    _keep_replies(calls, replies)


def _keep_replies(calls: list[RayPendingCall], replies: list[Any]) -> None:
    """Give each of `calls` its share of `replies`, fetched from their refs in turn
    (`_fetched_refs`), unless another thread gave it first."""
    start = 0
    for pending in calls:
        own = pending.value_refs
        relayed = type(own) is RelayedRefs
        stop = start + (len(own.nodes) if relayed else len(own))
        if pending._replies is None:
            pending._keep(own.expand(replies[start:stop]) if relayed else replies[start:stop])
        start = stop


def _fetched_refs(refs: list[Any]) -> list[Any]:
    """The refs a call's replies are fetched from: one per worker, or a relayed call's one per
    node."""
    return refs.nodes if type(refs) is RelayedRefs else refs

"""The workers of one remote class on Ray, and calls in flight on them.

`RayWorkerGroup` holds one actor handle per worker and is picklable, so a driver object passed
into another group's worker can be called from there. A call is one actor task per worker with
exactly the user's arguments (`handle.<method>.remote(...)`) and one return value.

`RayPendingCall` collects all workers with one `ray.get` of the list, which raises as soon as
any worker failed (fail fast); only then are the workers looked at one by one: every failure
known at that moment is raised together (ranks failing within `FAILURE_GRACE_SECONDS` of each
other are grouped), and failures arriving later are added as notes to the exception already
raised. A dead actor tears its whole group down. Completion is tracked with callbacks, so
`done()` costs no Ray call.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import ray
import ray.exceptions as rex

from twinkle_core import CallTimeoutError, DeviceGroup, DeviceMesh, LazyCollect, WorkerDiedError
from twinkle_core.plugin import (
    BUILTIN_DISPATCHERS,
    CompletedCall,
    ConcatCollector,
    FirstCollector,
    FlattenCollector,
    LastPPCollector,
    MeanCollector,
    NoneCollector,
    PendingCall,
    SumCollector,
    WorkerCall,
    WorkerFailure,
    WorkerGroup,
    WorkerPlacement,
    WorkersFailedError,
    add_note,
    combine,
    flatten_lists,
    format_remote_traceback,
    note_fallback,
    rebuilt,
)

from .actor import RESERVED_PREFIX
from .payload_check import checked_arguments
from .transfer import (
    RemoteArray,
    RemoteCollected,
    RemoteStacked,
    RemoteValue,
    ResultMeta,
    Stored,
    has_unknown,
    is_envelope,
    meta_of,
    mirror,
    opened_ref,
    register_tensor_serializer,
    tree_of,
)
from .transports import Held, before_submit, held_replies, track

#: Ray errors that mean the worker process (or its node) is gone, not that user code raised.
DEATH_ERRORS: tuple[type[BaseException], ...] = (
    rex.RayActorError,
    rex.WorkerCrashedError,
    rex.NodeDiedError,
    rex.OutOfMemoryError,
    rex.LocalRayletDiedError,
    rex.ObjectLostError,
)

log = logging.getLogger("twinkle")


def how_it_died(exc: BaseException) -> str:
    """Words for a death error: a lost node reads differently from a crashed process.

    An actor whose node is killed without warning first shows as unreachable
    (`ActorUnavailableError`, about 2 s after the loss, while the cluster still lists the node
    as alive for a while); with `max_restarts=0` it never comes back, so it counts as dead.
    """
    text = str(exc)
    if isinstance(exc, rex.NodeDiedError) or "node has died" in text or "node died" in text:
        return "died with its node"
    if isinstance(exc, rex.ActorUnavailableError):
        return "died or became unreachable (its process or its whole node is gone)"
    return "died"


_SMALL = (type(None), bool, int, float, complex)


def _is_small(value: Any) -> bool:
    if isinstance(value, _SMALL):
        return True
    return isinstance(value, (str, bytes)) and len(value) < 1024


#: After the first failure of a call, how long to keep looking for other ranks failing with
#: it: each further completion within this window extends the look by as much again, up to
#: `FAILURE_GRACE_MAX_SECONDS` in all. Ranks failing together (a bad batch, a shared bug) fail
#: within milliseconds of each other; a rank still running is not waited for.
FAILURE_GRACE_SECONDS = 0.02
FAILURE_GRACE_MAX_SECONDS = 0.04

#: Whether this Ray can call back when an object exists without fetching it.
_HAS_ON_READY = hasattr(ray.ObjectRef, "_on_ready")

#: Held only while a call's own lock is made (`RayPendingCall._lock`).
_MAKE_LOCK = threading.Lock()

#: How old a look at a call's workers (`RayPendingCall.ask_many`) may be for `done()` to
#: answer from it: a polling loop that asked about many calls at once (`twinkle_core.wait`,
#: `as_completed`, the runtime's bookkeeping) then costs one `ray.wait`, not one per call.
LOOK_FRESH_S = 0.001
#: At most this many refs go into one `ray.wait` of a look.
LOOK_REFS = 256


def keep_until_done(refs: list[Any], producers: Sequence[Any]) -> None:
    """Keep the producers' calls (and so their held results, `transports.track`) alive until
    every task of a consuming call finished: a consumer worker may ask a holder for a held
    result after the driver dropped the LazyCollect it came from (`take(make())` drops it at
    once), and the holder must not have forgotten it by then."""
    if not _HAS_ON_READY:  # no callbacks: as long as the refs are referenced, at least
        for ref in refs:
            try:
                _KEEP[ref] = producers
            except TypeError:  # refs that cannot be weakly referenced: kept no longer
                pass
        return
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


class Shipper:
    """Puts each object shared by several workers' arguments into the object store once.

    `slice_dp` hands tp/pp peers the very same shard object and `dispatch='all'` every worker
    the same arguments: one `ray.put` per distinct object (by identity) and the same ref to
    each receiver, instead of one inline copy per worker. Ray resolves top-level refs before
    the method runs, so the worker sees the value.
    """

    def __init__(self, per_call: list[tuple[tuple, dict]]) -> None:
        self.counts = collections.Counter(
            id(v) for args, kwargs in per_call for v in (*args, *kwargs.values())
        )
        self.refs: dict[int, ray.ObjectRef] = {}
        self.puts = 0

    def ship(self, value: Any) -> Any:
        if self.counts[id(value)] < 2 or _is_small(value) or isinstance(value, ray.ObjectRef):
            return value
        ref = self.refs.get(id(value))
        if ref is None:
            ref = self.refs[id(value)] = ray.put(value)
            self.puts += 1
        return ref

    def ship_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(self.ship(a) for a in args), {k: self.ship(v) for k, v in kwargs.items()}


def ship_all(calls: list[WorkerCall]) -> list[tuple[tuple, dict]]:
    """Each call's arguments, objects shared between calls put in the object store once."""
    shared = False
    if len(calls) > 1:
        seen: set[int] = set()
        for call in calls:
            for v in (*call.args, *call.kwargs.values()):
                if not _is_small(v):
                    if id(v) in seen:
                        shared = True
                        break
                    seen.add(id(v))
            if shared:
                break
    if not shared:
        return [(c.args, c.kwargs) for c in calls]
    shipper = Shipper([(c.args, c.kwargs) for c in calls])
    return [shipper.ship_call(c.args, c.kwargs) for c in calls]


class _CallArguments(threading.local):
    """What this thread's next call carries besides its arguments, set while they were
    resolved (`resolve_argument`): whether they hold remote placeholders, the producers'
    results they hold, and the producers' calls to keep alive until the call finished. Class
    defaults, so a call without any reads them without a failed lookup."""

    placeholders: bool = False
    held: dict | None = None
    producers: tuple = ()


class RayPendingCall(PendingCall):
    """One method running on some actors: one result ref per worker.

    The state a call may never need starts as class attributes, set on the instance only when
    it changes: a call in flight costs five attribute stores, not twelve.
    """

    _failures: list[WorkerFailure] | None = None
    _replies: list[Any] | None = None  # what the refs hold, envelopes unopened
    _values: list[Any] | None = None
    #: Replies of finished workers, fetched by done() (made on first use).
    _checked: dict[int, Any] | None = None
    #: Whether `done()` once answered True: it answers True from then on.
    _known_done = False
    _lock_made: threading.Lock | None = None  # made on first use (`_lock`)
    #: Indices of the workers the last look found finished (`ask_many`), and when that look
    #: was (monotonic seconds; never: -inf).
    _seen: Sequence[int] = ()
    _looked_at = -math.inf

    def __init__(
        self,
        workers: RayWorkerGroup,
        method: str,
        ranks: Sequence[int],
        value_refs: list[ray.ObjectRef],
        generation: int = 0,
    ) -> None:
        self.workers = workers
        self.method = method
        self.ranks = ranks
        #: One ref per worker: the worker's reply (its result, or a `Stored` envelope).
        self.value_refs = value_refs
        self.generation = generation

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
            for call in batch:
                seen = tuple([i for i, ref in enumerate(call.value_refs) if ref in found])
                call._seen, call._looked_at = seen, now
                if len(seen) == len(call.value_refs) and not call._known_done:
                    call._known_done = True
                    call.workers.finished.append(weakref.ref(call))

    def done(self) -> bool:
        if self._replies is not None or self._failures or self._known_done:
            return True
        if self._is_done():
            self._known_done = True
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
        if not self.done() or not self._lock.acquire(blocking=False):
            return False  # still running, or another thread is collecting it right now
        try:
            self._fetch_replies(0)
        except Exception:
            return False
        finally:
            self._lock.release()
        return True

    # ------------------------------------------------------------------ waiting
    def wait(self, timeout: float | None) -> list[Any]:
        with self._lock:
            if self._values is None:
                deadline = None if timeout is None else time.monotonic() + timeout
                replies = self._fetch_replies(timeout)
                self._values = self._open(replies, deadline)
            return self._values

    def wait_meta(self, timeout: float | None) -> list[ResultMeta]:
        """The results' metadata only (large results stay in the object store); fails like
        `wait`."""
        return [meta_of(reply) for reply in self.wait_replies(timeout)]

    def wait_replies(self, timeout: float | None) -> list[Any]:
        """Every worker's reply: small results themselves, large ones as `Stored` envelopes
        (which stay in the object store); fails like `wait`."""
        with self._lock:
            return self._fetch_replies(timeout)

    def _fetch_replies(self, timeout: float | None) -> list[Any]:
        """Every worker's reply: one `ray.get` of the list, which fails fast."""
        if self._replies is not None:
            return self._replies
        if self._failures:
            raise WorkersFailedError(self._failures)
        if self.workers.finished:
            self.workers.fetch_finished()  # this call's replies too, when it has finished
            if self._replies is not None:
                return self._replies
        try:
            replies = ray.get(self.value_refs, timeout=timeout)
        except rex.GetTimeoutError:
            finished = set(self._finished(ask=True))
            if not self._failed_among(finished):
                running = [r for i, r in enumerate(self.ranks) if i not in finished]
                raise CallTimeoutError(
                    f"{self.workers.class_name}.{self.method} on group "
                    f"{self.workers.group.name!r} did not finish within {timeout:g}s; "
                    f"ranks still running: {running}"
                ) from None
            self._raise_failures()
        except Exception:
            self._raise_failures()
        self.received(replies)
        self._replies = replies
        return replies

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
        stored = [i for i, reply in enumerate(replies) if is_envelope(reply)]
        if not stored:
            return replies
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

        def harvest(indices: list[int]) -> list[int]:
            running = []
            for i in indices:
                try:
                    ray.get(refs[i], timeout=0)
                except rex.GetTimeoutError:
                    running.append(i)
                except Exception as exc:
                    failures.append(self.workers.failure(self.ranks[i], exc))
            return running

        running = harvest(list(range(len(refs))))
        end = time.monotonic() + FAILURE_GRACE_MAX_SECONDS
        while running and time.monotonic() < end:
            step = min(FAILURE_GRACE_SECONDS, max(0.0, end - time.monotonic()))
            ready, _ = ray.wait(
                [refs[i] for i in running], num_returns=1, timeout=step, fetch_local=False
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
        self.workers.on_failures(self._failures, self.generation)
        if running:
            _late_failures.watch(self, running, self._failures[0])
        raise WorkersFailedError(self._failures)


_FAILED = object()


def _settled(call: RayPendingCall | None) -> bool:
    """Whether there is nothing left to ask Ray about `call`: gone, fetched, failed or known
    to have finished."""
    return call is None or call._known_done or call._replies is not None or bool(call._failures)


class LateFailures:
    """Adds a note to an exception already raised when another rank of its call fails later.

    Completion callbacks only queue the finished worker (they run on Ray's own thread, where
    fetching is not allowed); one daemon thread, started on first use, looks at the result.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def watch(self, pending: RayPendingCall, indices: list[int], first: WorkerFailure) -> None:
        if not _HAS_ON_READY:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="twinkle-late-failures", daemon=True
                )
                self._thread.start()
        raised_at = time.monotonic()
        for i in indices:
            item = (pending, i, first, raised_at)
            pending.value_refs[i]._on_ready(lambda exc, item=item: self._queue.put(item))

    def _run(self) -> None:
        while True:
            pending, i, first, raised_at = self._queue.get()
            try:
                ray.get(pending.value_refs[i], timeout=0)
            except Exception as exc:
                try:
                    late = pending.workers.failure(pending.ranks[i], exc)
                    node = f" on node {late.node}" if late.node else ""
                    add_note(
                        first.exception,
                        f"twinkle: rank {late.rank}{node} also failed, "
                        f"{time.monotonic() - raised_at:.2f}s after this error was raised: "
                        f"{type(late.exception).__name__}: {late.exception}",
                    )
                except Exception as note_error:  # never let the watcher die
                    log.debug("twinkle: could not note a late failure: %s", note_error)


_late_failures = LateFailures()


class RayWorkerGroup(WorkerGroup):
    """One actor per worker; picklable (handles travel), so workers can call other groups."""

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
    ) -> None:
        super().__init__(group, device_mesh, class_name, len(placements), placements)
        self.run_name = run_name
        self.restartable = restartable
        #: Whether the actors are declared for Ray Direct Transport (`backend.actor_class`).
        self.direct_transport = direct_transport
        #: Methods the actors expose under their own name (see `actor.actor_class_for`).
        self.direct = direct
        #: Driver-side only: rebuilds every actor of the group (set by the backend).
        self.restarter: Any = None
        self.restarts = 0
        self.torn_down: str | None = None
        self._local = _CallArguments()
        #: Held while one call's tasks are handed to Ray, so that every rank receives the
        #: calls of this process in the same order (Ray keeps each caller's order per actor):
        #: two driver threads calling at once must not run as call A then B on rank 0 and B
        #: then A on rank 1, which would pair mismatched results and deadlock collectives.
        self._send_lock = threading.Lock()
        self._methods: dict[tuple[int, str], Any] = {}
        #: Calls of this group whose workers all finished, not yet fetched (weak references,
        #: appended by `RayPendingCall.ask_many`): fetched together by `fetch_finished`.
        self.finished: collections.deque = collections.deque()
        self.handles = handles
        #: This generation's `TWINKLE_WORKER_GROUP` (names its transport groups).
        self.tag = ""

    @property
    def handles(self) -> list[Any]:
        return self._handles

    @handles.setter
    def handles(self, handles: list[Any]) -> None:
        self._handles = handles
        self._methods = {}  # bound to the previous actors

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_local", None)
        state.pop("_send_lock", None)
        state.pop("finished", None)
        state["_methods"] = {}
        state["restarter"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = _CallArguments()
        self._send_lock = threading.Lock()
        self.finished = collections.deque()

    #: At most this many finished calls are fetched by one `ray.get`.
    FETCH_BATCH = 1024

    def fetch_finished(self) -> None:
        """Fetch the replies of every finished, unfetched call of this group in one `ray.get`
        (where raw Ray code would `ray.get` a list of refs); calls with a failure among them
        are left to fetch their own."""
        queue = self.finished
        calls = []
        while queue and len(calls) < self.FETCH_BATCH:
            try:
                pending = queue.popleft()()
            except IndexError:  # another thread took the last one
                break
            if pending is not None and pending._replies is None and not pending._failures:
                calls.append(pending)
        if not calls:
            return
        refs = [ref for pending in calls for ref in pending.value_refs]
        try:
            replies = ray.get(refs, timeout=0)  # all finished: nothing to wait for
        except Exception:
            return
        start = 0
        for pending in calls:
            stop = start + len(pending.value_refs)
            if pending._replies is None:
                pending.received(replies[start:stop])
                pending._replies = replies[start:stop]
            start = stop

    def actor_method(self, rank: int, method: str) -> Any:
        """The Ray actor method that runs `method` on worker `rank` (cached per handle)."""
        key = (rank, method)
        bound = self._methods.get(key)
        if bound is None:
            bound = self._methods[key] = getattr(self._handles[rank], method)
        return bound

    # ------------------------------------------------------------------ failures
    def node_of(self, rank: int) -> str | None:
        return self.placements[rank].node if rank < len(self.placements) else None

    def failure(self, rank: int, exc: BaseException) -> WorkerFailure:
        """A worker's failure as a WorkerFailure: the user's own exception, or a death."""
        node = self.node_of(rank)
        if isinstance(exc, DEATH_ERRORS):
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            after = (
                "twinkle restarts the whole group (restart is on for it): every worker is "
                "rebuilt from its constructor, so state since then is lost"
                if self.restartable
                else "twinkle tore down the whole group, whose other ranks would hang in their "
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

    def on_failures(self, failures: list[WorkerFailure], generation: int | None = None) -> None:
        """Tear the group down (and restart it when configured) after a worker died.

        A call made before the last restart (`generation` older than `restarts`) reports its
        own deaths but leaves the rebuilt group alone.
        """
        died = [f for f in failures if isinstance(f.exception, WorkerDiedError)]
        if not died or self.torn_down is not None:
            return
        if generation is not None and generation != self.restarts:
            return
        first = died[0]
        reason = f"rank {first.rank} on node {first.node or '?'} died"
        self.teardown(reason)
        if self.restarter is not None:
            self.restarts += 1
            try:
                self.restarter(self.restarts)
            except Exception as exc:  # the group stays torn down; the death is still raised
                self.torn_down = f"{reason}, and its restart failed: {exc}"
                log.error("twinkle: restarting group %r failed: %s", self.group.name, exc)
                first.exception.add_note(
                    f"twinkle: restarting group {self.group.name!r} failed, so it stays torn "
                    f"down: {type(exc).__name__}: {exc}"
                )
                return
            self.torn_down = None

    def teardown(self, reason: str) -> None:
        """Kill every actor of this group (a torch.distributed group cannot lose one rank)."""
        self.torn_down = reason
        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already dead, or the cluster is gone
                pass

    # ------------------------------------------------------------------ calls
    def submit(
        self,
        method: str,
        calls: list[WorkerCall],
        *,
        collector: Any = None,
        device_mesh: Any = None,
    ) -> PendingCall:
        local = self._local
        has_remote = local.placeholders
        if has_remote:
            local.placeholders = False
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
        register_tensor_serializer()
        held = local.held
        rdt = None
        producers: tuple = ()
        if held:
            local.held = None
            producers, local.producers = local.producers, ()
            if has_remote:
                rdt = before_submit(self, calls, held)  # queues the producers' sends first
        has_arguments = False
        for c in calls:  # a loop, not any(<generator>): this runs on every call
            if c.args or c.kwargs:
                has_arguments = True
                break
        if has_arguments:
            # Arguments Ray would ship wrongly (an open file, a lock) are refused before
            # anything is sent, and one that does not pickle is named without its value.
            with checked_arguments(self.class_name, method, calls):
                refs = self._send(method, calls, has_remote, rdt)
        else:  # the common no-argument call: nothing to ship or check
            refs = self._send(method, calls, has_remote, rdt, has_arguments=False)
        if producers:
            keep_until_done(refs, producers)
        # The ranks as a tuple of ints, which the garbage collector stops tracking.
        return RayPendingCall(self, method, tuple([c.rank for c in calls]), refs, self.restarts)

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
        call taking results Ray Direct Transport carries also takes their refs (`rdt`)."""
        shipped = ship_all(calls) if has_arguments else [((), {})] * len(calls)
        if rdt:
            return self._send_rdt(method, calls, shipped, rdt)
        with self._send_lock:  # submitting only: never waits on a worker
            if not has_remote and method in self.direct:
                return [
                    self.actor_method(call.rank, method).remote(*args, **kwargs)
                    for call, (args, kwargs) in zip(calls, shipped, strict=True)
                ]
            return [
                self.actor_method(call.rank, f"{RESERVED_PREFIX}call").remote(
                    method, has_remote, *args, **kwargs
                )
                for call, (args, kwargs) in zip(calls, shipped, strict=True)
            ]

    def _send_rdt(
        self,
        method: str,
        calls: list[WorkerCall],
        shipped: list[tuple[tuple, dict]],
        rdt: dict[int, list[tuple[str, Any]]],
    ) -> list[Any]:
        with self._send_lock:
            refs = []
            for i, (call, (args, kwargs)) in enumerate(zip(calls, shipped, strict=True)):
                pairs = rdt.get(i, ())
                keys = tuple(k for k, _ in pairs)
                bound = self.actor_method(call.rank, f"{RESERVED_PREFIX}call_rdt")
                refs.append(bound.remote(method, keys, *(r for _, r in pairs), *args, **kwargs))
            return refs

    # ------------------------------------------------------------------ chaining
    def resolve_argument(self, value: LazyCollect, dispatcher: Any = None) -> Any:
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
        if dispatcher is not None and type(dispatcher) not in _PLACEHOLDER_DISPATCHERS:
            return value()
        try:
            replies = pending.wait_replies(None)
        except (WorkersFailedError, CallTimeoutError):
            return value()  # raises the producer's failure, tagged with its call site
        placeholder = build_placeholder(
            source.collector, source.device_mesh, pending.value_refs, replies, dispatcher
        )
        if placeholder is None:
            return value()
        self._local.placeholders = True
        held = held_replies(pending.value_refs, replies)
        if held:
            mine = self._local.held or {}
            mine.update({ref: (h, pending.workers) for ref, h in held.items()})
            self._local.held = mine
            self._local.producers = (*self._local.producers, pending)
        return placeholder


#: Dispatchers known to treat a stand-in exactly like the value (dicts, lists and tuples
#: walked or split, arrays only measured and sliced along dim 0).
_PLACEHOLDER_DISPATCHERS = tuple(type(d) for d in BUILTIN_DISPATCHERS.values())
_ALL = type(BUILTIN_DISPATCHERS["all"])


class _Fallback(Exception):
    """A collected value no placeholder can stand for: it is collected on the driver."""


#: Collectors whose value placeholders can stand for (exactly these classes: a subclass may
#: collect differently).
_STRUCTURAL = (NoneCollector, FirstCollector, LastPPCollector, FlattenCollector)
_REDUCING = (SumCollector, MeanCollector)
_SELECTING = (NoneCollector, FirstCollector, LastPPCollector)


def build_placeholder(
    collector: Any,
    mesh: DeviceMesh,
    refs: list[ray.ObjectRef],
    replies: list[Any],
    dispatcher: Any = None,
) -> Any | None:
    """A stand-in for `collector.collect(results, mesh)` that dispatchers treat the same way:
    the collected value's dicts, lists and tuples are real, its arrays are `RemoteArray`s
    (sliceable along dim 0) and other leaves `RemoteValue`s, over the producer's results in the
    object store (`refs`: the replies' refs; `replies`: what they hold, envelopes unopened).
    With `dispatch='all'` (when the caller names it) one `RemoteCollected` does: nobody slices.
    None when no placeholder can stand for it (a custom collector, an unusual structure, or
    values the collector could not combine): the driver collects it then, and raises what the
    collector raises."""
    kind = type(collector)
    if kind not in _STRUCTURAL and kind not in _REDUCING and kind is not ConcatCollector:
        return None
    if not replies:
        return None
    used = collector.used_results(mesh, len(replies))
    if type(dispatcher) is _ALL and kind in _SELECTING:
        # Every consumer gets the whole value: collect it on the consumer, whatever its shape
        # (these collectors only pick results, so they cannot fail there instead of here).
        slots: list[Any] = [None] * len(replies)
        for i in used:
            reply = replies[i]
            slots[i] = reply.ref if type(reply) is Stored else refs[i]  # Held: the reply
        return RemoteCollected(slots, collector, mesh)
    mirrors: list[Any] = [None] * len(replies)
    for i in used:
        reply = replies[i]
        if type(reply) is Stored:
            tree, ref = reply.meta.tree, reply.ref  # the stored result itself: one hop less
        elif type(reply) is Held:
            tree, ref = reply.meta.tree, refs[i]  # the consumer receives it (transports.py)
        else:
            tree, ref = tree_of(reply), refs[i]
        if has_unknown(tree):
            return None
        mirrors[i] = mirror(tree, ref)
    try:
        if kind in _STRUCTURAL:
            return collector.collect(mirrors, mesh)
        reps = [mirrors[i] for i in used]
        if kind is ConcatCollector:
            return combine(reps, _concat_placeholders)
        return combine(reps, lambda values: _reduce_placeholders(values, collector))
    except Exception:  # _Fallback, or the collector would fail: let the driver raise it
        return None


def _concat_placeholders(values: list) -> Any:
    """`concat` of one leaf of every shard, as core's collector does it (a leaf that is an
    array of one kind for all shards, a list, or a plain value per shard)."""
    first = values[0]
    if isinstance(first, list):
        return flatten_lists(values)
    if isinstance(first, RemoteArray) and all(
        isinstance(v, RemoteArray)
        and v.reduce is None
        and (v.kind, v.dtype, v.inner, v.path) == (first.kind, first.dtype, first.inner, first.path)
        for v in values
    ):
        parts = [part for v in values for part in v.parts]
        return RemoteArray(parts, first.kind, first.path, first.inner, first.dtype)
    if isinstance(first, RemoteValue) and all(
        isinstance(v, RemoteValue) and v.path == first.path for v in values
    ):
        return RemoteStacked([v.ref for v in values], ConcatCollector(), first.path)
    raise _Fallback


def _reduce_placeholders(values: list, collector: Any) -> Any:
    """`sum`/`mean` of one leaf of every shard, computed by the consumer (on only its share
    when the result is an array that `slice_dp` slices)."""
    first = values[0]
    if isinstance(first, RemoteArray) and all(
        isinstance(v, RemoteArray)
        and v.reduce is None
        and len(v.parts) == 1
        and (v.kind, v.dtype, v.shape, v.path) == (first.kind, first.dtype, first.shape, first.path)
        for v in values
    ):
        parts = [v.parts[0] for v in values]
        return RemoteArray(parts, first.kind, first.path, first.inner, first.dtype, collector)
    if isinstance(first, RemoteValue) and all(
        isinstance(v, RemoteValue) and v.path == first.path for v in values
    ):
        return RemoteCollected([v.ref for v in values], collector, None, first.path)
    if type(collector) is SumCollector and all(type(v) is list for v in values):
        return [item for v in values for item in v]  # `+` of lists joins them
    raise _Fallback

"""One hop per node: a call to a group spanning several nodes goes once to a relay on each node,
which hands it to that node's workers and gathers their replies; the driver reaches the relays
through one task per branch of nodes.

Without a relay the driver submits one actor task per worker and receives one reply per worker,
so its time per call grows with the workers (about 0.3 ms of driver CPU per worker here, most
of a second per call at a thousand workers). With relays each relay (`NodeRelay`, an async
actor with no CPU of its own, in the placement group bundle of its node's first worker)
submits its node's tasks and returns the node's replies, in one list, as the one return value
of its own task. The relays form branches of `relay_fanout` nodes (`Route`): the driver sends
one task per branch, to its first relay (`NodeRelay.branch`), which hands each other node's
share to that node's relay and returns every reply of the branch in one list; a call reaching
one node of a branch goes to that node's relay straight. The driver owns one ref per node
(`RelayedRefs`: one entry per worker, the ref of the worker's node, and where in that node's
list its reply sits); `pending.py` fetches the node lists and takes each worker's reply from
its node's. Where a worker's result must have a ref of its own (a hand-off to another group, a
held result), the driver puts the reply it fetched (small: large results are `transfer.Stored`
envelopes) once for the call (`RayPendingCall.reply_refs`).

Why these choices (docs/ray.md, "Relays"):

- **One list per node, not the workers' refs.** A relay returning the workers' own refs makes
  the driver a borrower of refs it does not own: measured here, that costs the driver more than
  submitting the tasks itself (1.1-1.2x raw Ray's driver CPU, 2x the wall time). Replies are
  small (large results are already envelopes, `transfer.Stored`), so the relay sends them back
  with its own task. One return value per worker (`num_returns`) kept a ref per worker, but
  Ray's cost per return value held the driver at 0.30-0.34x raw Ray's CPU at 32 workers on 2
  nodes; with one list per node it is 0.23x (docs/performance.md, case 23).
- **Ordered by sequence number.** Ray keeps one caller's order per actor, and the workers' only
  caller is now the relay; the relay is async (replies of many calls gathered at once), and an
  async actor does not promise to start tasks in submission order, so each submission carries
  a number and waits for its turn (`NodeRelay._turn`) before submitting.
- **Everything through the relay.** A task the driver sent straight to a relayed worker could
  overtake the calls still in the relay. Calls, held-result sends, collective joins and
  colocated constructors all go through it (`remote_on` for the single tasks).
- **Branches.** Each task the driver sends costs it about as much whether it goes to a worker
  or to a relay, so with one relay per node its cost still grows with the nodes; a branch's
  first relay takes that work off it (one task per 8 nodes by default), at the price of one
  more hop for the branch's other nodes. The numbers stay the driver's (one counter per
  relay), so a relay keeps one order whoever hands it a call.
- **Failures.** A relay whose node had a failure raises `NodeFailed`: its task's return is
  then an error, and the driver's one `ray.get` of the call fails fast as for direct tasks.
  A branch's first relay does the same at the first failure of any of its nodes, with the
  failed node's slots as that relay reported them and, for a node still running,
  `StillRunning` holding that node's relay task and the worker's place in its list.
  The error holds each worker's slot: its reply, `RelayFailed` (its own result ref, which
  raises the worker's error exactly) or `StillRunning` (its ref, watched for a late failure);
  `pending.py` reads them (`slot_of`).
"""

from __future__ import annotations

import asyncio
import operator
import queue
import threading
from typing import Any

import ray
import ray.exceptions

from twinkle_core import CallLostError

from .deaths import actor_state
from .submission import Submitters, actor_method

#: How long the driver waits for a relay to hand a single task on (`Route.submit`).
SUBMIT_TIMEOUT_S = 120.0
#: At most this many worker tasks' links a relay keeps for a traced run (`NodeRelay.links`).
LINKS_MAX = 1_000_000


class RelayFailed:
    """A worker's failure, returned by its node's relay in the worker's slot: the worker's own
    result `ref` (owned by the relay), whose `ray.get` raises the error exactly as it would
    have for the driver's own ref (an exception object sent on by the relay would be pickled
    again, and not every exception survives that), or the `error` the relay got submitting."""

    __slots__ = ("error", "ref")

    def __init__(self, ref: Any = None, error: BaseException | None = None) -> None:
        self.ref = ref
        self.error = error

    def __reduce__(self):
        return (RelayFailed, (self.ref, self.error))

    def raised(self, timeout: float = 60.0) -> BaseException:
        """The worker's error, as `ray.get` of its own ref raises it."""
        if self.ref is None:
            return self.error or RuntimeError("twinkle: a relay reported a failure without one")
        try:
            ray.get(self.ref, timeout=timeout)
        except Exception as exc:
            return exc
        return RuntimeError("twinkle: a relay reported a failure whose result is a value")


class StillRunning:
    """A worker still running when its relay reported the first failure: `ref` is the
    worker's own result (owned by the relay), watched for a late failure; or, for a worker of
    another node of a branch (`NodeRelay.branch`), the ref of that node's relay task, whose
    list (or `NodeFailed`) holds the worker's slot at `index`."""

    __slots__ = ("index", "ref")

    def __init__(self, ref: Any, index: int | None = None) -> None:
        self.ref = ref
        self.index = index

    def __reduce__(self):
        return (StillRunning, (self.ref, self.index))

    def slot(self, exc: BaseException) -> Any:
        """What `ref` raising `exc` says of this worker: `NOT_REPORTED` when `ref` is the
        worker's own (`exc` is its error), else its slot in the node relay's report
        (`slot_of`)."""
        return NOT_REPORTED if self.index is None else slot_of(exc, self.index)


class NodeFailed(Exception):
    """Raised by a relay whose node had a failure, so that every return of its task is an
    error and the driver's one `ray.get` of a call fails fast, as for direct tasks. `slots`
    holds, per worker of the task, its reply, `RelayFailed` or `StillRunning`."""

    def __init__(self, slots: list[Any]) -> None:
        super().__init__(f"twinkle: a worker of this relay's node failed ({len(slots)} slots)")
        self.slots = slots

    def __reduce__(self):
        return (NodeFailed, (self.slots,))


#: What `slot_of` returns for an error that is not a relay's report (a worker's reply may be
#: None, so None cannot say it).
NOT_REPORTED: Any = type("NotReported", (), {"__repr__": lambda self: "NOT_REPORTED"})()


def report_of(exc: BaseException) -> NodeFailed | None:
    """The relay's report an error carries (raised by the relay, or as a task error's
    cause); None when the error is not one (the relay itself died)."""
    cause = exc if isinstance(exc, NodeFailed) else getattr(exc, "cause", None)
    return cause if isinstance(cause, NodeFailed) else None


def slot_of(exc: BaseException, k: int) -> Any:
    """What a relay reported for the `k`-th worker of its task, given the error its return
    raised: that worker's reply, `RelayFailed` or `StillRunning`; `NOT_REPORTED` when `exc` is
    not a relay's report (the relay itself died: the error stands for the worker)."""
    report = report_of(exc)
    return NOT_REPORTED if report is None else report.slots[k]


class NodeRelay:
    """Runs in a Ray actor on one node: submits the node's share of each call to the node's
    workers, in the driver's order, and returns their replies."""

    def __init__(self, handles: list[Any], traced: bool = False, peers: list[Any] = ()) -> None:
        self._handles = list(handles)
        #: What submits each (worker index, method), made once.
        self._methods = Submitters(self._handles)
        #: The relays of the other nodes of this relay's branch, which it hands calls on to
        #: (`branch`); empty for a relay that is not the first of a branch.
        self._peers = list(peers)
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        #: When the driver traces: each worker task's id -> the id of the relay task the
        #: driver sent (the only one it knows), for `tracing.gather`.
        self._links: dict[str, str] | None = {} if traced else None

    def links(self) -> dict[str, str]:
        """Which relay task (the driver's ref) submitted each worker task, by task id."""
        return dict(self._links or {})

    def _note_links(self, refs: list[Any], origin: str | None = None) -> None:
        """`origin`: the driver's task for a call this relay got from its branch's first."""
        links = self._links
        if links is None or len(links) >= LINKS_MAX:
            return
        me = origin or ray.get_runtime_context().get_task_id()
        for ref in refs:
            links[ref.task_id().hex()] = me

    def _tw_ready(self) -> str:
        """The relay's node id (the driver waits for this before routing calls here)."""
        return ray.get_runtime_context().get_node_id()

    async def _tw_watch(self) -> None:
        """Never returns: the driver's call ends only when this relay dies, which tells the
        driver at once, even while the group is idle (`Route.watch`)."""
        await asyncio.Event().wait()

    async def run_local(self, fn: Any, refs: list[Any], *args: Any) -> Any:
        """`fn(values, *args)` on a thread of this relay, `values` being what `refs` hold
        (fetched onto this node): work on this node's data (summing its workers' results,
        `node_reduce.py`) that must not hold up the calls it hands on. Top-level arguments
        that are refs are fetched by Ray before the task runs."""
        values = list(await asyncio.gather(*refs))
        return await asyncio.get_running_loop().run_in_executor(None, fn, values, *args)

    async def _turn(self, seq: int) -> None:
        if seq != self._next:
            future = self._waiting[seq] = asyncio.get_running_loop().create_future()
            await future

    def _advance(self) -> None:
        self._next += 1
        future = self._waiting.pop(self._next, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def _hand_on(
        self, seq: int, method: str, indices: tuple[int, ...], shared: bool, arguments: Any
    ) -> tuple[list[Any], list[Any] | None]:
        """In turn `seq`, submit `method` on this node's workers at `indices` (with `arguments`:
        one `(args, kwargs)` for all when `shared`, else one per worker): their refs, or, when
        submitting failed, no refs and a failed slot per worker."""
        await self._turn(seq)
        refs: list[Any] = []
        try:
            for n, index in enumerate(indices):
                args, kwargs = arguments if shared else arguments[n]
                refs.append(self._methods[index, method].remote(*args, **kwargs))
        except BaseException as exc:  # the workers got nothing of it: every slot fails
            return [], [RelayFailed(error=exc)] * len(indices)
        finally:
            self._advance()
        return refs, None

    async def fanout(self, call: tuple[int, str, tuple[int, ...], bool, Any, Any]) -> Any:
        """`call` is `(seq, method, indices, shared, arguments, origin)`, one argument (Ray
        serializes each argument of a task on its own): submit `method` on the workers at
        `indices` (this node's list) with `arguments` (one `(args, kwargs)` for all when
        `shared`, else one per worker), then return their replies, in one list in the order
        of `indices`. `origin`: the driver's task, when a branch's first relay hands this on
        in a traced run."""
        seq, method, indices, shared, arguments, origin = call
        refs, replies = await self._hand_on(seq, method, indices, shared, arguments)
        if self._links is not None:
            self._note_links(refs, origin)
        if replies is None:
            replies = await _gather(refs, [0] * len(refs))
        for reply in replies:
            if type(reply) is RelayFailed:
                raise NodeFailed(replies)
        return replies

    async def branch(self, call: tuple[str, list[tuple[int, int, tuple, bool, Any]]]) -> Any:
        """`call` is `(method, parts)`: one part per node of this relay's branch that the call
        reaches, `(peer, seq, indices, shared, arguments)` with `peer` -1 for this node and
        else an index into `_peers`. Hands each peer its part (as `fanout`), runs this node's
        own, and returns every worker's reply in one list, in the order of the parts; at the
        first failure of any worker, `NodeFailed` with every slot (`_gather`)."""
        method, parts = call
        origin = ray.get_runtime_context().get_task_id() if self._links is not None else None
        sources: list[Any] = []
        counts: list[int] = []
        own: tuple[int, tuple, bool, Any] | None = None
        own_at = 0
        for peer, seq, indices, shared, arguments in parts:
            if peer < 0:
                own, own_at = (seq, indices, shared, arguments), len(sources)
                sources.append(None)
                counts.append(len(indices))
                continue
            sources.append(self._forward(peer, (seq, method, indices, shared, arguments, origin)))
            counts.append(len(indices))
        if own is not None:
            refs, failed = await self._hand_on(own[0], method, *own[1:])
            if self._links is not None:
                self._note_links(refs, origin)
            sources[own_at : own_at + 1] = refs if failed is None else failed
            counts[own_at : own_at + 1] = [0] * (len(refs) if failed is None else len(failed))
        replies = await _gather(sources, counts)
        for reply in replies:
            if type(reply) is RelayFailed:
                raise NodeFailed(replies)
        return replies

    def _forward(self, peer: int, call: tuple) -> Any:
        """Hand `call` to peer relay `peer`: the ref of its `fanout`; if that raises, the
        error, after telling the peer to skip the call's turn (an empty call), so that its
        later calls do not wait for one that never comes."""
        fanout = self._peers[peer].fanout
        try:
            return fanout.remote(call)
        except BaseException as exc:
            seq, method, _, _, _, origin = call
            try:
                fanout.remote((seq, method, (), True, ((), {}), origin))
            except BaseException:
                pass  # the peer is gone: its calls fail with it
            return RelayFailed(error=exc)

    async def submit(self, seq: int, index: int, method: str, args: tuple, kwargs: dict) -> list:
        """Submit one task on worker `index` in the driver's order and return its ref at once,
        in a list (so Ray hands it on without waiting for it)."""
        await self._turn(seq)
        try:
            return [self._methods[index, method].remote(*args, **kwargs)]
        finally:
            self._advance()


async def _gather(sources: list[Any], counts: list[int]) -> list[Any]:
    """The replies of `sources`, in order, one slot per worker: a source with count 0 is a
    worker's ref (one reply) or an already failed slot (`RelayFailed`); one with count c > 0
    is a peer relay's `fanout` ref (a list of c replies, or `NodeFailed` with c slots). At the
    first failure, at once: the failures in their slots as `RelayFailed`, and `StillRunning`
    for the workers not finished, which the driver watches through its own grace for failing
    together (`pending.py`), as it does for direct tasks. One completion callback per ref
    (Ray's own thread), no thread or future per ref."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    starts = []
    total = 0
    for count in counts:
        starts.append(total)
        total += count or 1
    replies: list[Any] = [None] * total
    done = [False] * len(sources)
    state = {"left": 0, "failed": False}
    lock = threading.Lock()

    def wake() -> None:
        if not finished.done():
            finished.set_result(None)

    def on_completed(i: int, result: Any) -> None:  # on Ray's thread
        failed = isinstance(result, BaseException)
        at, count = starts[i], counts[i]
        with lock:
            if not count:
                replies[at] = RelayFailed(sources[i]) if failed else result
            elif not failed:
                replies[at : at + count] = result
            else:  # the peer's report holds its slots; without one the peer relay died
                report = report_of(result)
                replies[at : at + count] = (
                    report.slots if report is not None else [RelayFailed(sources[i])] * count
                )
            done[i] = True
            state["left"] -= 1
            first_failure = failed and not state["failed"]
            if failed:
                state["failed"] = True
            last = state["left"] == 0
        if last or first_failure:
            loop.call_soon_threadsafe(wake)

    waiting = []
    for i, source in enumerate(sources):
        if type(source) is RelayFailed:  # failed before it was sent
            replies[starts[i] : starts[i] + (counts[i] or 1)] = [source] * (counts[i] or 1)
            done[i] = True
            state["failed"] = True
        else:
            waiting.append(i)
    state["left"] = len(waiting)
    if not waiting or state["failed"]:
        wake()
    for i in waiting:
        sources[i]._on_completed(lambda result, i=i: on_completed(i, result))
    await finished
    with lock:  # a failure: the rest are reported running; the driver gives them its grace
        for i, source in enumerate(sources):
            if done[i]:
                continue
            at, count = starts[i], counts[i]
            if not count:
                replies[at] = StillRunning(source)
            else:
                replies[at : at + count] = [StillRunning(source, k) for k in range(count)]
        return replies


# ---------------------------------------------------------------------- driver side
class RelayedRefs(list):
    """One entry per worker, returned by `Route.send`: the ref of the relay task of the worker's
    node (the same ref for every worker of a node). `nodes` lists those refs once each, and
    `at[i]` says which of them holds worker `i`'s reply and where in its list: `(node, k)`;
    `route` is the `Route` that sent them (a dead relay's calls name the route to replace)."""

    __slots__ = ("at", "nodes", "route")

    def __reduce__(self):
        return (list, (list(self),))

    def expand(self, lists: list[Any]) -> list[Any]:
        """Every worker's reply, from the relays' lists (`lists[n]` for `nodes[n]`)."""
        return [lists[n][k] for n, k in self.at]


class Route:
    """Driver-side: the relays of one set of actors (`hosts.Hosts`), which rank sits on which
    relay at which index, the branches the relays form, and the sequence numbers of the
    submissions. A number is taken and its task handed to Ray under one lock (`_lock`, held
    for nothing else), so the numbers reach each relay in the order Ray delivers them; a
    relay takes its calls in the order of their numbers whoever hands them on (the driver, or
    its branch's first relay), so every path keeps one order per worker.

    Branches: the nodes in runs of `fanout` (`relay_fanout`); the first relay of a run leads
    it (`NodeRelay.branch`, created with the others' handles as its peers). A call reaching
    several nodes of a branch is one task from the driver to the branch's first relay; a
    call reaching one node goes to that node's relay directly."""

    def __init__(self, relays: list[Any], ranks_by_node: list[list[int]], fanout: int = 1) -> None:
        self.relays = relays
        self.ranks_by_node = ranks_by_node
        #: rank -> (node index, index on that node's relay)
        self.where: dict[int, tuple[int, int]] = {
            rank: (node, index)
            for node, ranks in enumerate(ranks_by_node)
            for index, rank in enumerate(ranks)
        }
        self.fanout = fanout
        self._seq = [0] * len(relays)
        #: Each relay's `fanout` method, and each branch's first relay's `branch` method,
        #: looked up once (`handle.fanout` builds it anew).
        self._fanouts = [actor_method(relay, "fanout") for relay in relays]
        self._branches = (
            [actor_method(relay, "branch") for relay in relays[::fanout]] if fanout > 1 else []
        )
        self._lock = threading.Lock()

    def _next(self, node: int) -> int:
        seq = self._seq[node]
        self._seq[node] = seq + 1
        return seq

    def send(self, method: str, ranks: list[int], shipped: list[tuple[tuple, dict]]) -> RelayedRefs:
        """Submit one call (`method` on `ranks`, with `shipped[i]` for `ranks[i]`) through the
        relays; returns one ref per rank, in `ranks`' order. Arguments that are the very same
        objects for every worker of a node travel once to that node."""
        by_node: dict[int, list[int]] = {}
        where = self.where
        for i, rank in enumerate(ranks):
            by_node.setdefault(where[rank][0], []).append(i)
        # The driver's tasks: one per branch the call reaches, its nodes in node order.
        fanout = self.fanout
        tasks: dict[int, list[int]] = {}
        for node in sorted(by_node):
            tasks.setdefault(node // fanout, []).append(node)
        refs = RelayedRefs([None] * len(ranks))
        at: list[tuple[int, int]] = [(0, 0)] * len(ranks)
        for t, nodes in enumerate(tasks.values()):
            k = 0
            for node in nodes:
                for i in by_node[node]:
                    at[i] = (t, k)
                    k += 1
        refs.at, refs.route = at, self
        with self._lock:
            refs.nodes = self._send_tasks(method, ranks, shipped, by_node, tasks)
        for i, (t, _) in enumerate(at):
            refs[i] = refs.nodes[t]
        return refs

    def _part(
        self, node: int, method: str, ranks: list[int], shipped: list, positions: list[int]
    ) -> tuple[int, tuple[int, ...], bool, Any]:
        """Node `node`'s share of a call, with its next sequence number: `(seq, indices,
        shared, arguments)`."""
        where = self.where
        indices = tuple([where[ranks[i]][1] for i in positions])
        first = shipped[positions[0]]
        shared = all(_same(shipped[i], first) for i in positions[1:])
        arguments: Any = first if shared else [shipped[i] for i in positions]
        return self._next(node), indices, shared, arguments

    def _send_tasks(
        self,
        method: str,
        ranks: list[int],
        shipped: list[tuple[tuple, dict]],
        by_node: dict[int, list[int]],
        tasks: dict[int, list[int]],
    ) -> list[Any]:
        """Hand each branch its share (one node's straight to its relay); returns the tasks'
        refs, in `tasks`' order."""
        fanout = self.fanout
        out = []
        for branch, nodes in tasks.items():
            taken = []
            try:
                if len(nodes) == 1:
                    node = nodes[0]
                    taken.append(node)
                    seq, indices, shared, arguments = self._part(
                        node, method, ranks, shipped, by_node[node]
                    )
                    got = self._fanouts[node].remote(
                        (seq, method, indices, shared, arguments, None)
                    )
                else:
                    lead = branch * fanout
                    parts = []
                    for node in nodes:
                        taken.append(node)
                        part = self._part(node, method, ranks, shipped, by_node[node])
                        parts.append((node - lead - 1, *part))
                    got = self._branches[branch].remote((method, parts))
            except BaseException:
                for node in taken:  # never sent: the relays must not wait for them
                    self._seq[node] -= 1
                raise
            out.append(got)
        return out

    def submit(self, rank: int, method: str, args: tuple, kwargs: dict) -> Any:
        """One task on worker `rank`, in order with the calls: its ref (owned by the relay,
        back after one hop; the relay does not wait for the task)."""
        listed = self.post(rank, method, args, kwargs)
        try:
            return ray.get(listed, timeout=SUBMIT_TIMEOUT_S)[0]
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"twinkle: the relay of node {self.where[rank][0]} did not hand {method} to "
                f"worker rank "
                f"{rank} within {SUBMIT_TIMEOUT_S:g}s (it only waits for earlier submissions, "
                "which take microseconds): the relay's node is overloaded or gone"
            ) from None

    def post(self, rank: int, method: str, args: tuple, kwargs: dict) -> Any:
        """Hand one task for worker `rank` to its relay, in order with the calls; the relay's
        reply (a list holding the task's ref), not waited for."""
        node, index = self.where[rank]
        with self._lock:
            seq = self._next(node)
            try:
                return self.relays[node].submit.remote(seq, index, method, args, kwargs)
            except BaseException:
                self._seq[node] = seq  # never sent: the relay must not wait for it
                raise

    def watch(self, on_end: Any) -> None:
        """Have `on_end(self)` called when one of the relays dies (or is killed): each runs a
        task that never returns (`NodeRelay._tw_watch`), whose end is the relay's. `on_end`
        runs on Ray's own thread, so it must only hand the news on."""
        self._watches = [relay._tw_watch.remote() for relay in self.relays]
        for ref in self._watches:
            ref._on_completed(lambda _result: on_end(self))

    def any_died_alone(self, handles: list[Any]) -> bool:
        """Whether a relay is dead while a worker behind it lives (`relay_died_alone`), for
        any rank; `handles` are the workers by rank."""
        return any(self.relay_died_alone(rank, handles[rank]) for rank in self.where)

    def relay_died_alone(self, rank: int, worker: Any) -> bool:
        """Whether a relay between the driver and worker `rank` (its node's, or its branch's
        first) is dead while the worker lives, as the GCS lists them (`deaths.actor_state`).
        A relay whose process died is listed dead at once; one on a node lost without warning
        stays listed alive, with the node's workers, until the loss is noticed: that death is
        then the workers' (their node's), as on the direct path."""
        node = self.where[rank][0]
        lead = node - node % self.fanout
        relays = {id(r): r for r in (self.relays[node], self.relays[lead])}.values()
        if not any(actor_state(r) == "DEAD" for r in relays):
            return False
        return actor_state(worker) == "ALIVE"

    def kill(self) -> None:
        for relay in self.relays:
            try:
                ray.kill(relay, no_restart=True)
            except Exception:  # already gone
                pass


def _same(a: tuple[tuple, dict], b: tuple[tuple, dict]) -> bool:
    """Whether two workers' arguments are the very same objects (identity, item by item);
    `dispatch='all'` gives every worker the very same args tuple, which decides at once."""
    (args_a, kwargs_a), (args_b, kwargs_b) = a, b
    if args_a is not args_b and (
        len(args_a) != len(args_b) or not all(map(operator.is_, args_a, args_b))
    ):
        return False
    if not kwargs_a and not kwargs_b:
        return True
    if kwargs_a.keys() != kwargs_b.keys():
        return False
    return all(kwargs_a[k] is kwargs_b[k] for k in kwargs_a)


#: Driver-side: actor id -> (its route, its rank), for every relayed actor of this process, so
#: that the single tasks other modules send to an actor (`remote_on`) go through its relay.
_ROUTED: dict[Any, tuple[Route, int]] = {}


def register(route: Route, handles: list[Any]) -> None:
    """Send the single tasks for `handles` (in rank order) through `route` from now on."""
    _start_poster()
    for rank, handle in enumerate(handles):
        _ROUTED[handle._actor_id] = (route, rank)


def unregister(handles: list[Any]) -> None:
    for handle in handles:
        _ROUTED.pop(getattr(handle, "_actor_id", None), None)


def clear() -> None:
    _ROUTED.clear()


def remote_on(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """`handle.<method>.remote(*args, **kwargs)`, through the actor's relay when it has one
    (so the task keeps its place among the actor's calls); the task's ref either way.

    Raises `CallLostError` when the relay died on its own before it handed the task on (in
    the moment before the driver notices and replaces it): the worker lives, and whether it
    got the task is unknown, as for a call lost with its relay."""
    routed = _ROUTED.get(handle._actor_id) if _ROUTED else None
    if routed is None:
        return getattr(handle, method).remote(*args, **kwargs)
    route, rank = routed
    return submit_on(route, rank, handle, method, args, kwargs)


def submit_on(route: Route, rank: int, handle: Any, method: str, args: tuple, kwargs: dict) -> Any:
    """`remote_on` through `route` to worker `rank` (`handle`)."""
    try:
        return route.submit(rank, method, args, kwargs)
    except ray.exceptions.RayActorError as exc:
        if not route.relay_died_alone(rank, handle):
            raise
        raise CallLostError(
            f"{method} for worker rank {rank} was lost with the relay of its node, which died "
            f"on its own ({type(exc).__name__}); the worker is alive, and whether it got the "
            "task is unknown. twinkle starts new relays: try again if the task is safe to "
            "repeat (docs/ray.md, Relays)"
        ) from exc


def post_on(handle: Any, method: str, *args: Any) -> None:
    """Like `remote_on` for a task nobody waits for, safe where no lock may be taken (a
    garbage collector's finalizer: it could run while this thread holds a route's lock).
    Relayed tasks are handed on by a daemon thread, in the order posted."""
    if not _ROUTED or _ROUTED.get(handle._actor_id) is None:
        getattr(handle, method).remote(*args)
        return
    _POSTED.put((handle, method, args))


_POSTED: queue.SimpleQueue = queue.SimpleQueue()
_POSTER: list[threading.Thread] = []


def _start_poster() -> None:
    """The thread handing on `post_on`'s tasks; started when the first route is registered
    (never from `post_on`, which may run in a finalizer)."""
    if not _POSTER or not _POSTER[0].is_alive():
        thread = threading.Thread(target=_post_loop, name="twinkle-relay-post", daemon=True)
        thread.start()
        _POSTER[:] = [thread]


def _post_loop() -> None:
    while True:
        handle, method, args = _POSTED.get()
        routed = _ROUTED.get(handle._actor_id)
        try:
            if routed is None:
                getattr(handle, method).remote(*args)
            else:
                routed[0].post(routed[1], method, args, {})
        except Exception:  # the actor or the cluster is gone
            pass

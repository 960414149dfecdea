"""The call timeline: a process-wide recorder of remote calls, written as a Chrome trace.

`initialize(..., trace="run.json")` (or `TWINKLE_TRACE=run.json`) starts a `Recorder` in the
driver; `shutdown()` (also at exit) writes every event in the Chrome Trace Event format, which
Perfetto (ui.perfetto.dev) and chrome://tracing open. What is recorded:

- on a worker, each execution of a method: one complete event named `Class.method` on the
  group's process track and the rank's thread track (`worker_started` / `worker_finished`,
  called by the backends around the user's method);
- on the driver, each call's dispatch (arguments resolved, split and sent) and its collection
  (the wait for the workers and the collector), on the driver's own track, with flow arrows
  from a call to its executions (`begin_call` / `end_dispatch` / `collect_span`).

When tracing is off, `RECORDER` is None and every hook is one global check. Workers in other
processes (torchrun ranks, Ray actors) record into their own recorder; backends hand their
events to the writing process before it writes (`add_gatherer`), with each process's clock
offset to the driver's measured at start-up (`Recorder.clock_offsets`).

Timestamps are nanoseconds of `now_ns()`: a monotonic clock anchored to the wall clock once
per process, so durations never jump and processes on one machine agree to microseconds.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from typing import Any

log = logging.getLogger("twinkle.trace")

#: Set in the driver's environment while a trace is recorded, so workers started from it
#: (Ray actors get `TWINKLE_*` variables) record their executions too.
WORKER_ENV = "TWINKLE_TRACE_WORKER"
#: Where `initialize()` without `trace=` looks for a trace file path.
PATH_ENV = "TWINKLE_TRACE"
#: How many worker executions and how many driver spans each process keeps (the latest ones:
#: a long run's trace stays bounded in memory and opens in Perfetto; the end, where a slow or
#: stuck run is looked at, is kept).
MAX_EVENTS_ENV = "TWINKLE_TRACE_MAX_EVENTS"
DEFAULT_MAX_EVENTS = 1_000_000


def max_events() -> int:
    """`TWINKLE_TRACE_MAX_EVENTS` when set to a positive integer, else 1,000,000."""
    raw = os.environ.get(MAX_EVENTS_ENV, "").strip()
    try:
        value = int(raw) if raw else DEFAULT_MAX_EVENTS
    except ValueError:
        log.warning(
            "twinkle: %s=%r is not an integer; keeping %d", MAX_EVENTS_ENV, raw, DEFAULT_MAX_EVENTS
        )
        return DEFAULT_MAX_EVENTS
    return value if value > 0 else DEFAULT_MAX_EVENTS


_ANCHOR_NS = time.time_ns() - time.perf_counter_ns()


def now_ns() -> int:
    """Nanoseconds on this process's trace clock (monotonic, anchored to the wall clock)."""
    return time.perf_counter_ns() + _ANCHOR_NS


class Recorder:
    """The events of this process. Appending is thread-safe (list.append under the GIL)."""

    def __init__(self, path: str | None = None, *, role: str = "driver", label: str = "driver"):
        #: Where the trace is written (None: this process only records, another writes).
        self.path = path
        self.role = role
        #: The name of this process's driver track (e.g. "driver rank 1" under torchrun).
        self.label = label
        self.pid = os.getpid()
        #: At most this many of each kind of event are kept (the latest).
        self.max_events = max_events()
        #: (name, group, rank, node, call id, link id, start_ns, end_ns, process label)
        self.executions: deque[tuple] = deque(maxlen=self.max_events)
        #: (kind, name, group, call id, thread name, start_ns, end_ns, args, process label)
        self.driver: deque[tuple] = deque(maxlen=self.max_events)
        #: Group health transitions seen by this (driver) process, oldest first:
        #: (group, state, generation, restarts, max_restarts, cause, at_ns).
        self.health: deque[tuple] = deque(maxlen=self.max_events)
        #: Events recorded here in total (kept or dropped), and dropped by other processes.
        self._recorded = itertools.count()
        self.dropped_elsewhere = 0
        #: Backend link ids (e.g. Ray task ids) of a call's executions -> (process, call id).
        self.links: dict[str, tuple[str, int]] = {}
        #: Offset of another process's trace clock to this one's, ns (theirs - ours).
        self.clock_offsets: dict[str, int] = {}
        #: How far each offset may be off, ns (half the round trip it was measured over):
        #: an event of that process may sit up to this much early or late on the driver's clock.
        self.clock_uncertainty: dict[str, int] = {}
        #: What backends keep with the recorder (e.g. this process's measured clock offset).
        self.meta: dict[str, Any] = {}
        self.started_ns = now_ns()
        self._calls = 0
        self._calls_lock = threading.Lock()
        self._local = threading.local()

    # ------------------------------------------------------------------ driver side
    def begin_call(self) -> tuple[int, int]:
        """A new call id and its start time. Until `end_dispatch`, it is this thread's
        current call: workers running in this thread while it is submitted record it."""
        with self._calls_lock:
            self._calls += 1
            call = self._calls
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(call)
        return call, now_ns()

    def current_call(self) -> int | None:
        """The id of the call this thread is dispatching (its in-thread workers run it)."""
        stack = self._local.__dict__.get("stack")
        return stack[-1] if stack else None

    def end_dispatch(
        self,
        call: int,
        start_ns: int,
        method: str,
        group: str,
        *,
        record: bool = True,
        links: list[str] | None = None,
        nbytes: int | None = None,
    ) -> None:
        """The call's dispatch ended (its work was handed to the workers)."""
        stack = self._local.__dict__.get("stack")
        if stack and stack[-1] == call:
            stack.pop()
        if links:
            for link in links:
                self.links[link] = (self.label, call)
        if not record:
            return
        args: dict[str, Any] = {"call": call, "group": group}
        if nbytes is not None:
            args["bytes"] = nbytes
        self._driver_span("dispatch", method, group, call, start_ns, args)

    def collect_span(self, call: int, start_ns: int, method: str, group: str) -> None:
        """The driver waited for and collected the call from `start_ns` until now."""
        self._driver_span("collect", method, group, call, start_ns, {"call": call, "group": group})

    def _driver_span(
        self, kind: str, method: str, group: str, call: int, start_ns: int, args: dict
    ) -> None:
        next(self._recorded)
        thread = threading.current_thread().name
        self.driver.append(
            (kind, method, group, call, thread, start_ns, now_ns(), args, self.label)
        )

    def group_health(self, state: Any) -> None:
        """A group's health changed (a `GroupState`: restarting, healthy again, dead)."""
        next(self._recorded)
        self.health.append(
            (
                state.group,
                state.state,
                state.generation,
                state.restarts,
                state.max_restarts,
                state.last_cause,
                now_ns(),
            )
        )

    # ------------------------------------------------------------------ worker side
    def worker_finished(
        self,
        name: str,
        group: str,
        rank: int,
        node: str | None,
        start_ns: int,
        call: int | None = None,
        link: str | None = None,
    ) -> None:
        """One execution of `name` on worker `rank` of `group`, from `start_ns` until now."""
        next(self._recorded)
        self.executions.append(
            (name, group, rank, node, call, link, start_ns, now_ns(), self.label)
        )

    @property
    def dropped(self) -> int:
        """Events dropped over the limit, here and in the processes merged into this one."""
        # next() is the one atomic read of an itertools.count; reads are counted and subtracted.
        recorded = next(self._recorded) - self._reads
        self._reads += 1
        kept_here = len(self.executions) + len(self.driver) + len(self.health) - self._merged
        return max(0, recorded - kept_here) + self.dropped_elsewhere

    _merged = 0
    _reads = 0

    # ------------------------------------------------------------------ merging
    def snapshot(self) -> dict[str, Any]:
        """This process's events as plain data, to send to the process that writes."""
        return {
            "label": self.label,
            "executions": list(self.executions),
            "driver": list(self.driver),
            "links": dict(self.links),
            "dropped": self.dropped,
        }

    def merge(
        self, snapshot: dict[str, Any], offset_ns: int = 0, uncertainty_ns: int | None = None
    ) -> None:
        """Add another process's events, its clock `offset_ns` ahead of this one's (measured
        to within `uncertainty_ns`, when known).

        Merged events do not count against this process's limit (each process kept its own).
        """
        label = snapshot.get("label", "?")
        self.clock_offsets[label] = offset_ns
        if uncertainty_ns is not None:
            self.clock_uncertainty[label] = int(uncertainty_ns)
        self.dropped_elsewhere += int(snapshot.get("dropped", 0))
        if self.executions.maxlen is not None:
            self.executions = deque(self.executions)
            self.driver = deque(self.driver)
        self._merged += len(snapshot.get("executions", ())) + len(snapshot.get("driver", ()))
        for e in snapshot.get("executions", ()):
            e = list(e)
            e[6] -= offset_ns
            e[7] -= offset_ns
            self.executions.append(tuple(e))
        for d in snapshot.get("driver", ()):
            d = list(d)
            d[5] -= offset_ns
            d[6] -= offset_ns
            self.driver.append(tuple(d))
        self.links.update({k: tuple(v) for k, v in snapshot.get("links", {}).items()})

    # ------------------------------------------------------------------ output
    def to_chrome(self) -> dict[str, Any]:
        """The Chrome Trace Event JSON object (see the module docstring)."""
        return chrome_trace(self)

    def write(self, path: str | None = None) -> str:
        """Write the trace to `path` (default: the recorder's); returns the path."""
        target = path or self.path
        if not target:
            raise ValueError("Recorder.write(path=...): no path given and the recorder has none")
        data = self.to_chrome()
        if self.dropped:
            log.warning(
                "twinkle: the trace %s holds the latest %d events of each process; %d earlier "
                "ones were dropped (raise %s to keep more)",
                target,
                self.max_events,
                self.dropped,
                MAX_EVENTS_ENV,
            )
        tmp = f"{target}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, target)
        return target


# ------------------------------------------------------------------------- process-wide
#: The recorder of this process, or None when tracing is off (the off path checks only this).
RECORDER: Recorder | None = None

_saved_env: str | None = None


def start(path: str, *, label: str = "driver") -> Recorder:
    """Start recording in this driver process, to be written to `path` by `finish()`."""
    global RECORDER, _saved_env
    RECORDER = Recorder(path, role="driver", label=label)
    _saved_env = os.environ.get(WORKER_ENV)
    os.environ[WORKER_ENV] = "1"
    return RECORDER


def discard() -> None:
    """Stop recording without writing (the run did not start)."""
    global RECORDER, _saved_env
    if RECORDER is not None and RECORDER.role == "driver":
        if _saved_env is None:
            os.environ.pop(WORKER_ENV, None)
        else:
            os.environ[WORKER_ENV] = _saved_env
        _saved_env = None
    RECORDER = None


def start_worker(label: str) -> Recorder:
    """Start recording in a worker process (it never writes; its events are gathered)."""
    global RECORDER
    RECORDER = Recorder(None, role="worker", label=label)
    return RECORDER


def worker_wanted() -> bool:
    """Whether a worker process started by a tracing driver should record."""
    return os.environ.get(WORKER_ENV) == "1"


def recorder() -> Recorder | None:
    """This process's recorder, or None when tracing is off (for backends: a function, so
    the process-wide variable itself is never shared)."""
    return RECORDER


def links_of(pending: Any) -> list[str] | None:
    """The ids a backend's workers record for their executions of `pending`
    (`PendingCall.trace_links`), to draw arrows from a call to its executions."""
    try:
        return pending.trace_links()  # type: ignore[no-any-return]
    except Exception as exc:  # a tracing aid must never fail a call
        log.debug("twinkle: trace links of %r failed: %s", pending, exc)
        return None


def gather(backend: Any) -> None:
    """Merge the other processes' events into this one's (before `backend` stops), through
    the backend's `ExecutionBackend.gather_trace`."""
    rec = RECORDER
    if rec is None:
        return
    try:
        backend.gather_trace(rec)
    except Exception as exc:
        log.warning("twinkle: could not gather trace events from %s: %s", backend.name, exc)


def finish() -> str | None:
    """Stop recording; write the trace if this process writes it. Returns the path written."""
    global RECORDER, _saved_env
    rec, RECORDER = RECORDER, None
    if rec is None:
        return None
    if _saved_env is None:
        os.environ.pop(WORKER_ENV, None)
    else:
        os.environ[WORKER_ENV] = _saved_env
    _saved_env = None
    if rec.path is None:
        return None
    try:
        path = rec.write()
    except OSError as exc:
        log.error("twinkle: could not write the trace to %s: %s", rec.path, exc)
        return None
    log.info("twinkle: trace written to %s (%d executions)", path, len(rec.executions))
    return path


def check_path(value: Any) -> str | None:
    """`initialize(trace=...)`: a path, or None; `TWINKLE_TRACE` when not given."""
    from .errors import ConfigurationError

    if value is None:
        value = os.environ.get(PATH_ENV) or None
        if value is None:
            return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"initialize(trace=...) must be a file path for the Chrome trace (e.g. 'run.json'), "
            f"got {value!r}"
        )
    # Checked now, not at shutdown when the whole trace would be lost: the file's directory
    # must exist (it is not created: only the file the user named is) and be writable, and
    # the path must not be a directory or a file this process cannot write.
    target = os.path.abspath(value)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise ConfigurationError(
            f"initialize(trace={value!r}): the directory {directory} does not exist; create it "
            "first (twinkle writes only the trace file itself), or give another path"
        )
    if os.path.isdir(target):
        raise ConfigurationError(
            f"initialize(trace={value!r}) is a directory; give a file path such as "
            f"{os.path.join(value, 'trace.json')!r}"
        )
    writable = (
        os.access(target, os.W_OK)
        if os.path.exists(target)
        else os.access(directory, os.W_OK | os.X_OK)
    )
    if not writable:
        raise ConfigurationError(
            f"initialize(trace={value!r}): this process cannot write {target} (permissions); "
            "give a path in a directory you can write"
        )
    return value


# ------------------------------------------------------------------------- Chrome format
def chrome_trace(rec: Recorder) -> dict[str, Any]:
    """Build the Chrome Trace Event object of everything `rec` holds."""
    events: list[dict[str, Any]] = []
    starts = (
        [e[6] for e in rec.executions] + [d[5] for d in rec.driver] + [h[6] for h in rec.health]
    )
    origin = min(starts) if starts else rec.started_ns

    def us(ns: int) -> float:
        return round((ns - origin) / 1000.0, 3)

    # Tracks: one process per driver (label), one per group; threads by name / rank.
    driver_labels = sorted({d[8] for d in rec.driver} | {rec.label}, key=_label_key)
    groups: list[str] = []
    for e in sorted(rec.executions, key=lambda e: e[6]):
        if e[1] not in groups:
            groups.append(e[1])
    for h in rec.health:
        if h[0] not in groups:
            groups.append(h[0])
    pids: dict[str, int] = {label: 1 + i for i, label in enumerate(driver_labels)}
    group_pid = {g: 100 + i for i, g in enumerate(groups)}
    for label, pid in pids.items():
        events.append(_meta("process_name", pid, 0, label))
        events.append(_meta("process_sort_index", pid, 0, pid, key="sort_index"))
    for g, pid in group_pid.items():
        events.append(_meta("process_name", pid, 0, f"group {g}"))
        events.append(_meta("process_sort_index", pid, 0, pid, key="sort_index"))
    ranks: dict[tuple[str, int], str | None] = {}
    for e in rec.executions:
        ranks.setdefault((e[1], e[2]), e[3])
    for (g, rank), node in sorted(ranks.items()):
        name = f"rank {rank}" + (f" ({node})" if node else "")
        events.append(_meta("thread_name", group_pid[g], rank, name))
    threads: dict[tuple[str, str], int] = {}
    for d in rec.driver:
        key = (d[8], d[4])
        if key not in threads:
            threads[key] = len([k for k in threads if k[0] == d[8]])
            events.append(_meta("thread_name", pids[d[8]], threads[key], f"thread {d[4]}"))

    # The end of each call's executions, for splitting a collection into wait + collect.
    call_end: dict[tuple[str, int], int] = {}
    exec_key: list[tuple[str, int] | None] = []
    for e in rec.executions:
        ck = _call_key(rec, e)
        exec_key.append(ck)
        if ck is not None:
            call_end[ck] = max(call_end.get(ck, e[7]), e[7])

    dispatch_at: dict[tuple[str, int], tuple[int, int, int]] = {}
    for kind, method, _group, call, thread, t0, t1, args, label in rec.driver:
        pid, tid = pids[label], threads[(label, thread)]
        if kind == "dispatch":
            dispatch_at[(label, call)] = (pid, tid, t0)
            events.append(_x(f"dispatch {method}", "dispatch", us(t0), us(t1), pid, tid, args))
            continue
        done = call_end.get((label, call))
        split = t0 if done is None else min(max(done, t0), t1)
        if done is None:
            split = t1  # executions unknown (not recorded): all of it was waiting
        if split > t0:
            events.append(_x(f"wait {method}", "wait", us(t0), us(split), pid, tid, args))
        if t1 > split:
            events.append(_x(f"collect {method}", "collect", us(split), us(t1), pid, tid, args))

    flow = 0
    for e, ek in zip(rec.executions, exec_key, strict=True):
        name, group, rank, node, call, link, t0, t1, label = e
        eargs: dict[str, Any] = {"group": group, "rank": rank, "node": node, "call": call}
        if ek is not None:
            eargs["call"], eargs["driver"] = ek[1], ek[0]
        if link is not None:
            eargs["task"] = link
        pid, tid = group_pid[group], rank
        events.append(_x(name, "worker", us(t0), us(t1), pid, tid, eargs))
        origin_at = dispatch_at.get(ek) if ek is not None else None
        if origin_at is not None:
            flow += 1
            dpid, dtid, dts = origin_at
            events.append(
                {
                    "name": "call",
                    "cat": "call",
                    "ph": "s",
                    "id": flow,
                    "ts": us(dts),
                    "pid": dpid,
                    "tid": dtid,
                }
            )
            events.append(
                {
                    "name": "call",
                    "cat": "call",
                    "ph": "f",
                    "bp": "e",
                    "id": flow,
                    "ts": us(t0),
                    "pid": pid,
                    "tid": tid,
                }
            )
    events.extend(_health_events(rec, group_pid, us))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "twinkle_trace_version": 1,
            "origin_unix_ns": origin,
            "clock_offsets_ns": dict(rec.clock_offsets),
            "clock_uncertainty_ns": dict(rec.clock_uncertainty),
            "max_events_per_process": rec.max_events,
            "dropped_events": rec.dropped,
        },
    }


#: The thread id of a group's health track in the trace (ranks use 0..n-1).
HEALTH_TID = -1


def _health_events(rec: Recorder, group_pid: dict[str, int], us: Any) -> list[dict[str, Any]]:
    """Each group's health on a track of its own ("health"): an instant event per transition
    (restarting, healthy on a new generation, dead), and a span from each death to the end of
    the restart it began (`restart -> generation N`, or `restart failed` when the group died)."""
    events: list[dict[str, Any]] = []
    began: dict[str, tuple[int, str | None]] = {}
    named: set[str] = set()
    for group, state, generation, restarts, max_restarts, cause, at in rec.health:
        pid = group_pid[group]
        if group not in named:
            named.add(group)
            events.append(_meta("thread_name", pid, HEALTH_TID, "health"))
        args = {
            "group": group,
            "state": state,
            "generation": generation,
            "restarts": restarts,
            "max_restarts": max_restarts,
            "cause": cause,
        }
        events.append(
            {
                "name": f"{state} (generation {generation})",
                "cat": "health",
                "ph": "i",
                "s": "t",
                "ts": us(at),
                "pid": pid,
                "tid": HEALTH_TID,
                "args": args,
            }
        )
        if state == "restarting" and group not in began:
            began[group] = (at, cause)
        elif state in ("healthy", "dead") and group in began:
            start, first_cause = began.pop(group)
            name = f"restart -> generation {generation}" if state == "healthy" else "restart failed"
            span_args = {**args, "cause": first_cause}
            events.append(_x(name, "health", us(start), us(at), pid, HEALTH_TID, span_args))
    return events


def _label_key(label: str) -> tuple[int, str]:
    return (0 if label == "driver" else 1, label)


def _call_key(rec: Recorder, e: tuple) -> tuple[str, int] | None:
    """(driver label, call id) of an execution: by its link id, else its in-process call."""
    link, call, label = e[5], e[4], e[8]
    if link is not None and link in rec.links:
        owner, cid = rec.links[link]
        return owner, cid
    if call is not None:
        return label, call
    return None


def _meta(name: str, pid: int, tid: int, value: Any, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _x(name: str, cat: str, ts: float, end: float, pid: int, tid: int, args: dict) -> dict:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": ts,
        "dur": round(max(end - ts, 0.0), 3),
        "pid": pid,
        "tid": tid,
        "args": args,
    }


# ------------------------------------------------------------------------- call pipeline
# ------------------------------------------------------------------------- payload size
_WALK_LIMIT = 10_000  # items looked at per call: the size is a hint, never a cost


def payload_bytes(calls: Any) -> int | None:
    """Bytes of the arrays, tensors and bytes in the worker calls' arguments, or None if none.

    The size of everything with an integer `nbytes` (numpy arrays, torch tensors, memoryviews)
    or a length of bytes, found in arguments and in lists, tuples and dicts inside them, summed
    over the workers (each is sent its own). Other values' pickled size is not known here.
    """
    total, found, budget = 0, False, _WALK_LIMIT
    for call in calls:
        stack: list[Any] = [*call.args, *call.kwargs.values()]
        while stack and budget > 0:
            value = stack.pop()
            budget -= 1
            if isinstance(value, (bytes, bytearray)):
                total, found = total + len(value), True
            elif isinstance(value, (list, tuple)):
                stack.extend(value)
            elif isinstance(value, dict):
                stack.extend(value.values())
            else:
                size = getattr(value, "nbytes", None)
                if isinstance(size, int):
                    total, found = total + size, True
    return total if found else None

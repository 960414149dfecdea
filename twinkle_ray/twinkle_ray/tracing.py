"""Seeing into Ray actors: their trace events and their stacks, even while they are busy.

A Ray actor runs one task at a time, so an actor method cannot report where a stuck method
is. Each twinkle actor therefore starts a *probe*: a daemon thread serving a TCP socket on the
actor's node. Its address and a random token go into Ray's internal key-value store under the
actor's id; the driver reads them and asks the probe for

- `stacks`: every thread's Python stack (`sys._current_frames()`), answered while the actor's
  main thread runs user code (the probe needs the GIL only for a moment);
- `clock`: the actor's trace clock, to measure its offset to the driver's (least round trip
  of a few pings, when the group gets its first call);
- `trace`: the executions the actor recorded (when the driver traces: `TWINKLE_TRACE_WORKER`
  reaches actors with the other `TWINKLE_*` variables).

The probe costs one blocked thread per actor and one key-value write at start-up; nothing per
call. On the driver, `gather` merges the actors' events into the trace before the actors stop,
and `link_ids` ties each call to its executions by Ray task id.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from typing import Any

import ray

from twinkle_core.plugin import (
    now_ns,
    recorder,
    start_worker_trace,
    thread_stacks,
    worker_trace_wanted,
)

log = logging.getLogger("twinkle.trace")

KV_PREFIX = "twinkle/probe/"
KV_NAMESPACE = "twinkle"
#: Pings of the clock-offset measurement (the one with the least round trip is kept).
CLOCK_PINGS = 5
#: At most this many pings while none came back fast (a loaded machine).
CLOCK_PINGS_MAX = 40
#: A round trip this short measures the offset to within half of it: enough.
CLOCK_GOOD_RTT_NS = 400_000


# ------------------------------------------------------------------------- actor side
class Probe:
    """The actor's side thread answering `stacks`, `clock` and `trace` requests."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.token = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, name="twinkle-probe", daemon=True)

    def start(self, actor_id: str) -> None:
        info = {
            "host": ray.util.get_node_ip_address(),
            "port": self.sock.getsockname()[1],
            "token": self.token,
            "label": self.label,
            "pid": os.getpid(),
        }
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(
            KV_PREFIX + actor_id, json.dumps(info), overwrite=True, namespace=KV_NAMESPACE
        )
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with conn:
                    conn.settimeout(10)
                    request = json.loads(_read_line(conn))
                    if request.get("token") != self.token:
                        continue
                    conn.sendall(json.dumps(self.answer(request.get("op"))).encode() + b"\n")
            except Exception as exc:  # a bad request must never end the probe
                log.debug("twinkle: probe request failed: %s", exc)

    def answer(self, op: Any) -> Any:
        if op == "clock":
            return {"now": now_ns()}
        if op == "stacks":
            return {"pid": os.getpid(), "stacks": actor_threads(thread_stacks())}
        if op == "trace":
            rec = recorder()
            return {"snapshot": rec.snapshot() if rec is not None else None}
        return {"error": f"unknown op {op!r}"}


def actor_threads(entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """An actor's thread stacks as the dump shows them: the thread running the actor's call
    named `MainThread`, and idle threads left out.

    The actor classes have concurrency groups (Ray Direct Transport's `_ray_system`, twinkle's
    `_tw_rdt`), so Ray runs every call on a thread of its own (unnamed, or `Dummy-N` once
    Python looked at it) while the real main thread waits in Ray's task loop (hidden, so its
    stack is empty: "idle"). Idle executor threads (a pool's `work_queue.get`) are left out.
    """
    out: list[tuple[str, str]] = []
    calls = 0
    for name, stack in entries:
        if "concurrent/futures/thread.py" in stack and "work_queue.get" in stack:
            continue  # an idle pool thread
        bare = name.startswith(("Dummy-", "thread "))  # threads Python did not start
        if bare and stack:
            out.append(("MainThread" if calls == 0 else name, stack))
            calls += 1
        elif not bare:
            out.append((name, stack))
    if calls:  # the main thread only waits for tasks while a call runs elsewhere
        out = [(n, s) for n, s in out if not (n == "MainThread" and not s)]
    return out


_probe: Probe | None = None


def start_actor(group: str, class_name: str, rank: int) -> None:
    """In a new actor: record executions when the driver traces, and start the probe."""
    global _probe
    label = f"{group} rank {rank}"
    if worker_trace_wanted():
        start_worker_trace(label)
    if _probe is not None:
        return
    try:
        probe = Probe(f"{label} ({class_name})")
        probe.start(ray.get_runtime_context().get_actor_id())
        _probe = probe
    except Exception as exc:  # stacks unavailable is not a reason to fail the actor
        log.warning("twinkle: the actor's stack probe did not start: %s", exc)


def record(rec: Any, group: str, class_name: str, rank: int, method: str, start_ns: int) -> None:
    """One execution of `method` in this actor, linked to the driver's call by task id."""
    ctx = ray.get_runtime_context()
    rec.worker_finished(
        f"{class_name}.{method}",
        group,
        rank,
        ctx.get_node_id()[:8],
        start_ns,
        None,
        ctx.get_task_id(),
    )


# ------------------------------------------------------------------------- driver side
def _read_line(conn: socket.socket) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _probe_info(actor_id: str) -> dict[str, Any] | None:
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(KV_PREFIX + actor_id, namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None


def ask(info: dict[str, Any], op: str, timeout: float) -> Any:
    """One request to an actor's probe; its JSON answer."""
    with socket.create_connection((info["host"], info["port"]), timeout=timeout) as conn:
        conn.settimeout(timeout)
        conn.sendall(json.dumps({"token": info["token"], "op": op}).encode() + b"\n")
        return json.loads(_read_line(conn))


def clock_offset(info: dict[str, Any], timeout: float = 5.0) -> tuple[int, int]:
    """(the actor's trace clock minus this process's, how far off that may be), ns.

    The ping with the least round trip wins; its half round trip bounds the error. On a busy
    machine a round trip can take milliseconds, so pinging goes on (up to `CLOCK_PINGS_MAX`)
    until one comes back within `CLOCK_GOOD_RTT_NS`.
    """
    best: tuple[int, int] | None = None
    for i in range(CLOCK_PINGS_MAX):
        sent = now_ns()
        theirs = ask(info, "clock", timeout)["now"]
        back = now_ns()
        sample = (back - sent, theirs - (sent + back) // 2)
        if best is None or sample[0] < best[0]:
            best = sample
        if i + 1 >= CLOCK_PINGS and best[0] <= CLOCK_GOOD_RTT_NS:
            break
    assert best is not None
    return best[1], (best[0] + 1) // 2


def _actors(backend: Any, workers: Any = None) -> list[tuple[str, str]]:
    """(actor id, who) of the run's actors (or one group's)."""
    groups = [workers] if workers is not None else list(getattr(backend, "worker_groups", ()))
    out: dict[str, str] = {}  # colocated objects share their group's actors: each once
    for wg in groups:
        if getattr(wg, "torn_down", None) is not None:
            continue  # its actors are gone, and their events with them
        for rank, handle in enumerate(getattr(wg, "handles", ()) or ()):
            try:
                actor_id = handle._actor_id.hex()
            except Exception:
                continue
            who = out.get(actor_id)
            label = f"group {wg.group.name!r} rank {rank} ({wg.class_name}"
            out[actor_id] = label + ")" if who is None else f"{who[:-1]}, {wg.class_name})"
    return list(out.items())


def gather(rec: Any, backend: Any) -> None:
    """Merge every actor's recorded executions into the driver's trace (before shutdown),
    each shifted by its clock offset (measured at its group's first call, else now)."""
    if not ray.is_initialized():
        return
    _measured_groups.clear()
    for actor_id, who in _actors(backend):
        try:
            info = _probe_info(actor_id)
            if info is None:
                log.warning("twinkle: no trace from %s: its probe never started", who)
                continue
            offset = _offsets.pop(actor_id, None)
            if offset is None:
                offset = clock_offset(info)
            snapshot = ask(info, "trace", 10.0).get("snapshot")
        except Exception as exc:
            log.warning("twinkle: could not fetch the trace events of %s: %s", who, exc)
            continue
        if snapshot is not None:
            rec.merge(snapshot, *offset)
    _relay_links(rec, backend)
    # Offsets of actors that died (a restart) or were not asked: the run is over for them.
    _offsets.clear()


def _relay_links(rec: Any, backend: Any) -> None:
    """Tie relayed executions to their calls: the driver's links are the relays' task ids
    (`link_ids`), each worker records its own; every relay says which of its tasks submitted
    which worker task (`NodeRelay.links`), and each worker task takes its relay task's call."""
    relays: dict[str, Any] = {}
    for wg in getattr(backend, "worker_groups", ()):
        route = getattr(wg, "route", None)
        if route is None or getattr(wg, "torn_down", None) is not None:
            continue
        for relay in route.relays:
            relays[relay._actor_id.hex()] = relay  # colocated objects share their relays
    for relay in relays.values():
        try:
            links = ray.get(relay.links.remote(), timeout=10.0)
        except Exception as exc:
            log.warning("twinkle: could not fetch a relay's trace links: %s", exc)
            continue
        for worker_task, relay_task in links.items():
            call = rec.links.get(relay_task)
            if call is not None:
                rec.links[worker_task] = call


def link_ids(pending: Any) -> list[str] | None:
    """The Ray task ids of a call's executions (what each actor records with its event).

    The first call to a group also starts measuring its actors' clock offsets, in a thread
    (so they are measured when the group starts, not when the run ends)."""
    refs = getattr(pending, "value_refs", None)
    if not refs:
        return None
    workers = getattr(pending, "workers", None)
    rec = recorder()
    on_driver = rec is not None and rec.role == "driver"
    if on_driver and workers is not None and id(workers) not in _measured_groups:
        _measured_groups[id(workers)] = workers  # kept: ids of live objects stay unique
        threading.Thread(
            target=_measure_offsets, args=(workers,), name="twinkle-clock", daemon=True
        ).start()
    return [ref.task_id().hex() for ref in refs]


#: Groups whose actors' clock offsets were measured (or are being measured), by id.
_measured_groups: dict[int, Any] = {}
#: (clock offset, uncertainty) of each actor (by actor id) measured at its group's first
#: call, ns.
_offsets: dict[str, tuple[int, int]] = {}


def _measure_offsets(workers: Any) -> None:
    for actor_id, who in _actors(None, workers):
        try:
            info = _probe_info(actor_id)
            if info is not None:
                _offsets[actor_id] = clock_offset(info)
        except Exception as exc:  # measured again when the events are fetched
            log.debug("twinkle: clock offset of %s not measured at start: %s", who, exc)


def worker_stacks(backend: Any, workers: Any, timeout: float) -> list[tuple[str, str]]:
    """[(who, stack)] of the main thread (and user threads) of each actor of the run."""
    if not ray.is_initialized():
        return []
    actors = _actors(backend, workers)
    results: list[list[tuple[str, str]]] = [[] for _ in actors]

    def one(i: int, actor_id: str, who: str) -> None:
        try:
            info = _probe_info(actor_id)
            if info is None:
                results[i] = [(who, "(no answer: the actor's probe is not running)")]
                return
            answer = ask(info, "stacks", timeout)
            results[i] = [
                (f"{who}" + ("" if name == "MainThread" else f" thread {name}"), stack)
                for name, stack in answer["stacks"]
            ]
        except Exception as exc:
            results[i] = [
                (
                    who,
                    f"(no answer within {timeout:g}s: {type(exc).__name__}: {exc}; the actor "
                    "died, or is stuck in C code holding Python's GIL)",
                )
            ]

    threads = [
        threading.Thread(target=one, args=(i, a, w), daemon=True) for i, (a, w) in enumerate(actors)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    return [entry for part in results for entry in part]

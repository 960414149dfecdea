"""Each group's health, published in the cluster for `twinkle doctor --ray` to read.

The driver of a run is the only process that knows its groups' health (`group_state()`); a
doctor run on another terminal or machine is a separate process. So the Ray backend writes
every group's `GroupState` into Ray's internal key-value store (on the cluster's head, GCS),
under `twinkle:<run>:health:<group>`, when the group's first object starts and after every
transition (restarting, healthy on a new generation, dead). The run's keys go at `shutdown()`
with the rest of its `twinkle:<run>:` keys. A run whose driver died without `shutdown()` leaves
its keys behind: each value names its Ray job, and the doctor reports a finished job's groups as
left over instead of live.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

log = logging.getLogger("twinkle")

#: The part of a key that marks a group's health (`twinkle:<run>:health:<group>`).
KEY_PART = ":health:"


def key(run: str, group: str) -> str:
    return f"twinkle:{run}{KEY_PART}{group}"


def publish(run: str, state: Any) -> None:
    """Write `state` (a `GroupState`) of run `run`; a failure is logged, never raised (the
    cluster may be going away, and health is only reported)."""
    import ray
    from ray.experimental import internal_kv

    try:
        job = ray.get_runtime_context().get_job_id()
    except Exception:
        job = None
    value = {
        "run": run,
        "group": state.group,
        "state": state.state,
        "generation": state.generation,
        "restarts": state.restarts,
        "max_restarts": state.max_restarts,
        "last_cause": state.last_cause,
        "job_id": job,
        "driver": f"{socket.gethostname()} pid {os.getpid()}",
        "updated": time.time(),
    }
    try:
        internal_kv._internal_kv_put(key(run, state.group).encode(), json.dumps(value).encode())
    except Exception as exc:
        log.debug("twinkle: could not publish group %r's health: %s", state.group, exc)


def read_all() -> list[dict[str, Any]]:
    """Every published group health of the connected cluster (run by the doctor's probe, in
    a process connected to the cluster), each with `live`: whether its run's Ray job is still
    running (None when Ray does not say)."""
    from ray.experimental import internal_kv

    out = []
    for raw in internal_kv._internal_kv_list("twinkle:"):
        name = raw.decode(errors="replace")
        if KEY_PART not in name:
            continue
        value = internal_kv._internal_kv_get(raw)
        if value is None:
            continue
        try:
            entry = dict(json.loads(value))
        except ValueError:
            continue
        out.append(entry)
    finished = _finished_jobs()
    for entry in out:
        job = entry.get("job_id")
        entry["live"] = None if finished is None or job is None else job not in finished
    out.sort(key=lambda e: (str(e.get("run")), str(e.get("group"))))
    return out


def _finished_jobs() -> set[str] | None:
    try:
        from ray._private import state  # no public API lists jobs without the dashboard

        return {j["JobID"] for j in state.jobs() if j.get("IsDead")}
    except Exception:
        return None


def text(entries: list[dict[str, Any]]) -> list[str]:
    """The doctor's lines for the published group health (one block per run)."""
    if not entries:
        return ["  twinkle runs: none live on this cluster"]
    out: list[str] = []
    run = None
    for e in entries:
        if e.get("run") != run:
            run = e.get("run")
            live = {True: "live", False: "left over: its driver's job has ended", None: ""}[
                e.get("live")
            ]
            out.append(
                f"  twinkle run {run!r} (driver {e.get('driver')}){'  ' + live if live else ''}"
            )
        budget = f"restarts {e.get('restarts')}/{e.get('max_restarts')}"
        cause = f"  last cause: {str(e['last_cause'])[:160]}" if e.get("last_cause") else ""
        out.append(
            f"    group {e.get('group')}: {e.get('state')}, generation {e.get('generation')}, "
            f"{budget}{cause}"
        )
    return out

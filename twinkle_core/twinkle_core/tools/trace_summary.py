"""`twinkle trace summary run.json`: where the time of a traced run went.

Reads a Chrome trace written by `initialize(trace=...)` (see `twinkle_core.trace`) and reports:

- per method executed on workers (`Class.method`): how many executions, their total time and
  the median (p50) and 95th-percentile (p95) duration;
- per group: how long its workers were idle, i.e. the run's span times the number of ranks
  minus the time the ranks spent executing methods (overlapping executions on one rank count
  once);
- per driver: the fraction of its time spent waiting for workers inside a LazyCollect;
- per group restart (`DeviceGroup(max_restarts=N)`): when the group died, how long until it
  served calls again on its next generation (or that the restart failed), and why.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class TraceFileError(ValueError):
    """The file is not a trace twinkle can summarize; the message says what is wrong."""


@dataclass
class MethodStats:
    name: str
    durations_us: list[float] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.durations_us)

    @property
    def total_us(self) -> float:
        return sum(self.durations_us)

    def percentile(self, q: float) -> float:
        return percentile(self.durations_us, q)


@dataclass
class GroupStats:
    name: str
    ranks: int
    busy_us: float
    idle_us: float

    @property
    def idle_fraction(self) -> float:
        total = self.busy_us + self.idle_us
        return self.idle_us / total if total > 0 else 0.0


@dataclass
class DriverStats:
    name: str
    span_us: float
    wait_us: float
    dispatch_us: float
    collect_us: float

    @property
    def wait_fraction(self) -> float:
        return self.wait_us / self.span_us if self.span_us > 0 else 0.0


@dataclass
class RestartStats:
    """One restart of a group: from the death (`at_us`, trace time) for `duration_us`."""

    group: str
    at_us: float
    duration_us: float
    #: The generation it ended on, or None when the group ended dead.
    generation: int | None
    cause: str


@dataclass
class Summary:
    span_us: float
    methods: list[MethodStats]
    groups: list[GroupStats]
    drivers: list[DriverStats]
    restarts: list[RestartStats] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (0-100) by the nearest-rank method; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def load(path: str) -> list[dict[str, Any]]:
    """The events of a Chrome trace file (an object with `traceEvents`, or a bare list)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TraceFileError(f"{path}: no such file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceFileError(f"{path}: not a JSON trace file ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceFileError(
            f"{path}: expected a Chrome trace (a JSON object with a 'traceEvents' list), as "
            "written by initialize(trace=...)"
        )
    return [e for e in events if isinstance(e, dict)]


def _union_us(spans: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(events: list[dict[str, Any]]) -> Summary:
    """The figures `twinkle trace summary` prints (see the module docstring)."""
    complete = [e for e in events if e.get("ph") == "X"]
    names = {
        e["pid"]: e.get("args", {}).get("name", str(e["pid"]))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    if complete:
        start = min(float(e["ts"]) for e in complete)
        stop = max(float(e["ts"]) + float(e.get("dur", 0)) for e in complete)
    else:
        start = stop = 0.0
    span = stop - start

    methods: dict[str, MethodStats] = {}
    busy: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    drivers: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    driver_span: dict[int, list[float]] = {}
    restarts: list[RestartStats] = []
    for e in complete:
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        cat = e.get("cat", "")
        if cat == "health":
            args = e.get("args", {})
            healthy = args.get("state") == "healthy"
            restarts.append(
                RestartStats(
                    str(args.get("group", names.get(e["pid"], e["pid"]))),
                    ts - start,
                    dur,
                    int(args.get("generation", 0)) if healthy else None,
                    str(args.get("cause") or ""),
                )
            )
        elif cat == "worker":
            args = e.get("args", {})
            group = str(args.get("group", names.get(e["pid"], e["pid"])))
            methods.setdefault(e["name"], MethodStats(e["name"])).durations_us.append(dur)
            busy[group][int(args.get("rank", e.get("tid", 0)))].append((ts, ts + dur))
        elif cat in ("dispatch", "driver", "wait", "collect"):
            kind = "dispatch" if cat == "driver" else cat
            drivers[e["pid"]][kind] += dur
            lo_hi = driver_span.setdefault(e["pid"], [ts, ts + dur])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], ts), max(lo_hi[1], ts + dur)

    groups = []
    for group, per_rank in busy.items():
        used = sum(_union_us(spans) for spans in per_rank.values())
        groups.append(GroupStats(group, len(per_rank), used, max(span * len(per_rank) - used, 0)))
    driver_stats = []
    for pid, kinds in drivers.items():
        # The driver's time: from its first dispatch to the end of its last collection.
        lo, hi = driver_span[pid]
        driver_stats.append(
            DriverStats(
                names.get(pid, f"driver {pid}"),
                max(hi - lo, 0.0),
                kinds.get("wait", 0.0),
                kinds.get("dispatch", 0.0),
                kinds.get("collect", 0.0),
            )
        )
    return Summary(
        span,
        sorted(methods.values(), key=lambda m: -m.total_us),
        sorted(groups, key=lambda g: g.name),
        sorted(driver_stats, key=lambda d: d.name),
        sorted(restarts, key=lambda r: r.at_us),
    )


def _ms(us: float) -> str:
    return f"{us / 1000.0:.3f}"


def render(summary: Summary) -> str:
    """The summary as the text `twinkle trace summary` prints."""
    lines = [f"trace span: {_ms(summary.span_us)} ms", ""]
    if not summary.methods:
        lines.append("no worker executions recorded")
    else:
        width = max(len("method"), *(len(m.name) for m in summary.methods))
        lines.append(
            f"{'method':<{width}}  {'count':>7}  {'total ms':>11}  {'p50 ms':>9}  {'p95 ms':>9}"
        )
        for m in summary.methods:
            lines.append(
                f"{m.name:<{width}}  {m.count:>7}  {_ms(m.total_us):>11}  "
                f"{_ms(m.percentile(50)):>9}  {_ms(m.percentile(95)):>9}"
            )
    if summary.groups:
        lines += ["", "group idle time (span x ranks - time executing):"]
        for g in summary.groups:
            lines.append(
                f"  {g.name}: {g.ranks} rank(s), idle {_ms(g.idle_us)} ms of "
                f"{_ms(g.idle_us + g.busy_us)} ms ({g.idle_fraction:.1%})"
            )
    if summary.drivers:
        lines += ["", "driver time spent waiting for workers:"]
        for d in summary.drivers:
            lines.append(
                f"  {d.name}: waiting {d.wait_fraction:.1%} of {_ms(d.span_us)} ms "
                f"(wait {_ms(d.wait_us)} ms, dispatch {_ms(d.dispatch_us)} ms, "
                f"collect {_ms(d.collect_us)} ms)"
            )
    if summary.restarts:
        lines += ["", "group restarts (from the death until the group served calls again):"]
        for r in summary.restarts:
            outcome = (
                f"generation {r.generation} after" if r.generation is not None else "failed after"
            )
            lines.append(
                f"  {r.group}: died at {_ms(r.at_us)} ms, {outcome} {_ms(r.duration_us)} ms"
                f" ({r.cause[:200]})"
            )
    return "\n".join(lines)


def as_json(summary: Summary) -> dict[str, Any]:
    """The summary as plain data (`twinkle trace summary --json`)."""
    return {
        "span_ms": summary.span_us / 1000.0,
        "methods": [
            {
                "name": m.name,
                "count": m.count,
                "total_ms": m.total_us / 1000.0,
                "p50_ms": m.percentile(50) / 1000.0,
                "p95_ms": m.percentile(95) / 1000.0,
            }
            for m in summary.methods
        ],
        "groups": [
            {
                "name": g.name,
                "ranks": g.ranks,
                "busy_ms": g.busy_us / 1000.0,
                "idle_ms": g.idle_us / 1000.0,
                "idle_fraction": g.idle_fraction,
            }
            for g in summary.groups
        ],
        "drivers": [
            {
                "name": d.name,
                "span_ms": d.span_us / 1000.0,
                "wait_ms": d.wait_us / 1000.0,
                "dispatch_ms": d.dispatch_us / 1000.0,
                "collect_ms": d.collect_us / 1000.0,
                "wait_fraction": d.wait_fraction,
            }
            for d in summary.drivers
        ],
        "restarts": [
            {
                "group": r.group,
                "at_ms": r.at_us / 1000.0,
                "duration_ms": r.duration_us / 1000.0,
                "generation": r.generation,
                "cause": r.cause,
            }
            for r in summary.restarts
        ],
    }

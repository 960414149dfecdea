"""Render a twinkle trace (Chrome Trace Event JSON) as a PNG timeline, for the docs.

    python scripts/render_trace.py run.json docs/images/trace.png [--title TEXT]
        [--since NAME]

`--since NAME` starts the picture at the first event named NAME (e.g. the first step's
dispatch), leaving out the start-up before it; times are then counted from there.

One row per track, as Perfetto shows them: the driver's threads first, then each group's
ranks; one bar per complete event ("ph": "X"), coloured by method (driver bars by kind:
dispatch, wait, collect). Needs matplotlib (`pip install matplotlib`); nothing of twinkle.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

DRIVER_COLOURS = {"dispatch": "#9e9e9e", "wait": "#e57373", "collect": "#64b5f6"}
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f"]


def load_tracks(events: list[dict]) -> tuple[list[tuple[int, int, str]], dict, list[dict]]:
    """(tracks in display order as (pid, tid, label), process names, complete events)."""
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    complete = [e for e in events if e.get("ph") == "X"]
    keys = sorted({(e["pid"], e["tid"]) for e in complete})
    tracks = [
        (pid, tid, f"{processes.get(pid, pid)} / {threads.get((pid, tid), tid)}")
        for pid, tid in keys
    ]
    return tracks, processes, complete


def render(path: str, out: str, title: str | None = None, since: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(path) as f:
        events = json.load(f)["traceEvents"]
    tracks, _, complete = load_tracks(events)
    if since is not None:
        starts = [e["ts"] for e in complete if e["name"] == since]
        if not starts:
            raise SystemExit(f"render_trace.py: no event named {since!r} in {path}")
        origin = min(starts)
        complete = [{**e, "ts": e["ts"] - origin} for e in complete if e["ts"] + e["dur"] >= origin]
        for e in complete:
            if e["ts"] < 0:
                e["dur"], e["ts"] = e["dur"] + e["ts"], 0.0
    row = {(pid, tid): i for i, (pid, tid, _) in enumerate(tracks)}
    colours: dict[str, str] = {}
    bars: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for e in complete:
        cat = e.get("cat", "")
        if cat in DRIVER_COLOURS:
            key = cat
            colours[key] = DRIVER_COLOURS[cat]
        else:
            key = e["name"]
            colours.setdefault(
                key, PALETTE[len([k for k in colours if k not in DRIVER_COLOURS]) % len(PALETTE)]
            )
        bars[key].append(
            (e["ts"] / 1000.0, max(e["dur"] / 1000.0, 0.05), row[(e["pid"], e["tid"])])
        )

    height = 0.6 + 0.38 * len(tracks)
    fig, ax = plt.subplots(figsize=(12, height))
    for key, items in bars.items():
        for start, width, r in items:
            ax.broken_barh([(start, width)], (r - 0.4, 0.8), facecolors=colours[key], linewidth=0)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([label for _, _, label in tracks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", help="the trace file written by initialize(trace=...)")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--title", default=None)
    parser.add_argument("--since", default=None, metavar="NAME", help="start at this event")
    args = parser.parse_args()
    render(args.trace, args.out, args.title, args.since)


if __name__ == "__main__":
    main()

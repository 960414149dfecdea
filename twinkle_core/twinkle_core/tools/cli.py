"""The `twinkle` command.

- `twinkle plugins [--json]`: installed plugins and what they register.
- `twinkle version`: the twinkle-core version.
- `twinkle doctor [--json] [--BACKEND [ADDRESS]]`: what this machine (and a cluster, e.g.
  `--ray 10.0.0.1:6379`) offers a run, and what stands in its way, each problem with its fix
  (see `twinkle_core.tools.doctor`). The cluster is looked at by the backend's plugin
  (hook `twinkle_doctor_probe`): any installed backend may offer it.
- `twinkle placement FILE [--nproc-per-node N] [--nodes N]`: draw the placement of the groups a
  TOML or JSON file describes, without a cluster (see `twinkle_core.tools.placement_plan`).
- `twinkle trace summary FILE [--json]`: per-method counts and times, idle time per group and
  the driver's waiting in a trace written by `initialize(trace=...)` (see docs/tracing.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..errors import PluginNotFoundError
from ..plugins import KINDS, core_version, plugin_system


def _plugins_text() -> str:
    lines = []
    for info in plugin_system().plugins():
        dist = f"{info.distribution} {info.version}" if info.distribution else "(no distribution)"
        lines.append(f"{info.name}  [{dist}]")
        for kind in KINDS:
            names = info.registers.get(kind) or []
            if names:
                lines.append(f"  {kind}: {', '.join(names)}")
        if info.error:
            lines.append(f"  ERROR: {info.error}")
    return "\n".join(lines)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _probes(parser: argparse.ArgumentParser, rest: list[str]) -> dict[str, str]:
    """`--BACKEND [ADDRESS]` options of `twinkle doctor`: {backend: address ("auto")}.

    A backend is a name a plugin registers, or one an extra of twinkle-core would install
    (then the report says how to install it); anything else is an unknown option.
    """
    from ..install_hints import known_names
    from ..plugins import registered_names

    known = set(registered_names("backends")) | set(known_names("backends"))
    probes: dict[str, str] = {}
    i = 0
    while i < len(rest):
        token = rest[i]
        name, eq, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if name not in known:
            parser.error(
                f"doctor: unrecognized argument {token!r} (cluster options are --BACKEND "
                f"[ADDRESS] for a backend: {', '.join(sorted(known)) or 'none installed'})"
            )
        if not eq:
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            value = "auto"
            if nxt is not None and not nxt.startswith("-"):
                value, i = nxt, i + 1
        probes[name] = value
        i += 1
    return probes


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose, render_text

    report = diagnose(probes=args.probes, timeout=args.timeout)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report))
    return 1 if report["problems"] else 0


def _placement(args: argparse.Namespace) -> int:
    from .placement_plan import PlacementFileError, load_plan, render_plan

    try:
        plan = load_plan(
            args.file, nproc_per_node=args.nproc_per_node, nodes=args.nodes, mode=args.mode
        )
    except PluginNotFoundError as exc:
        print(f"twinkle placement: --mode {args.mode}: {exc}", file=sys.stderr)
        return 1
    except PlacementFileError as exc:
        count = len(exc.issues)
        print(
            f"twinkle placement: {exc.path} cannot be placed "
            f"({count} problem{'s' if count != 1 else ''}):",
            file=sys.stderr,
        )
        for issue in exc.issues:
            print(f"{exc.path}:{issue.line}: {issue.message}", file=sys.stderr)
        return 1
    print(render_plan(plan))
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _trace(args: argparse.Namespace) -> int:
    from .trace_summary import TraceFileError, as_json, load, render, summarize

    try:
        summary = summarize(load(args.file))
    except TraceFileError as exc:
        print(f"twinkle trace summary: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(as_json(summary), indent=2))
    else:
        print(render(summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="twinkle", description="twinkle: one driver script for torchrun and Ray."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plugins = sub.add_parser("plugins", help="list installed plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="print the list as JSON")
    sub.add_parser("version", help="print the twinkle-core version")
    doctor = sub.add_parser(
        "doctor",
        help="check this installation (and a cluster) and name the fix for each problem",
        description="Installed twinkle distributions and plugins, python/torch/ray versions, "
        "the detected accelerator and torchrun variables; with --BACKEND [ADDRESS] (e.g. "
        "--ray, or --ray 10.0.0.1:6379), that backend's cluster as its plugin sees it "
        "(default address: auto). Exits 1 when something asked for cannot work; each problem "
        "is printed with its fix.",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="give up connecting to a cluster after this long (default 60)",
    )
    placement = sub.add_parser(
        "placement",
        help="draw the placement of the groups described in a TOML or JSON file",
        description="Check a groups file with the rules initialize() applies and draw where "
        "each worker would run, as get_device_placement() does; no cluster needed. A bad file "
        "exits 1, each problem on its own `FILE:LINE:` line.",
    )
    placement.add_argument("file", help="groups file: .toml, or .json")
    placement.add_argument(
        "--nproc-per-node",
        type=_positive_int,
        default=None,
        metavar="N",
        help="devices per node (overrides the file's nproc_per_node)",
    )
    placement.add_argument(
        "--mode",
        default=None,
        metavar="NAME",
        help="place as backend NAME would (it is asked: ExecutionBackend.plan_placement); "
        "default: the device-rank rule every built-in backend follows",
    )
    placement.add_argument(
        "--nodes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="nodes in the cluster (overrides the file's nodes); checks that the groups fit",
    )
    trace = sub.add_parser("trace", help="read a trace written by initialize(trace=...)")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    summary = trace_sub.add_parser(
        "summary",
        help="per-method counts and times, idle time per group, driver time spent waiting",
        description="Summarize a Chrome trace written by initialize(trace=...) or "
        "TWINKLE_TRACE: per method its executions, total, p50 and p95 times; per group the "
        "time its ranks were idle; per driver the fraction of its time spent waiting.",
    )
    summary.add_argument("file", help="the trace file (JSON)")
    summary.add_argument("--json", action="store_true", help="print one JSON object")
    args, rest = parser.parse_known_args(argv)
    if args.command == "doctor":
        args.probes = _probes(parser, rest)
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "trace":
        return _trace(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "placement":
        return _placement(args)
    if args.command == "plugins":
        if args.json:
            print(json.dumps([i.as_json() for i in plugin_system().plugins()], indent=2))
        else:
            print(_plugins_text())
        return 0
    if args.command == "version":
        print(core_version())
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The `twinkle` command: `twinkle plugins [--json]`, `twinkle version`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .plugins import KINDS, core_version, plugin_system


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="twinkle", description="twinkle: one driver script for torchrun and Ray."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plugins = sub.add_parser("plugins", help="list installed plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="print the list as JSON")
    sub.add_parser("version", help="print the twinkle-core version")
    args = parser.parse_args(argv)
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

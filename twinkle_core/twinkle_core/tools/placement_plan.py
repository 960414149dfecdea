"""`twinkle placement groups.toml`: draw a run's placement from a file, without a cluster.

The file describes the groups that `initialize(groups=[...])` would get (TOML or JSON)::

    nproc_per_node = 8          # devices per node (or pass --nproc-per-node)
    nodes = 2                   # optional: how many nodes the cluster has

    [[groups]]
    name = "model"
    ranks = [0, 1, 2, 3]        # global device ranks
    device_type = "cuda"
    gpus_per_worker = 1         # optional, as in DeviceGroup
    visible_devices = [...]     # optional, as in DeviceGroup

    [[groups]]
    name = "processor"
    ranks = 4                   # a CPU group is a worker count
    device_type = "cpu"

Each group is built with `DeviceGroup` itself, so its rules are the ones `initialize()`
applies. On top of them the plan checks what only the whole layout shows: one device rank in
two accelerator groups of a device type, a CPU group given device ranks, a device type no
platform knows, a worker whose devices span nodes, and ranks beyond `nodes * nproc_per_node`.
Device rank `r` goes to node `r // nproc_per_node` and local device `r % nproc_per_node`, as
the Ray backend plans it: the rule is `DeviceGroup`'s (`worker_node`, `worker_devices`), and
the plan is asked of the backend that would run it (`ExecutionBackend.plan_placement`;
`--mode NAME`, by default the rule itself). Every problem names its group and the line of the
file to fix.
"""

from __future__ import annotations

import bisect
import json
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backend import ExecutionBackend
from ..device_group import DeviceGroup, canonical_device_type
from ..errors import ConfigurationError
from ..install_hints import install_command, install_hint, known_names
from ..placement import draw_box, draw_topology, format_ranks, group_line, worker_line
from ..plugins import get_plugin, registered_names

#: Keys a group table may have: `DeviceGroup`'s arguments.
GROUP_KEYS = ("name", "ranks", "device_type", "gpus_per_worker", "visible_devices")
REQUIRED_GROUP_KEYS = ("name", "ranks")
#: Keys the top level of the file may have.
TOP_KEYS = ("nproc_per_node", "nodes", "groups")


@dataclass(frozen=True)
class PlanIssue:
    """One thing wrong with a placement file: the line to fix, the groups concerned, why."""

    line: int
    message: str
    groups: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"line": self.line, "groups": list(self.groups), "problem": self.message}


class PlacementFileError(ConfigurationError):
    """A placement file that cannot be drawn; `issues` lists every problem found, by line."""

    def __init__(self, path: str, issues: Sequence[PlanIssue]) -> None:
        self.path = path
        self.issues = list(issues)
        super().__init__("\n".join(f"{path}:{i.line}: {i.message}" for i in self.issues))


@dataclass(frozen=True)
class PlannedWorker:
    rank: int
    node: str | None
    devices: tuple[int, ...]
    device_ranks: tuple[int, ...]


@dataclass
class Plan:
    """The groups of a valid file and where each worker would run."""

    source: str
    nproc_per_node: int | None
    nodes: int
    groups: list[DeviceGroup]
    workers: dict[str, list[PlannedWorker]] = field(default_factory=dict)
    #: Notes that do not stop the plan (e.g. a platform not installed on this machine).
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- line numbers
class _Lines:
    """Where things are in the source text, so a problem can name the line to edit."""

    def top(self, key: str) -> int:
        raise NotImplementedError

    def group(self, index: int) -> int:
        raise NotImplementedError

    def key(self, index: int, key: str) -> int:
        raise NotImplementedError

    def item(self, index: int, key: str, position: int) -> int:
        """The line of element `position` of the list under `key` (the key's line if unknown)."""
        return self.key(index, key)


_TOML_KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")
_TOML_GROUPS_HEADER = re.compile(r"""^\s*\[\[\s*(?:groups|"groups"|'groups')\s*\]\]""")
_TOML_HEADER = re.compile(r"^\s*\[")
_TOML_INLINE_NAME = re.compile(r"""(?:^|[{,\s])name\s*=""")


class _TomlLines(_Lines):
    """Line numbers from a TOML text: `[[groups]]` headers, their keys, top-level keys.

    Groups written inline (`groups = [{...}, ...]`) are found by their `name = "..."`.
    """

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.tops: dict[str, int] = {}
        self._names: list[int] | None = None  # see _inline
        self.headers: list[int] = []
        self.keys: list[dict[str, int]] = []
        table: str | None = ""  # "" top level, "groups" inside [[groups]], None elsewhere
        in_string: str | None = None
        for number, raw in enumerate(self.lines, start=1):
            if in_string is not None:
                if raw.count(in_string) % 2:
                    in_string = None
                continue
            if _TOML_GROUPS_HEADER.match(raw):
                table = "groups"
                self.headers.append(number)
                self.keys.append({})
                continue
            if _TOML_HEADER.match(raw):
                table = None
                continue
            match = _TOML_KEY.match(raw)
            if match:
                key = match.group(1).strip("\"'")
                if table == "":
                    self.tops.setdefault(key, number)
                elif table == "groups":
                    self.keys[-1].setdefault(key, number)
            for quote in ('"""', "'''"):
                if raw.count(quote) % 2:
                    in_string = quote
                    break

    def top(self, key: str) -> int:
        return self.tops.get(key, 1)

    def _inline(self, index: int) -> int | None:
        """The line of the `index`-th inline group's `name = `, counting from `groups =`."""
        start = self.tops.get("groups")
        if start is None:
            return None
        if self._names is None:
            # One entry per `name =` from `groups =` on, found once: a file of thousands of
            # inline groups is asked about each of them.
            self._names = [
                number
                for number in range(start, len(self.lines) + 1)
                for _ in _TOML_INLINE_NAME.finditer(self.lines[number - 1])
            ]
        return self._names[index] if index < len(self._names) else start

    def group(self, index: int) -> int:
        if index < len(self.headers):
            return self.headers[index]
        return self._inline(index) or self.top("groups")

    def key(self, index: int, key: str) -> int:
        if index < len(self.keys):
            return self.keys[index].get(key, self.group(index))
        return self.group(index)


@dataclass
class _Node:
    """A JSON value's offset, with the offsets of an object's keys and a list's items."""

    offset: int
    keys: dict[str, tuple[int, _Node]] = field(default_factory=dict)
    items: list[_Node] = field(default_factory=list)


#: The JSON module's own string scanner: (decoded string, offset after its closing quote).
scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009  # not in typeshed

_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON_SCALAR = re.compile(
    r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|NaN|-?Infinity"
)


def _json_node(text: str, i: int) -> tuple[_Node, int]:
    """Walk one value of `text` (already known to be valid JSON) from offset `i`."""
    i = _JSON_WS.match(text, i).end()  # type: ignore[union-attr]
    node = _Node(i)
    char = text[i]
    if char in "{[":
        close = "}" if char == "{" else "]"
        i = _JSON_WS.match(text, i + 1).end()  # type: ignore[union-attr]
        while text[i] != close:
            if char == "{":
                key_offset = i
                key, i = scanstring(text, i + 1)
                i = _JSON_WS.match(text, i).end() + 1  # type: ignore[union-attr]  # the ':'
                child, i = _json_node(text, i)
                node.keys[key] = (key_offset, child)
            else:
                child, i = _json_node(text, i)
                node.items.append(child)
            i = _JSON_WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i] == ",":
                i = _JSON_WS.match(text, i + 1).end()  # type: ignore[union-attr]
        return node, i + 1
    if char == '"':
        return node, scanstring(text, i + 1)[1]
    match = _JSON_SCALAR.match(text, i)
    if match is None:  # pragma: no cover - json.loads accepted the text
        raise ValueError(f"unexpected JSON at offset {i}")
    return node, match.end()


class _JsonLines(_Lines):
    def __init__(self, text: str) -> None:
        self.text = text
        self._newlines: list[int] | None = None  # see _line
        try:
            self.root: _Node | None = _json_node(text, 0)[0]
        except (ValueError, IndexError):  # pragma: no cover - a walker bug must not hide errors
            self.root = None

    def _line(self, offset: int) -> int:
        if self._newlines is None:  # found once: a file of thousands of groups asks per group
            self._newlines = [m.start() for m in re.finditer("\n", self.text)]
        return bisect.bisect_left(self._newlines, offset) + 1

    def _group(self, index: int) -> _Node | None:
        if self.root is None or "groups" not in self.root.keys:
            return None
        items = self.root.keys["groups"][1].items
        return items[index] if index < len(items) else None

    def top(self, key: str) -> int:
        if self.root is not None and key in self.root.keys:
            return self._line(self.root.keys[key][0])
        return 1

    def group(self, index: int) -> int:
        node = self._group(index)
        return self._line(node.offset) if node is not None else self.top("groups")

    def key(self, index: int, key: str) -> int:
        node = self._group(index)
        if node is not None and key in node.keys:
            return self._line(node.keys[key][0])
        return self.group(index)

    def item(self, index: int, key: str, position: int) -> int:
        node = self._group(index)
        if node is not None and key in node.keys:
            items = node.keys[key][1].items
            if position < len(items):
                return self._line(items[position].offset)
        return self.key(index, key)


# --------------------------------------------------------------------------- parsing
_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOML_WHERE = re.compile(r"\s*\(at (?:line \d+, column \d+|end of document)\)")


def _is_json(path: str, text: str) -> bool:
    if path.endswith(".json"):
        return True
    if path.endswith(".toml"):
        return False
    return text.lstrip().startswith("{")


def parse_text(text: str, path: str) -> tuple[Any, _Lines]:
    """The file's data and its line finder; a syntax error is a `PlacementFileError`."""
    if _is_json(path, text):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlacementFileError(
                path, [PlanIssue(exc.lineno, f"JSON syntax error: {exc.msg} (column {exc.colno})")]
            ) from None
        return data, _JsonLines(text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        lineno = getattr(exc, "lineno", None)  # Python 3.14+
        found = _TOML_AT.search(message)
        if lineno is None:
            # "(at end of document)": something opened is never closed; show the last line.
            lineno = int(found.group(1)) if found else max(1, len(text.splitlines()))
        message = _TOML_WHERE.sub("", getattr(exc, "msg", message)).strip()
        column = getattr(exc, "colno", None) or (int(found.group(2)) if found else None)
        where = f" (column {column})" if column else " (at the end of the file)"
        raise PlacementFileError(
            path, [PlanIssue(lineno, f"TOML syntax error: {message}{where}")]
        ) from None
    return data, _TomlLines(text)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _known_device_types() -> tuple[set[str], set[str]]:
    """(names platforms installed here register, names twinkle's own plugins would add)."""
    installed = set(registered_names("platforms")) | {"cpu"}
    known = set(known_names("platforms"))
    return installed, known


#: Which key of a group a `DeviceGroup` error is about, tried in this order.
_BLAME = ("visible_devices", "gpus_per_worker", "ranks", "device_type", "name")


def _blamed_key(message: str) -> str:
    for key in _BLAME:
        if key in message:
            return key
    return "name"


def _strip_prefix(message: str, name: str) -> str:
    for prefix in (f"DeviceGroup {name!r}: ", "DeviceGroup(name=...) "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def build_plan(
    data: Any,
    lines: _Lines,
    path: str,
    *,
    nproc_per_node: int | None = None,
    nodes: int | None = None,
    backend: type[ExecutionBackend] = ExecutionBackend,
) -> Plan:
    """Check the parsed file and place its groups; a `PlacementFileError` lists every problem.

    `nproc_per_node` and `nodes` (from the command line) override the file's values; the
    workers are placed by `backend.plan_placement` (by default the device-rank rule).
    """
    issues: list[PlanIssue] = []
    if not isinstance(data, dict):
        raise PlacementFileError(
            path,
            [PlanIssue(1, "the file must be a table (TOML) or an object (JSON) with `groups`")],
        )
    for key in data:
        if key not in TOP_KEYS:
            issues.append(
                PlanIssue(
                    lines.top(key),
                    f"unknown top-level key {key!r}; the keys are {', '.join(TOP_KEYS)}",
                )
            )
    npn = nproc_per_node
    if npn is None and "nproc_per_node" in data:
        npn = data["nproc_per_node"]
        if not _positive(npn):
            issues.append(
                PlanIssue(
                    lines.top("nproc_per_node"),
                    f"nproc_per_node must be a positive integer (devices per node), got {npn!r}",
                )
            )
            npn = None
    node_count = nodes
    if node_count is None and "nodes" in data:
        node_count = data["nodes"]
        if not _positive(node_count):
            issues.append(
                PlanIssue(
                    lines.top("nodes"),
                    f"nodes must be a positive integer (nodes in the cluster), got {node_count!r}",
                )
            )
            node_count = None
    raw_groups = data.get("groups")
    if raw_groups is None:
        issues.append(
            PlanIssue(
                1,
                "missing key 'groups': add one [[groups]] table per device group "
                '(name = "model", ranks = [0, 1], device_type = "cuda")',
            )
        )
        raise PlacementFileError(path, issues)
    if not isinstance(raw_groups, list) or not raw_groups:
        issues.append(
            PlanIssue(
                lines.top("groups"),
                "groups must be a non-empty list of tables ([[groups]] in TOML, a list of "
                "objects in JSON)",
            )
        )
        raise PlacementFileError(path, issues)

    installed, provided = _known_device_types()
    # Each spelling of a device type is looked up once (it asks every platform plugin for its
    # aliases): a file of thousands of groups names the same few.
    canonical_of: dict[str, str] = {}
    notes: list[str] = []
    groups: list[tuple[int, DeviceGroup]] = []
    names: dict[str, int] = {}
    for index, raw in enumerate(raw_groups):
        where = lines.group(index)
        if not isinstance(raw, dict):
            issues.append(PlanIssue(where, f"groups[{index}] must be a table, got {raw!r}"))
            continue
        label = f"group {raw['name']!r}" if isinstance(raw.get("name"), str) else f"groups[{index}]"
        who = (raw["name"],) if isinstance(raw.get("name"), str) else ()
        bad = False
        for key in raw:
            if key not in GROUP_KEYS:
                issues.append(
                    PlanIssue(
                        lines.key(index, key),
                        f"{label}: unknown key {key!r}; a group's keys are {', '.join(GROUP_KEYS)}",
                        who,
                    )
                )
                bad = True
        for key in REQUIRED_GROUP_KEYS:
            if key not in raw:
                example = '"model"' if key == "name" else "[0, 1, 2, 3] (or a worker count for cpu)"
                issues.append(
                    PlanIssue(where, f"{label}: missing key {key!r}; add {key} = {example}", who)
                )
                bad = True
        device_type = raw.get("device_type", "cpu")
        try:
            if isinstance(device_type, str) and device_type in canonical_of:
                canonical = canonical_of[device_type]
            else:
                canonical = canonical_device_type(device_type)
                canonical_of[device_type] = canonical
        except ConfigurationError as exc:
            issues.append(PlanIssue(lines.key(index, "device_type"), f"{label}: {exc}", who))
            continue
        if canonical not in installed | provided:
            known = ", ".join(sorted(installed | provided))
            issues.append(
                PlanIssue(
                    lines.key(index, "device_type"),
                    f"{label}: unknown device type {device_type!r}; no installed platform "
                    f"registers it (known: {known}). Fix the spelling, or install the plugin "
                    "that provides the platform (`twinkle plugins` lists what is installed)",
                    who,
                )
            )
            continue
        if bad:
            continue
        try:
            group = DeviceGroup(**{k: raw[k] for k in GROUP_KEYS if k in raw})
        except (ConfigurationError, TypeError) as exc:
            key = _blamed_key(str(exc))
            issues.append(
                PlanIssue(
                    lines.key(index, key),
                    f"{label}: {_strip_prefix(str(exc), str(raw.get('name')))}",
                    who,
                )
            )
            continue
        if group.device_type not in installed:
            extra, packages = install_hint("platforms", group.device_type) or ("<extra>", ())
            note = (
                f"{group.device_type}: this machine has no {group.device_type} platform; "
                f"initialize() needs {install_command(extra)} (provides {', '.join(packages)})"
            )
            if note not in notes:
                notes.append(note)
        if group.is_cpu and not isinstance(raw["ranks"], int):
            issues.append(
                PlanIssue(
                    lines.key(index, "ranks"),
                    f"{label}: a cpu group takes a worker count, not device ranks: write "
                    f"ranks = {len(group.rank_list)}, or give the group an accelerator "
                    'device_type such as "cuda"',
                    who,
                )
            )
            continue
        if group.name in names:
            first = names[group.name]
            issues.append(
                PlanIssue(
                    lines.key(index, "name"),
                    f"group name {group.name!r} repeats (first at line "
                    f"{lines.key(first, 'name')}); give every group its own name",
                    (group.name,),
                )
            )
            continue
        names[group.name] = index
        groups.append((index, group))

    accelerators = [(i, g) for i, g in groups if not g.is_cpu]
    if accelerators and npn is None:
        issues.append(
            PlanIssue(
                1,
                "nproc_per_node is not set: add `nproc_per_node = 8` (devices per node) at the top "
                "of the file, or pass --nproc-per-node",
            )
        )
    issues += _overlaps(accelerators, lines)
    if npn is not None:
        issues += _node_fit(accelerators, lines, npn, node_count)
    if issues:
        raise PlacementFileError(path, sorted(issues, key=lambda i: i.line))
    top = max((max(g.rank_list) for _, g in accelerators), default=-1)
    plan = Plan(
        source=path,
        nproc_per_node=npn,
        nodes=node_count if node_count is not None else (top // npn + 1 if npn and top >= 0 else 0),
        groups=[g for _, g in groups],
        notes=notes,
    )
    _place(plan, backend)
    return plan


def _overlaps(accelerators: list[tuple[int, DeviceGroup]], lines: _Lines) -> list[PlanIssue]:
    """A device rank of one device type in two groups: one issue per pair of groups."""
    issues = []
    owner: dict[tuple[str, int], tuple[int, DeviceGroup]] = {}
    for index, group in accelerators:
        shared: dict[str, tuple[int, DeviceGroup, list[int]]] = {}
        for rank in group.rank_list:
            key = (group.device_type, rank)
            if key in owner:
                first_index, first = owner[key]
                shared.setdefault(first.name, (first_index, first, []))[2].append(rank)
            else:
                owner[key] = (index, group)
        for first_index, first, ranks in shared.values():
            issues.append(
                PlanIssue(
                    lines.key(index, "ranks"),
                    f"groups {first.name!r} (line {lines.key(first_index, 'ranks')}) and "
                    f"{group.name!r} both use {group.device_type} device rank(s) "
                    f"{format_ranks(ranks)}; give each accelerator group its own ranks",
                    (first.name, group.name),
                )
            )
    return issues


def _node_fit(
    accelerators: list[tuple[int, DeviceGroup]], lines: _Lines, npn: int, nodes: int | None
) -> list[PlanIssue]:
    """Workers within one node; ranks within `nodes`; visible devices once per node."""
    issues = []
    for index, group in accelerators:
        top = max(group.rank_list)
        if nodes is not None and top >= nodes * npn:
            issues.append(
                PlanIssue(
                    lines.key(index, "ranks"),
                    f"group {group.name!r} uses {group.device_type} device ranks up to {top}, "
                    f"which needs {top // npn + 1} node(s) of {npn} devices, but the {nodes} "
                    f"node(s) hold ranks 0-{nodes * npn - 1}; use fewer ranks, or more nodes",
                    (group.name,),
                )
            )
            continue
        for w in range(group.num_workers):
            spans = group.spanning_message(w, npn)
            if spans is not None:
                key = "gpus_per_worker" if group.gpus_per_worker > 1 else "ranks"
                issues.append(
                    PlanIssue(
                        lines.key(index, key), f"group {group.name!r}: {spans}", (group.name,)
                    )
                )
                break
        if group.visible_devices is not None:
            used: dict[tuple[int, int], int] = {}
            for position, (rank, device) in enumerate(
                zip(group.rank_list, group.visible_devices, strict=True)
            ):
                if isinstance(device, bool) or not isinstance(device, int) or device < 0:
                    issues.append(
                        PlanIssue(
                            lines.item(index, "visible_devices", position),
                            f"group {group.name!r}: visible_devices[{position}]={device!r} "
                            "must be a non-negative integer device id",
                            (group.name,),
                        )
                    )
                    break
                spot = (rank // npn, device)
                if spot in used:
                    issues.append(
                        PlanIssue(
                            lines.item(index, "visible_devices", position),
                            f"group {group.name!r}: visible_devices[{position}]={device} (device "
                            f"rank {rank}, node {rank // npn}) is already used by device rank "
                            f"{used[spot]} of the group on that node; give every rank its own "
                            "device",
                            (group.name,),
                        )
                    )
                    break
                used[spot] = rank
    return issues


def _place(plan: Plan, backend: type[ExecutionBackend]) -> None:
    """Ask `backend` where each worker goes (`ExecutionBackend.plan_placement`)."""
    placed = backend.plan_placement(plan.groups, plan.nproc_per_node)
    for group in plan.groups:
        plan.workers[group.name] = [
            PlannedWorker(p.rank, p.node, tuple(p.devices), group.worker_ranks(p.rank))
            for p in placed[group.name]
        ]


# --------------------------------------------------------------------------- entry points
def load_plan(
    path: str | Path,
    *,
    nproc_per_node: int | None = None,
    nodes: int | None = None,
    mode: str | None = None,
) -> Plan:
    """Read, check and place a placement file (TOML, or JSON by its `.json` suffix), as the
    backend of `mode` would place it (None: the device-rank rule every built-in one follows)."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlacementFileError(name, [PlanIssue(1, f"cannot read the file: {exc}")]) from None
    data, lines = parse_text(text, name)
    backend = ExecutionBackend if mode is None else get_plugin("backends", mode)
    return build_plan(
        data, lines, name, nproc_per_node=nproc_per_node, nodes=nodes, backend=backend
    )


def render_plan(plan: Plan) -> str:
    """The plan as `get_device_placement()` draws a live run: the topology (a box per group),
    then, as `detail=True` adds, where each worker goes."""
    return draw_topology([(group, []) for group in plan.groups]) + "\n" + _render_detail(plan)


def _render_detail(plan: Plan) -> str:
    header = [f"twinkle placement {plan.source}"]
    if plan.nproc_per_node is not None:
        header.append(f"nproc_per_node {plan.nproc_per_node}")
    if plan.nodes:
        header.append(f"nodes {plan.nodes}")
    lines = ["  ".join(header)]
    for group in plan.groups:
        lines.append("")
        lines.append(group_line(group))
        if group.is_cpu:
            lines.append("  (cpu workers: the backend picks their nodes)")
        for worker in plan.workers[group.name]:
            lines.append(
                worker_line(
                    worker.rank,
                    worker.device_ranks,
                    worker.node,
                    group.device_type,
                    worker.devices,
                    indent="  ",
                )
            )
    return draw_box(lines)

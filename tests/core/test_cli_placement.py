"""`twinkle placement FILE`: a groups file drawn like `get_device_placement()`, or every problem
with the line to fix. Direct calls for the cases, real `twinkle` processes for the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from _support.cli import twinkle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_device_placement,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugin import ExecutionBackend, hookimpl
from twinkle_core.plugins import plugin_system
from twinkle_core.tools.cli import main as cli_main
from twinkle_core.tools.placement_plan import PlacementFileError, load_plan, render_plan

EXAMPLE = """\
nproc_per_node = 8
[[groups]]
name = "model"
ranks = [0, 1, 2, 3]
device_type = "cuda"
[[groups]]
name = "processor"
ranks = 4
device_type = "cpu"
"""

TOPOLOGY = """\
╔══════════════════════════════════════════════════════════════════════════════╗
║ DEVICE PLACEMENT TOPOLOGY                                                    ║
╚══════════════════════════════════════════════════════════════════════════════╝
┌──────────────────────────────────────────────────────────────────────────────┐
│ ◈ DeviceGroup: model                                                         │
├──────────────────────────────────────────────────────────────────────────────┤
│ ├─ Device Type : cuda                                                        │
│ └─ Ranks       : [0, 1, 2, 3]                                                │
└──────────────────────────────────────────────────────────────────────────────┘
┌──────────────────────────────────────────────────────────────────────────────┐
│ ◈ DeviceGroup: processor                                                     │
├──────────────────────────────────────────────────────────────────────────────┤
│ ├─ Device Type : cpu                                                         │
│ └─ Ranks       : [0, 1, 2, 3]                                                │
└──────────────────────────────────────────────────────────────────────────────┘
"""

EXAMPLE_DRAWING = (
    TOPOLOGY
    + """\
┌────────────────────────────────────────────────────────────┐
│ twinkle placement groups.toml  nproc_per_node 8  nodes 1   │
├────────────────────────────────────────────────────────────┤
│ group model  cuda  ranks 0-3  workers 4                    │
│   group rank 0   global rank 0   node node0  device cuda:0 │
│   group rank 1   global rank 1   node node0  device cuda:1 │
│   group rank 2   global rank 2   node node0  device cuda:2 │
│   group rank 3   global rank 3   node node0  device cuda:3 │
│                                                            │
│ group processor  cpu  ranks 0-3  workers 4                 │
│   (cpu workers: the backend picks their nodes)             │
│   group rank 0   global rank 0   node -  device cpu        │
│   group rank 1   global rank 1   node -  device cpu        │
│   group rank 2   global rank 2   node -  device cpu        │
│   group rank 3   global rank 3   node -  device cpu        │
└────────────────────────────────────────────────────────────┘"""
)


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(textwrap.dedent(text))
    return name


def problems(tmp_path: Path, name: str, capsys, *args: str) -> list[tuple[int, str]]:
    """Run `twinkle placement` in-process; assert it fails; (line, message) per problem."""
    os.chdir(tmp_path)
    assert cli_main(["placement", name, *args]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"twinkle placement: {name} cannot be placed")
    out = []
    for line in err[1:]:
        assert line.startswith(f"{name}:"), line
        _, number, message = line.split(":", 2)
        out.append((int(number), message.strip()))
    return out


@pytest.fixture(autouse=True)
def _keep_cwd():
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


# --------------------------------------------------------------------------- good files
def test_console_script_draws_the_example(tmp_path):
    write(tmp_path, "groups.toml", EXAMPLE)
    result = twinkle("placement", "groups.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == EXAMPLE_DRAWING


def test_python_dash_m_with_nproc_per_node_from_the_command_line(tmp_path):
    write(tmp_path, "g.toml", EXAMPLE.replace("nproc_per_node = 8\n", ""))
    result = subprocess.run(
        [sys.executable, "-m", "twinkle_core", "placement", "g.toml", "--nproc-per-node", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "nproc_per_node 2  nodes 2" in result.stdout
    assert "group rank 2   global rank 2   node node1  device cuda:0" in result.stdout
    assert "group rank 3   global rank 3   node node1  device cuda:1" in result.stdout


def test_json_file_draws_the_same(tmp_path):
    data = {
        "nproc_per_node": 8,
        "groups": [
            {"name": "model", "ranks": [0, 1, 2, 3], "device_type": "cuda"},
            {"name": "processor", "ranks": 4, "device_type": "cpu"},
        ],
    }
    (tmp_path / "groups.json").write_text(json.dumps(data, indent=2))
    drawing = render_plan(load_plan(tmp_path / "groups.json"))
    (tmp_path / "groups.toml").write_text(EXAMPLE)
    same = render_plan(load_plan(tmp_path / "groups.toml"))
    assert drawing.replace("groups.json", "groups.toml") == same


def test_flag_overrides_file_and_multi_device_workers(tmp_path):
    write(
        tmp_path,
        "g.toml",
        """\
        nproc_per_node = 8
        nodes = 2
        [[groups]]
        name = "sampler"
        ranks = [4, 5, 6, 7, 8, 9, 10, 11]
        device_type = "cuda"
        gpus_per_worker = 2
        [[groups]]
        name = "pinned"
        ranks = [0, 1]
        device_type = "cuda"
        visible_devices = [3, 2]
        """,
    )
    plan = load_plan(tmp_path / "g.toml")
    assert plan.nodes == 2
    text = render_plan(plan)
    assert "group sampler  cuda  ranks 4-11  workers 4  2 per worker" in text
    assert "group rank 1   global ranks 6,7  node node0  device cuda:6,7" in text
    assert "group rank 2   global ranks 8,9  node node1  device cuda:0,1" in text
    assert "group rank 0   global rank 0   node node0  device cuda:3" in text
    assert "group rank 1   global rank 1   node node0  device cuda:2" in text
    assert [w.node for w in plan.workers["sampler"]] == ["node0", "node0", "node1", "node1"]


def test_inline_groups_and_upper_case(tmp_path):
    write(
        tmp_path,
        "g.toml",
        """\
        nproc_per_node = 4
        groups = [
          { name = "a", ranks = [0, 1], device_type = "CUDA" },
          { name = "b", ranks = 2 },
        ]
        """,
    )
    plan = load_plan(tmp_path / "g.toml")
    assert [(g.name, g.device_type) for g in plan.groups] == [("a", "cuda"), ("b", "cpu")]


def _drawing_before_the_refactor() -> str:
    """`get_device_placement(detail=True)` as written before it shared its renderer."""
    from twinkle_core.runtime import current_runtime

    def _ranks(ranks):
        if ranks and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
            return f"{ranks[0]}-{ranks[-1]}"
        return ",".join(str(r) for r in ranks)

    runtime = current_runtime()
    cfg = runtime.config
    header = [f"twinkle run {cfg.name}", f"mode {cfg.mode}"]
    for key, value in runtime.backend.describe().items():
        header.append(f"{key} {value}")
    lines: list[str] = ["  ".join(header)]
    for group in cfg.groups.values():
        lines.append("")
        per = f"  {group.gpus_per_worker} per worker" if group.gpus_per_worker > 1 else ""
        lines.append(
            f"group {group.name}  {group.device_type}  ranks {_ranks(group.rank_list)}  "
            f"workers {group.num_workers}{per}"
        )
        bound = [b for b in runtime.bound if b.workers.group.name == group.name]
        if not bound:
            lines.append("  (no remote class placed yet)")
        for b in bound:
            mesh = b.workers.device_mesh
            lines.append(f"  class {b.class_name}  mesh {mesh.describe()}")
            for p in b.workers.placements:
                devices = (
                    f"{p.device_type}:{','.join(str(d) for d in p.devices)}"
                    if p.devices and p.device_type != "cpu"
                    else p.device_type
                )
                node = p.node or "-"
                owned = group.worker_ranks(p.rank)
                # (added with issue 31: both numberings, the group's and the global one)
                label = f"global rank{'s' if len(owned) > 1 else ''} {_ranks(owned)}"
                lines.append(
                    f"    group rank {p.rank:<3} {label:<14}  node {node}  device {devices}  "
                    f"data rank {mesh.data_rank_of(p.rank) if p.rank in mesh.ranks else '-'}"
                    # (added with colocation: the process hosting the worker)
                    f"  process pid {os.getpid()}"
                )
    width = max(len(line) for line in lines)
    top = "┌" + "─" * (width + 2) + "┐"
    sep = "├" + "─" * (width + 2) + "┤"
    bottom = "└" + "─" * (width + 2) + "┘"
    body = [top, f"│ {lines[0].ljust(width)} │", sep]
    body += [f"│ {line.ljust(width)} │" for line in lines[2:]] if len(lines) > 1 else []
    body.append(bottom)
    return "\n".join(body)


def test_the_live_placement_drawing_is_unchanged():
    """`get_device_placement(detail=True)` shares the renderer: byte-for-byte the same."""

    @remote_class(execute="all")
    class Scorer:
        def __init__(self, scale, device_mesh=None):
            self.scale = scale

        @remote_function()
        def f(self):
            return 1

    initialize(
        mode="inprocess",
        name="snap",
        groups=[
            DeviceGroup("scorers", 4, "cpu"),
            DeviceGroup("big", 6, "cpu", gpus_per_worker=2),
            DeviceGroup("empty", [0, 2], "cpu"),
        ],
    )
    assert get_device_placement(detail=True) == _drawing_before_the_refactor()
    Scorer(2.0, device_mesh=DeviceMesh.from_sizes(dp_size=2, tp_size=2), remote_group="scorers")
    Scorer(2.0, remote_group="big")
    text = get_device_placement(detail=True)
    assert text == _drawing_before_the_refactor()
    assert "│ group big  cpu  ranks 0-5  workers 3  2 per worker" in text
    assert "│     group rank 3   global rank 3   node " in text and "data rank 1" in text
    assert "│     group rank 0   global ranks 0,1  node " in text  # big: 2 per worker


# --------------------------------------------------------------------------- bad files
# (file name, text, [(line, [fragments of that line's message]), ...]): every problem, in order.
BAD_FILES = [
    pytest.param(
        "g.toml",
        """\
        nproc_per_node = 8

        [[groups]]
        name = "model"
        ranks = [0, 1, 2, 3]
        device_type = "cuda"

        [[groups]]
        name = "sampler"
        device_type = "cuda"
        # shares two devices with the model
        ranks = [2, 3, 4]
        """,
        [(12, ["'model' (line 5)", "'sampler'", "cuda device rank(s) 2,3"])],
        id="rank-in-two-accelerator-groups-toml",
    ),
    pytest.param(
        "g.json",
        """\
        {
          "nproc_per_node": 8,
          "groups": [
            {"name": "model", "ranks": [0, 1], "device_type": "cuda"},
            {"name": "sampler",
             "device_type": "cuda",
             "ranks": [1, 2]}
          ]
        }
        """,
        [(7, ["'model' (line 4)", "'sampler'"])],
        id="rank-in-two-accelerator-groups-json",
    ),
    pytest.param(
        "g.toml",
        """\
        nproc_per_node = 8
        [[groups]]
        name = "model"
        ranks = [0, 1]
        device_type = "cuda"
        [[groups]]
        name = "processor"
        device_type = "cpu"
        ranks = [4, 5]
        """,
        [(9, ["'processor'", "ranks = 2"])],
        id="cpu-group-given-a-list",
    ),
    pytest.param(
        "g.toml",
        """\
        nproc_per_node = 4
        [[groups]]
        name = "wide"
        ranks = [2, 3, 4, 5, 6, 7]
        device_type = "cuda"
        gpus_per_worker = 3
        """,
        [(6, ["'wide'", "span nodes 0, 1"])],
        id="worker-spanning-two-nodes",
    ),
    pytest.param(
        "g.toml",
        """\
        nproc_per_node = 8
        [[groups]]
        name = "model"
        ranks = [0, 1]
        device_type = "tpu"
        """,
        [(5, ["'model'", "unknown device type 'tpu'", "known: cpu, cuda, mps, npu"])],
        id="unknown-device-type",
    ),
    pytest.param(
        "g.toml",
        """\
        nproc_per_node = 8
        [[groups]]
        name = "model"
        rank = [0, 1]
        device_type = "cuda"
        """,
        [(2, ["missing key 'ranks'"]), (4, ["unknown key 'rank'"])],
        id="misspelt-key",
    ),
    pytest.param(
        "g.toml",
        EXAMPLE.replace("nproc_per_node = 8\n", ""),
        [(1, ["--nproc-per-node"])],
        id="missing-nproc-per-node",
    ),
    pytest.param(
        "g.toml",
        """\
        nproc_per_node = 8
        [[groups]]
        name = "dup"
        ranks = [0, 1, 1]
        device_type = "cuda"
        [[groups]]
        name = "odd"
        ranks = [2, 3, 4]
        device_type = "cuda"
        gpus_per_worker = 2
        [[groups]]
        name = "vis"
        ranks = [5, 6]
        visible_devices = [0]
        device_type = "cuda"
        """,
        [
            (4, ["'dup'", "duplicates"]),
            (10, ["'odd'", "gpus_per_worker=2"]),
            (14, ["'vis'", "visible_devices"]),
        ],
        id="device-group-rules-apply-with-their-line",
    ),
    pytest.param(
        "g.json",
        """\
        {"nproc_per_node": 4,
         "groups": [
          {"name": "a", "ranks": [0, 1], "device_type": "cuda",
           "visible_devices": [
             2,
             2]},
          {"name": "a", "ranks": 1}
         ]}
        """,
        [(6, ["already used by device rank 0"]), (7, ["repeats (first at line 3)"])],
        id="repeated-group-name-and-shared-visible-device",
    ),
    pytest.param(
        "g.toml",
        'nproc_per_node = 8\n[[groups]]\nname = "a"\nranks = [0, 1\n',
        [(4, ["end of the file"])],
        id="toml-unclosed-at-end-of-file",
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), BAD_FILES)
def test_bad_file_names_every_problem_on_its_line(tmp_path, capsys, name, text, expected):
    found = problems(tmp_path, write(tmp_path, name, text), capsys)
    assert [line for line, _ in found] == [line for line, _ in expected], found
    for (line, message), (_, fragments) in zip(found, expected, strict=True):
        missing = [f for f in fragments if f not in message]
        assert missing == [], f"line {line}: {message!r} lacks {missing}"


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        (
            "g.toml",
            """\
            nproc_per_node = 8
            [[groups]]
            name = "model"
            ranks = [0, 1,, 2]
            """,
            "g.toml:4: TOML syntax error",
        ),
        (
            "g.json",
            """\
            {
              "nproc_per_node": 8,
              "groups": [
                {"name": "model", "ranks": [0, 1] "device_type": "cuda"}
              ]
            }
            """,
            "g.json:4: JSON syntax error: Expecting ',' delimiter",
        ),
    ],
    ids=["toml", "json"],
)
def test_syntax_error_names_its_line(tmp_path, name, text, error):
    write(tmp_path, name, text)
    result = twinkle("placement", name, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert error in result.stderr


def test_same_ranks_on_different_device_types_are_fine(tmp_path):
    write(
        tmp_path,
        "g.toml",
        """\
        nproc_per_node = 8
        [[groups]]
        name = "a"
        ranks = [0, 1]
        device_type = "cuda"
        [[groups]]
        name = "b"
        ranks = [0, 1]
        device_type = "npu"
        """,
    )
    assert len(load_plan(tmp_path / "g.toml").groups) == 2


def test_group_larger_than_the_nodes(tmp_path, capsys):
    name = write(
        tmp_path,
        "g.toml",
        """\
        nproc_per_node = 4
        nodes = 1
        [[groups]]
        name = "model"
        ranks = [0, 1, 2, 3, 4, 5]
        device_type = "cuda"
        """,
    )
    [(line, message)] = problems(tmp_path, name, capsys)
    assert line == 5
    assert "'model'" in message and "up to 5" in message and "needs 2 node(s)" in message
    # Without `nodes` the same file fits on two nodes; --nodes on the command line checks it.
    write(tmp_path, "h.toml", (tmp_path / "g.toml").read_text().replace("nodes = 1\n", ""))
    assert len(load_plan(tmp_path / "h.toml").groups) == 1
    [(line, _)] = problems(tmp_path, "h.toml", capsys, "--nodes", "1")
    assert line == 4


@pytest.mark.parametrize(
    ("missing", "expected_line"),
    [("name", 6), ("ranks", 6)],
)
def test_missing_key_points_at_its_group(tmp_path, capsys, missing, expected_line):
    text = textwrap.dedent(
        """\
        nproc_per_node = 8
        [[groups]]
        name = "model"
        ranks = [0, 1]
        device_type = "cuda"
        [[groups]]
        name = "sampler"
        ranks = [2, 3]
        device_type = "cuda"
        """
    )
    lines = text.splitlines(keepends=True)
    del lines[6 if missing == "name" else 7]
    name = write(tmp_path, "g.toml", "".join(lines))
    [(line, message)] = problems(tmp_path, name, capsys)
    assert line == expected_line
    assert f"missing key {missing!r}" in message
    if missing == "ranks":
        assert "'sampler'" in message


def test_missing_file_and_bad_flag(tmp_path, capsys):
    os.chdir(tmp_path)
    assert cli_main(["placement", "nope.toml"]) == 1
    assert "cannot read the file" in capsys.readouterr().err
    write(tmp_path, "g.toml", EXAMPLE)
    with pytest.raises(SystemExit) as exc:
        cli_main(["placement", "g.toml", "--nproc-per-node", "0"])
    assert exc.value.code == 2


def test_placement_file_error_is_a_configuration_error(tmp_path):
    write(tmp_path, "g.toml", "groups = 3\n")
    with pytest.raises(PlacementFileError) as exc:
        load_plan(tmp_path / "g.toml")
    assert isinstance(exc.value, ValueError)
    assert [i.line for i in exc.value.issues] == [1]


# --------------------------------------------------------------------------- line numbers
@st.composite
def layouts(draw):
    """Groups in shuffled key order with comments and blank lines, one of them a CPU group
    wrongly given a list; returns (text, the line of that group's `ranks`)."""
    n = draw(st.integers(1, 4))
    bad = draw(st.integers(0, n - 1))
    out = ["nproc_per_node = 8"]
    target = 0
    for i in range(n):
        for _ in range(draw(st.integers(0, 2))):
            out.append(draw(st.sampled_from(["", "# a comment", "   "])))
        out.append("[[groups]]")
        keys = {
            "name": f'"g{i}"',
            "ranks": "[0, 1]" if i == bad else str(i + 1),
            "device_type": '"cpu"',
        }
        for key in draw(st.permutations(list(keys))):
            for _ in range(draw(st.integers(0, 1))):
                out.append("# between keys")
            out.append(f"{key} = {keys[key]}")
            if i == bad and key == "ranks":
                target = len(out)
    return "\n".join(out) + "\n", target


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layouts())
def test_line_numbers_follow_the_source(tmp_path, layout):
    text, target = layout
    path = tmp_path / "g.toml"
    path.write_text(text)
    with pytest.raises(PlacementFileError) as exc:
        load_plan(path)
    assert [i.line for i in exc.value.issues] == [target], text
    path = tmp_path / "g.json"
    # The same layout as JSON, one key per line: the error is on the `ranks` line there too.
    groups = tomllib.loads(text)["groups"]
    rows = ['{"nproc_per_node": 8, "groups": [']
    json_target = 0
    for group in groups:
        rows.append("{")
        for j, (key, value) in enumerate(group.items()):
            comma = "," if j < len(group) - 1 else ""
            rows.append(f"{json.dumps(key)}: {json.dumps(value)}{comma}")
            if key == "ranks" and isinstance(value, list):
                json_target = len(rows)
        rows.append("},")
    rows[-1] = "}"
    rows.append("]}")
    path.write_text("\n".join(rows))
    with pytest.raises(PlacementFileError) as exc:
        load_plan(path)
    assert [i.line for i in exc.value.issues] == [json_target]


# --------------------------------------------------------------------------- the planning hook
class _MirrorBackend(ExecutionBackend):
    """A backend whose placement rule differs: it counts nodes from the end."""

    name = "mirror"

    @classmethod
    def plan_placement(cls, groups, nproc_per_node):
        plan = super().plan_placement(groups, nproc_per_node)
        return {
            name: [replace(p, node=f"far-{p.node}") if p.node else p for p in placements]
            for name, placements in plan.items()
        }

    def create_workers(self, cls, group, device_mesh, args, kwargs, *, num_workers):
        raise NotImplementedError


class _MirrorPlugin:
    @hookimpl
    def register_backends(self, register):
        register("mirror", _MirrorBackend)


def test_placement_asks_the_backend_that_would_run_the_plan(tmp_path, capsys, fresh_plugins):
    """`--mode NAME` draws what that backend's `plan_placement` answers; without it, the
    device-rank rule (`DeviceGroup.worker_node`/`worker_devices`) every built-in one follows."""
    path = tmp_path / "g.toml"
    path.write_text(
        'nproc_per_node = 2\n[[groups]]\nname = "m"\nranks = [0, 1, 2, 3]\ndevice_type = "cuda"\n'
    )
    default = load_plan(path)
    assert [(w.node, w.devices) for w in default.workers["m"]] == [
        ("node0", (0,)),
        ("node0", (1,)),
        ("node1", (0,)),
        ("node1", (1,)),
    ]
    plugin_system().add(_MirrorPlugin(), "mirror-plugin")
    assert cli_main(["placement", str(path), "--mode", "mirror"]) == 0
    out = capsys.readouterr().out
    assert "node far-node1  device cuda:0" in out and "node node1 " not in out
    assert cli_main(["placement", str(path), "--mode", "no-such-mode"]) == 1
    err = capsys.readouterr().err
    assert "--mode no-such-mode" in err and "installed:" in err


@given(
    npn=st.integers(1, 8),
    per_worker=st.sampled_from([1, 2, 4]),
    workers=st.integers(1, 6),
    first=st.integers(0, 16),
)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_device_rank_rule(npn, per_worker, workers, first):
    """Device rank r sits on node r // nproc_per_node at local device r % nproc_per_node; a
    worker is placed on its first rank's node, and spans nodes exactly when its ranks do."""
    ranks = list(range(first, first + per_worker * workers))
    group = DeviceGroup("g", ranks=ranks, device_type="cuda", gpus_per_worker=per_worker)
    for w in range(workers):
        own = ranks[w * per_worker : (w + 1) * per_worker]
        assert group.worker_node(w, npn) == own[0] // npn
        assert group.worker_devices(w, npn) == tuple(r % npn for r in own)
        spans = len({r // npn for r in own}) > 1
        assert (group.spanning_message(w, npn) is not None) == spans


def test_the_topology_shows_every_object_hosted_on_each_group():
    """The design's layout by default: a box per group, a DeviceMesh block per object on it
    (colocated roles together), every edge aligned; the per-rank table with detail=True."""

    @remote_class()
    class Policy:
        pass

    @remote_class()
    class Reference:
        pass

    initialize(
        "inprocess",
        groups=[DeviceGroup("model", ranks=4, device_type="cpu"), DeviceGroup("io", ranks=1)],
    )
    try:
        Policy(remote_group="model")
        Reference(remote_group="model", device_mesh=DeviceMesh.from_sizes(dp_size=2, tp_size=2))
        text = get_device_placement()
        detail = get_device_placement(detail=True)
    finally:
        shutdown()
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1, "box edges must line up"
    assert lines[1].startswith("║ DEVICE PLACEMENT TOPOLOGY")
    body = [line[2:-2].rstrip() for line in lines]
    model = body.index("◈ DeviceGroup: model")
    io = body.index("◈ DeviceGroup: io")
    assert body[model + 2 : model + 10] == [
        "├─ Device Type : cpu",
        "└─ Ranks       : [0, 1, 2, 3]",
        "┌─ DeviceMesh: Policy",
        "│  Dimensions : dp=4",
        "│  Parallelism: DP=4",
        "┌─ DeviceMesh: Reference",
        "│  Dimensions : dp=2, tp=2",
        "│  Parallelism: DP=2, TP=2",
    ]
    assert "DeviceMesh" not in "".join(body[io:])  # nothing placed on io yet
    assert "rank 3   node" in detail and "class Reference  mesh dp=2 tp=2" in detail

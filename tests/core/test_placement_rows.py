"""The per-worker rows of the placement drawing name both numberings (issue 31, item 5): a
worker's rank in its group and the global ranks it owns, so a group with global ranks 4,5 no
longer reads `rank 0`/`rank 1` with nothing saying which numbering that is."""

from __future__ import annotations

import os
from pathlib import Path

from _support.cli import twinkle

from twinkle_core import (
    DeviceGroup,
    get_device_placement,
    initialize,
    remote_class,
    remote_function,
)
from twinkle_core.placement import worker_line
from twinkle_core.tools.placement_plan import load_plan, render_plan

ROOT = Path(__file__).resolve().parents[2]


def test_a_row_names_the_group_rank_and_the_global_rank():
    assert worker_line(0, (4,), "node0", "cuda", (4,)) == (
        "    group rank 0   global rank 4   node node0  device cuda:4"
    )
    assert worker_line(1, (6, 7), None, "cuda", (2, 3), data_rank=1, indent="") == (
        "group rank 1   global ranks 6,7  node -  device cuda:2,3  data rank 1"
    )


def test_a_planned_group_with_global_ranks_4_and_5(tmp_path):
    (tmp_path / "g.toml").write_text(
        'nproc_per_node = 8\n[[groups]]\nname = "sampler"\nranks = [4, 5]\ndevice_type = "cuda"\n'
    )
    text = render_plan(load_plan(tmp_path / "g.toml"))
    rows = [line[2:-2].rstrip() for line in text.splitlines() if "group rank" in line]
    assert rows == [
        "  group rank 0   global rank 4   node node0  device cuda:4",
        "  group rank 1   global rank 5   node node0  device cuda:5",
    ]


def test_the_live_drawing_of_a_group_with_global_ranks_4_and_5():
    @remote_class()
    class Scorer:
        @remote_function()
        def score(self):
            return 1

    initialize(mode="inprocess", groups=[DeviceGroup("late", [4, 5], "cpu")])
    Scorer(remote_group="late")
    text = get_device_placement(detail=True)
    rows = [line[2:-2].rstrip() for line in text.splitlines() if "group rank" in line]
    pid = os.getpid()
    assert rows == [
        f"    group rank 0   global rank 4   node {_node(text)}  device cpu  data rank 0  "
        f"process pid {pid}",
        f"    group rank 1   global rank 5   node {_node(text)}  device cpu  data rank 1  "
        f"process pid {pid}",
    ]


def _node(text: str) -> str:
    """The node the header names (`... mode inprocess  node NAME`)."""
    return text.split("  node ", 1)[1].split()[0]


def test_the_drawing_in_docs_cli_md_is_what_the_command_prints(tmp_path):
    """docs/cli.md quotes `twinkle placement groups.toml` for its TOML example: exactly."""
    page = (ROOT / "docs" / "cli.md").read_text()
    section = page.split("## `twinkle placement`", 1)[1]
    (tmp_path / "groups.toml").write_text(section.split("```toml\n", 1)[1].split("```", 1)[0])
    quoted = section.split("$ twinkle placement groups.toml\n", 1)[1].split("```", 1)[0]
    result = twinkle("placement", "groups.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == quoted
    assert "group rank 0   global ranks 4,5  node node0  device cuda:4,5" in quoted

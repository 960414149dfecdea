"""`twinkle_core.plugin` is what plugins use, all of it documented (issue 26, item 5)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import twinkle_core.plugin as plugin_api

ROOT = Path(__file__).resolve().parents[2]
#: Where a name counts as used: the plugins twinkle ships and the conformance kit.
USERS = (
    ROOT / "twinkle_local" / "twinkle_local",
    ROOT / "twinkle_ray" / "twinkle_ray",
    ROOT / "twinkle_notify_dingtalk" / "twinkle_notify_dingtalk",
    ROOT / "twinkle_core" / "twinkle_core" / "testing",
)


def _table() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text()
    start = text.index("## The plugin API, name by name")
    return text[start : text.index("\n## ", start + 1)]


def test_every_name_is_in_the_documented_table_and_the_table_names_nothing_else():
    table = _table()
    exported = set(plugin_api.__all__)
    in_first_column = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            in_first_column |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    assert exported - in_first_column == set(), "document these in docs/plugins.md's table"
    assert in_first_column - exported == set(), "the table names what the API does not export"


def test_every_name_is_used_by_a_shipped_plugin_or_the_kit():
    sources = "\n".join(
        path.read_text() for folder in USERS for path in sorted(folder.rglob("*.py"))
    )
    unused = [
        name
        for name in plugin_api.__all__
        if not re.search(rf"(?<![\w.]){re.escape(name)}\b", sources)
    ]
    assert unused == [], f"no shipped plugin or the kit uses {unused}: make them private"


def test_no_module_and_no_mutable_global_is_exported():
    for name in plugin_api.__all__:
        value = getattr(plugin_api, name)
        assert not isinstance(value, types.ModuleType), f"{name} re-exports a whole module"
        assert not isinstance(value, (list, set, dict)), f"{name} is a mutable global"
    assert "RECORDER" not in dir(plugin_api)

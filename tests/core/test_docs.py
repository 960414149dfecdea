"""The plugin docs keep up with the hooks: every hook has its own section with an example."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from twinkle_core import hookspecs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def hook_names() -> list[str]:
    return [
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, "twinkle_spec")
    ]


def test_there_are_hooks():
    assert {"register_backends", "register_notifiers", "twinkle_seed"} <= set(hook_names())


def test_every_hook_has_a_documented_section_with_an_example():
    text = DOCS.read_text()
    sections = re.split(r"^### ", text, flags=re.MULTILINE)
    by_name = {s.split("\n", 1)[0].strip().strip("`").split("(")[0]: s for s in sections[1:]}
    missing = [h for h in hook_names() if h not in by_name]
    assert missing == [], f"hooks without a '### name' section in docs/plugins.md: {missing}"
    no_example = [h for h in hook_names() if "@hookimpl" not in by_name[h]]
    assert no_example == [], f"hook sections without a @hookimpl example: {no_example}"


def test_the_serial_backend_example_passes_the_conformance_kit_as_printed(tmp_path, monkeypatch):
    """The complete third-party backend in docs/plugins.md, run exactly as printed."""
    import importlib

    from twinkle_core.plugins import plugin_system, reset_plugins
    from twinkle_core.testing import run_checks

    text = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"```python\n(# my_plugin\.py\n.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, "docs/plugins.md must hold one `# my_plugin.py` block"
    (tmp_path / "my_plugin.py").write_text(blocks[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_plugins()
    try:
        plugin_system().add(importlib.import_module("my_plugin"), name="my_plugin")
        report = run_checks("serial")
    finally:
        reset_plugins()
    failed = [r for r in report.results if r.outcome == "failed"]
    assert failed == [], [f"{r.name}: {r.detail}" for r in failed]
    # The example runs workers in the driver's process without copying arguments and has no
    # collective groups: those two checks are not applicable to it, reported as such.
    not_applicable = {r.name: r.detail for r in report.not_applicable}
    assert set(not_applicable) == {
        "collective_numpy_broadcast",
        "error_unsendable_argument",
        "error_unsendable_result",
    }
    assert "has no collective groups" in not_applicable["collective_numpy_broadcast"]
    assert "the driver's own objects" in not_applicable["error_unsendable_argument"]
    assert "the workers' own objects" in not_applicable["error_unsendable_result"]
    assert len(report.passed) == len(report.results) - 3 >= 20

"""Every hook has a test and a doc section (datasette's rule).

A hook in `twinkle_core.hookspecs` must be implemented with `@hookimpl` by some test file under
tests/ (a test that registers a plugin and so calls the hook through pluggy), and have its own
`### name` section with a `@hookimpl` example in docs/plugins.md (checked in test_docs.py).
Adding a hook without both fails here, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from core.test_docs import hook_names

TESTS = Path(__file__).resolve().parents[1]


def _is_hookimpl(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "hookimpl"


def implemented_in_tests() -> dict[str, list[str]]:
    """{hook name: test files defining a @hookimpl function of that name} over tests/**/*.py."""
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError:
            continue  # tests/lint holds deliberately broken code; ruff reports real errors
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                _is_hookimpl(d) for d in node.decorator_list
            ):
                found.setdefault(node.name, []).append(str(path.relative_to(TESTS)))
    # Hook implementations also appear as source text of plugins written by tests (strings).
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        for hook in hook_names():
            if "@hookimpl" in text and f"def {hook}(" in text:
                found.setdefault(hook, [])
                if str(path.relative_to(TESTS)) not in found[hook]:
                    found[hook].append(str(path.relative_to(TESTS)))
    return found


def test_the_scan_finds_a_known_implementation():
    """A broken scanner finding nothing would pass the next test for a hookspec module that
    has no hooks; this one pins a known implementation."""
    found = implemented_in_tests()
    assert "core/test_plugins.py" in found["register_dispatchers"]
    assert "core/test_rng_hooks.py" in found["twinkle_seed"]


def test_every_hook_is_implemented_by_a_test():
    found = implemented_in_tests()
    untested = [hook for hook in hook_names() if not found.get(hook)]
    assert untested == [], (
        f"hooks in twinkle_core/hookspecs.py that no test implements: {untested}. Add a test "
        "under tests/ that registers a plugin with a @hookimpl of each, and checks what twinkle "
        "does with it (see tests/core/test_rng_hooks.py)."
    )

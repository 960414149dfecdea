"""The layers' contracts: what `.importlinter` lists, and what examples may import."""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import twinkle_core

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"twinkle_core", "twinkle_core.plugin", "twinkle_core.testing"}


#: Core's tools and the conformance kit: never imported by the call path.
APART = {"twinkle_core.tools", "twinkle_core.testing", "twinkle_core.__main__"}


def _contract(name: str, key: str) -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return set(config[f"importlinter:contract:{name}"][key].split())


def _private_list() -> set[str]:
    return _contract("plugins-use-public-core", "forbidden_modules")


def _core_modules() -> set[str]:
    package = Path(twinkle_core.__file__).parent
    return {f"twinkle_core.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"} | {
        f"twinkle_core.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()
    }


def test_every_call_path_module_is_held_away_from_the_tools():
    """The `core-call-path-without-tools` contract lists every core module but the tools."""
    call_path = _core_modules() - APART
    listed = _contract("core-call-path-without-tools", "source_modules")
    assert listed == call_path, (
        "update core-call-path-without-tools in .importlinter: "
        f"missing {sorted(call_path - listed)}, stale {sorted(listed - call_path)}"
    )
    assert _contract("core-call-path-without-tools", "forbidden_modules") == {
        "twinkle_core.tools",
        "twinkle_core.testing",
    }


def test_an_inprocess_run_never_loads_the_tools():
    """import, initialize, a remote call, collect: no tool or kit module in sys.modules."""
    code = textwrap.dedent(
        """
        import sys
        from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

        @remote_class()
        class Adder:
            @remote_function(dispatch="all", collect="sum")
            def add(self, x):
                return x + 1

        initialize(mode="inprocess", groups=[DeviceGroup("g", ranks=2, device_type="cpu")])
        assert Adder(remote_group="g").add(1)() == 4
        shutdown()
        loaded = sorted(
            m for m in sys.modules if m.startswith(("twinkle_core.tools", "twinkle_core.testing"))
        )
        print(loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


#: What a core module must never contain: a sibling package's name, an import of torch or ray
#: by any means, or a look for a repository checkout (a path to its scripts/install.py, the
#: working directory). Naming the command in a message (`python scripts/install.py ...`, the
#: install hints of issue 31) looks for nothing.
_FORBIDDEN_TEXT = re.compile(
    r"twinkle_local|twinkle_ray|twinkle_notify|twinkle-local|twinkle-ray|twinkle-notify"
    r"|__import__\(|import_module\(\s*[\"'](?:torch|ray)\b|^\s*(?:import|from)\s+(?:torch|ray)\b"
    r"|[\"']install\.py[\"']|Path\([^)]*install\.py|Path\.cwd\(\)",
    re.MULTILINE,
)


def test_core_names_no_sibling_and_imports_no_torch_or_ray_by_any_means():
    package = Path(twinkle_core.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for match in _FORBIDDEN_TEXT.finditer(path.read_text()):
            line = path.read_text().count("\n", 0, match.start()) + 1
            offenders.append(f"{path.relative_to(package)}:{line}: {match.group(0)!r}")
    assert offenders == [], offenders


def test_every_core_module_but_the_public_ones_is_forbidden_to_plugins():
    private = _core_modules() - PUBLIC - {"twinkle_core.__main__"}
    assert private, "no core modules found"
    assert _private_list() == private, (
        "update the plugins-use-public-core contract in .importlinter: "
        f"missing {sorted(private - _private_list())}, stale {sorted(_private_list() - private)}"
    )


def test_examples_use_only_the_top_level_api():
    offenders = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("twinkle_"):
                if node.module != "twinkle_core":
                    offenders.append(f"{path.name}:{node.lineno} from {node.module}")
            elif isinstance(node, ast.Import):
                offenders += [
                    f"{path.name}:{node.lineno} import {a.name}"
                    for a in node.names
                    if a.name.startswith("twinkle_") and a.name != "twinkle_core"
                ]
    assert offenders == [], offenders


def test_every_private_module_of_twinkle_local_is_forbidden_to_other_plugins():
    """Other plugins reach twinkle-local only through its public `torchkit` (the torch-level
    pieces defined once): the `plugins-use-public-plugin-modules` contract lists the rest."""
    folder = ROOT / "twinkle_local" / "twinkle_local"
    private = {
        f"twinkle_local.{p.stem}"
        for p in folder.glob("*.py")
        if p.stem not in ("__init__", "torchkit")
    }
    listed = _contract("plugins-use-public-plugin-modules", "forbidden_modules")
    assert private, "no twinkle_local modules found"
    assert listed == private, (
        "update plugins-use-public-plugin-modules in .importlinter: "
        f"missing {sorted(private - listed)}, stale {sorted(listed - private)}"
    )

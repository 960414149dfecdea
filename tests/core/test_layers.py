"""The layers' contracts: what `.importlinter` lists, and what examples may import."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

import twinkle_core

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"twinkle_core", "twinkle_core.plugin", "twinkle_core.testing"}


def _private_list() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    section = config["importlinter:contract:plugins-use-public-core"]
    return set(section["forbidden_modules"].split())


def test_every_core_module_but_the_public_ones_is_forbidden_to_plugins():
    package = Path(twinkle_core.__file__).parent
    modules = {f"twinkle_core.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"} | {
        f"twinkle_core.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()
    }
    private = modules - PUBLIC
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

"""A third-party plugin package built and pip-installed for real, then used through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _support.cli import pip_install_into
from _support.cli import twinkle as run_twinkle

PYPROJECT = """
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "twinkle-reverse"
version = "0.3.0"
dependencies = ["twinkle-core>=0.3,<0.4"]

[project.entry-points.twinkle]
reverse = "twinkle_reverse"
"""

MODULE = """
from twinkle_core import Collector, Dispatcher, hookimpl


class Reverse(Dispatcher):
    def dispatch(self, args, kwargs, n_workers, device_mesh):
        return [((list(reversed(args[0])),), {}) for _ in range(n_workers)]


class Joined(Collector):
    def collect(self, results, device_mesh):
        return "|".join(",".join(map(str, r)) for r in results)


@hookimpl
def register_dispatchers(register):
    register("reverse", "twinkle_reverse:Reverse")


@hookimpl
def register_collectors(register):
    register("joined", Joined())
"""

DRIVER = """
from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

@remote_class()
class Worker:
    def __init__(self):
        pass

    @remote_function(dispatch="reverse", collect="joined")
    def echo(self, xs):
        return xs

initialize("inprocess", groups=[DeviceGroup("g", 2)])
print("RESULT", Worker(remote_group="g").echo([1, 2, 3])())
shutdown()
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    (src / "twinkle_reverse").mkdir(parents=True)
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (src / "twinkle_reverse" / "__init__.py").write_text(textwrap.dedent(MODULE))
    target = root / "site"
    pip_install_into(target, src)
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("TWINKLE_PLUGINS", None)
    env.pop("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", None)
    return env, root


def twinkle(*args: str, env: dict, cwd: Path) -> str:
    """Run the installed `twinkle` console script; return its output (it must succeed)."""
    result = run_twinkle(*args, env=env, cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_installed_plugin_is_listed(installed):
    env, root = installed
    plugins = {p["name"]: p for p in json.loads(twinkle("plugins", "--json", env=env, cwd=root))}
    assert plugins["reverse"]["distribution"] == "twinkle-reverse"
    assert plugins["reverse"]["version"] == "0.3.0"
    assert plugins["reverse"]["registers"]["dispatchers"] == ["reverse"]
    assert plugins["reverse"]["registers"]["collectors"] == ["joined"]
    assert plugins["reverse"]["error"] is None
    assert "reverse  [twinkle-reverse 0.3.0]" in twinkle("plugins", env=env, cwd=root)


def test_installed_plugin_is_used_by_name(installed):
    env, root = installed
    (root / "driver.py").write_text(DRIVER)
    out = subprocess.run(
        [sys.executable, str(root / "driver.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr
    assert "RESULT 3,2,1|3,2,1" in out.stdout


def test_disabling_autoload_hides_it(installed):
    env, root = installed
    env = dict(env, TWINKLE_DISABLE_PLUGIN_AUTOLOAD="1")
    plugins = json.loads(twinkle("plugins", "--json", env=env, cwd=root))
    assert [p["name"] for p in plugins] == ["core"]

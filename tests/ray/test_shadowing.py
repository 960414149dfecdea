"""A folder in the driver's directory that Ray workers would import instead of twinkle: refused
at `initialize`, naming the folder (Ray puts that directory first on every worker's path)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from _support.jobs import run_reporting_script

import twinkle_core
from twinkle_core import ConfigurationError
from twinkle_ray.shadowing import check_worker_imports, shadowed_packages, worker_code_paths

CORE_FILE = os.path.realpath(twinkle_core.__file__)
#: The sys.path entry this test process finds twinkle_core in.
CORE_ROOT = str(Path(CORE_FILE).parents[1])


def test_a_namespace_folder_shadows_a_package_path_entries_do_not_find(tmp_path, monkeypatch):
    """An editable install's package is found by a meta-path finder, not a sys.path entry: a
    plain folder of the same name in the driver's directory (a clone's `./twinkle_core/`)
    becomes a namespace package in the workers. Emulated by taking the package's path entry
    away, as an editable install has none."""
    (tmp_path / "twinkle_core").mkdir()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.realpath(p) != CORE_ROOT])
    found = shadowed_packages([str(tmp_path)], ("twinkle_core",))
    assert found == [("twinkle_core", CORE_FILE, os.path.realpath(tmp_path / "twinkle_core"))]
    with pytest.raises(ConfigurationError) as raised:
        check_worker_imports([str(tmp_path)])
    message = str(raised.value)
    assert str(tmp_path / "twinkle_core") in message
    assert CORE_FILE in message
    assert "Start the driver from another directory" in message


def test_a_folder_does_not_shadow_a_package_a_path_entry_finds(tmp_path, monkeypatch):
    """With the package installed in site-packages (a wheel, as CI and most users have), a plain
    folder of the same name loses to it in the workers too: no error (CI starts the Ray suite
    from the repository's root, where `./twinkle_core/` is such a folder)."""
    (tmp_path / "twinkle_core").mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, CORE_ROOT])  # as site-packages holds a wheel's
    assert shadowed_packages([str(tmp_path)], ("twinkle_core",)) == []
    check_worker_imports([str(tmp_path)])


def test_the_code_paths_are_the_current_directory_and_a_script_directory_on_sys_path(
    tmp_path, monkeypatch
):
    """As `ray.init` computes them: the script's directory only where the driver's sys.path
    has it (not for `python -m` or `python -c`), then the current directory."""
    scripts = tmp_path / "bin"
    scripts.mkdir()
    script = str(scripts / "drive.py")
    cwd = str(tmp_path)
    assert worker_code_paths(cwd=cwd, argv0=script) == [cwd]
    assert worker_code_paths(cwd=cwd, argv0="-c") == [cwd]
    monkeypatch.setattr(sys, "path", [os.path.realpath(scripts), *sys.path])
    assert worker_code_paths(cwd=cwd, argv0=script) == [os.path.realpath(scripts), cwd]


DRIVER = """
import importlib.util, json, os, sys
import ray
from twinkle_core import ConfigurationError, DeviceGroup, initialize, shutdown

os.chdir({cwd!r})  # the folder that holds ./twinkle_core/ (a package of the same name)
report = {{}}
try:  # twinkle starts the cluster: refused before any Ray process starts
    initialize(mode="ray", groups=[DeviceGroup("g", 1)], num_cpus=1)
    report["own"] = "started"
except ConfigurationError as e:
    report["own"] = str(e)
report["own_started_ray"] = ray.is_initialized()

# The caller connected first: checked against the paths Ray itself gave this job's workers.
ray.init(address="local", num_cpus=1, include_dashboard=False)


@ray.remote(num_cpus=0)
def where():
    return importlib.util.find_spec("twinkle_core").origin


report["worker_imports"] = ray.get(where.remote(), timeout=120)
try:
    initialize(mode="ray", groups=[DeviceGroup("g", 1)])
    report["adopted"] = "started"
except ConfigurationError as e:
    report["adopted"] = str(e)
shutdown()
ray.shutdown()
print("REPORT " + json.dumps(report))
"""


def test_ray_workers_import_the_folder_the_error_names(tmp_path):
    """Real Ray: a worker of a driver started in a folder holding `twinkle_core/` imports that
    one; `initialize` refuses both when it would start the cluster (before starting it) and
    when it adopts the caller's connection."""
    cwd = tmp_path / "project"
    (cwd / "twinkle_core").mkdir(parents=True)
    (cwd / "twinkle_core" / "__init__.py").write_text("raise ImportError('not twinkle')\n")
    report, output = run_reporting_script(
        tmp_path / "drive.py", textwrap.dedent(DRIVER.format(cwd=str(cwd))), timeout=180
    )
    shadow = os.path.realpath(cwd / "twinkle_core" / "__init__.py")
    assert os.path.realpath(report["worker_imports"]) == shadow, output[-3000:]
    for key in ("own", "adopted"):
        assert shadow in report[key], (key, report[key])
        assert "first on every worker's sys.path" in report[key]
    assert report["own_started_ray"] is False

"""Refuse a run whose Ray workers would import twinkle from another place than the driver.

Ray puts the driver's current directory (and its script's directory) at the front of every
worker's `sys.path` (`JobConfig._py_driver_sys_path`, set by `ray.init`). A folder there named
like a package the workers import wins over the installed package in a worker, though not in
the driver. The common case is a clone of this repository with editable installs, driver
started from the clone's root: the distribution folder `./twinkle_core/` (no `__init__.py`)
becomes a namespace package in every worker, and each group then fails to start with an
ImportError that does not say why (`cannot import name ... from 'twinkle_core' (unknown
location)`). Checked once at `initialize`, before any worker starts, with the import system's
own path finder, so the error names the folder and the fix.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder

import ray

from twinkle_core import ConfigurationError

#: The packages every twinkle worker imports: the core and this plugin.
WORKER_PACKAGES = ("twinkle_core", __name__.partition(".")[0])


def worker_code_paths(*, cwd: str | None = None, argv0: str | None = None) -> list[str]:
    """The directories Ray puts first on a worker's `sys.path` for a driver started here (what
    `ray.init` does for a job without a runtime_env `working_dir`, which twinkle never sets)."""
    paths = []
    script = argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")
    if script and script != "-c":
        script_dir = os.path.dirname(os.path.realpath(script))
        if script_dir in sys.path:
            paths.append(script_dir)
    paths.append(os.path.abspath(cwd if cwd is not None else os.curdir))
    return paths


def connected_code_paths() -> list[str] | None:
    """The directories Ray put first on this job's workers' `sys.path`, read from the job's
    config once connected (the caller may have connected with options of its own), or None
    where this Ray does not say (a Ray client connection has no core worker here): then
    nothing is checked, rather than guessed."""
    try:
        config = ray._private.worker.global_worker.core_worker.get_job_config()
        return list(config.py_driver_sys_path)
    except Exception:  # a private API: a Ray without it is checked the computed way
        return None


def _where(spec: ModuleSpec) -> str:
    """Where a spec's module lives: its file, or a namespace package's folders."""
    if spec.origin and spec.origin != "namespace":
        return os.path.realpath(spec.origin)
    return os.pathsep.join(os.path.realpath(p) for p in spec.submodule_search_locations or ())


def shadowed_packages(
    code_paths: list[str], names: tuple[str, ...] = WORKER_PACKAGES
) -> list[tuple[str, str, str]]:
    """(package, where the driver has it, where a worker would find it) for each package the
    workers would import from elsewhere. A package no path entry finds (a meta-path finder's,
    as an editable install's) is found by the workers the driver's way: not shadowed."""
    found = []
    for name in names:
        module = sys.modules.get(name)
        driver_spec = getattr(module, "__spec__", None)
        if driver_spec is None:
            continue
        worker_spec = PathFinder.find_spec(name, [*code_paths, *sys.path])
        if worker_spec is None:
            continue
        theirs, ours = _where(worker_spec), _where(driver_spec)
        if theirs != ours:
            found.append((name, ours, theirs))
    return found


def check_worker_imports(code_paths: list[str] | None = None) -> None:
    """Raise a ConfigurationError naming each package Ray's workers would import from a folder
    other than the driver's (see the module's docstring)."""
    shadowed = shadowed_packages(worker_code_paths() if code_paths is None else code_paths)
    if not shadowed:
        return
    lines = "\n".join(
        f"  - {name}: the driver imports {ours or '?'}; a worker would import {theirs}"
        for name, ours, theirs in shadowed
    )
    raise ConfigurationError(
        "mode='ray': Ray puts the driver's current directory "
        f"({os.path.abspath(os.curdir)}) and its script's directory first on every worker's "
        "sys.path, and a folder there shadows a package the workers import:\n"
        f"{lines}\n"
        "Start the driver from another directory (for a clone of twinkle with editable "
        "installs: not from the clone's root), or rename the folder."
    )

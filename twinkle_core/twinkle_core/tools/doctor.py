"""`twinkle doctor`: what this machine (and a cluster) offers a run, and what is in the way.

`diagnose()` gathers a report, a plain dict that `--json` prints as is:

- `twinkle_core`, `python`, `executable`; `torch` and `ray`: installed versions or None, read from
  package metadata (neither is imported for it);
- `distributions`: installed twinkle distributions (name `twinkle*`, or providing a `twinkle`
  entry point); `plugins`: every plugin found, with its load or compatibility error;
- `platform`: the detected accelerator platform, its device count, and each registered one;
- `torchrun`: torchrun's variables when set; `environment`: twinkle's own variables, never a
  value whose name looks like a secret (`hidden_environment` lists such names only);
- `<backend>_cluster` (with `--<backend> [ADDRESS]`, e.g. `ray_cluster` for `--ray`): what the
  backend's plugin reports of its cluster (hook `twinkle_doctor_probe`), e.g. Ray's nodes with
  CPUs, accelerators and memory; `cluster_text`: the lines the text report shows of it;
- `problems`: what stops something asked for from working, each `{"problem", "fix"}` (the
  command exits 1 when there is one); `warnings`: the same shape, not fatal.

A cluster is looked at by the plugin of its backend, never by core: adding a backend changes
nothing here. The plugin must bound its look by `timeout` (the Ray backend reads the cluster in a
child process, so that an unreachable address cannot hang the command).
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import platform as _platform_module
import re
import sys
from typing import Any

from packaging.utils import canonicalize_name

from ..install_hints import install_command, install_hint
from ..plugins import ENTRY_POINT_GROUP, core_version, plugin_system
from ..sensitive import looks_secret, matches_any, secret_env_patterns

#: torchrun's (torch.distributed.elastic's) variables, shown with their values when set.
TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)

#: Other variables shown with their values (unless their names look like secrets).
SHOWN_ENV = (
    "TWINKLE_*",
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN*",
    "*_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)

#: Shown although their names look like secrets: they hold none.
NOT_SECRET = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def _problem(problem: str, fix: str) -> dict[str, str]:
    return {"problem": problem, "fix": fix}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- installation
def distributions() -> list[dict[str, Any]]:
    """Installed twinkle distributions: named `twinkle*`, or providing a `twinkle` plugin.

    Each has `name`, `version`, `location` (the source folder of an editable install) and
    `editable`; another copy of the same name with a different version found further down
    the path is listed under `shadowed`.
    """
    found: dict[str, dict[str, Any]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if not name:
            continue
        has_plugin = any(ep.group == ENTRY_POINT_GROUP for ep in dist.entry_points)
        key = canonicalize_name(name)
        if not (key.startswith("twinkle") or has_plugin):
            continue
        location, editable = _location(dist)
        entry: dict[str, Any] = {
            "name": name,
            "version": dist.version,
            "location": location,
            "editable": editable,
        }
        first = found.get(key)
        if first is None:
            found[key] = entry
        elif first["version"] != entry["version"]:
            # The first one found is the one imported; a different version later is shadowed.
            first.setdefault("shadowed", []).append(entry)
    return sorted(
        found.values(), key=lambda d: (canonicalize_name(d["name"]) != "twinkle-core", d["name"])
    )


def _location(dist: metadata.Distribution) -> tuple[str | None, bool]:
    """Where `dist` lives: its source folder when installed editable (`pip install -e`)."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except (ValueError, OSError):
        direct = None
    if isinstance(direct, dict) and (direct.get("dir_info") or {}).get("editable"):
        url = str(direct.get("url", ""))
        return (url[len("file://") :] if url.startswith("file://") else url), True
    try:
        return str(dist.locate_file("")), False
    except Exception:  # pragma: no cover - unusual finders
        return None, False


def _plugin_fix(info: Any) -> str:
    error = info.error or ""
    pip = re.search(r"pip install -U .*$", error)
    if pip:
        return pip.group(0)
    if info.unknown_hooks:
        return (
            f"rename the hook(s) {', '.join(info.unknown_hooks)} in plugin {info.name!r} to "
            "ones twinkle-core defines (docs/plugins.md), or upgrade twinkle-core"
        )
    if "registered twice" in error:
        return "uninstall one of the plugins, or load only one with TWINKLE_PLUGINS=<names>"
    dist = info.distribution or info.name
    return (
        f"fix the error above or reinstall it (pip install --force-reinstall {dist}); to run "
        f"without it, uninstall {dist} or load only the plugins you need with "
        "TWINKLE_PLUGINS=<names>"
    )


def plugins_report(problems: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for info in plugin_system().plugins():
        entry = info.as_json()
        entry["unknown_hooks"] = list(info.unknown_hooks)
        out.append(entry)
        if info.error:
            where = f" ({info.distribution} {info.version})" if info.distribution else ""
            problems.append(
                _problem(
                    f"plugin {info.name!r}{where} failed to load: {info.error}", _plugin_fix(info)
                )
            )
    return out


# --------------------------------------------------------------------------- platform
def platform_report(warnings: list[dict[str, str]]) -> dict[str, Any]:
    """The detected platform and every registered one (availability, device count)."""
    from ..platform import _platform_classes, detect_platform

    available: dict[str, dict[str, Any]] = {}
    for name, cls in sorted(_platform_classes().items()):
        try:
            ok = bool(cls.is_available())
            count = int(cls.device_count()) if ok else 0
            available[name] = {"available": ok, "device_count": count}
        except Exception as exc:
            available[name] = {"available": False, "device_count": 0, "error": str(exc)}
            warnings.append(
                _problem(
                    f"platform {name!r} raised while probing the machine: {exc}",
                    "report it to the platform plugin; twinkle treats the platform as absent",
                )
            )
    try:
        detected = detect_platform()
    except Exception as exc:  # pragma: no cover - detect_platform never raises
        return {"device_type": None, "device_count": 0, "error": str(exc), "platforms": available}
    env = detected.visible_devices_env
    try:
        count = int(detected.device_count())
    except Exception:  # pragma: no cover - device_count never raises
        count = 0
    return {
        "device_type": detected.device_type,
        "device_count": count,
        "dist_backend": detected.dist_backend,
        "ray_resource": detected.ray_resource,
        "visible_devices_env": env,
        "visible_devices": os.environ.get(env) if env else None,
        "platforms": available,
    }


# --------------------------------------------------------------------------- environment
def _mask_url(value: str) -> str:
    """`scheme://user:pw@host` -> `scheme://***@host`."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", value)


def environment_report(
    environ: dict[str, str] | None = None,
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(torchrun variables, other shown variables, names of set variables never shown)."""
    env = dict(os.environ if environ is None else environ)
    try:
        declared = secret_env_patterns()
    except Exception:  # a broken plugin's hook must not stop the report
        declared = ()
    hidden = sorted(
        n
        for n in env
        if matches_any(n, declared)
        or (matches_any(n, SHOWN_ENV) and looks_secret(n) and not matches_any(n, NOT_SECRET))
    )
    torchrun = {n: env[n] for n in TORCHRUN_VARS if n in env and n not in hidden}
    shown = {
        n: _mask_url(env[n])
        for n in sorted(env)
        if matches_any(n, SHOWN_ENV) and n not in hidden and n not in torchrun
    }
    return torchrun, shown, hidden


def _torchrun_warnings(torchrun: dict[str, str], warnings: list[dict[str, str]]) -> None:
    core = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    present = [v for v in core if torchrun.get(v)]
    if present and len(present) < len(core):
        missing = [v for v in core if v not in present]
        warnings.append(
            _problem(
                f"torchrun variables are partly set ({', '.join(present)}; missing "
                f"{', '.join(missing)}): initialize(mode='local') will refuse to start",
                "start the script with `torchrun --nproc_per_node=N script.py` (it sets them "
                "all), or unset these variables to run a single process",
            )
        )


# --------------------------------------------------------------------------- clusters
def cluster_report(backend: str, address: str, timeout: float, report: dict[str, Any]) -> None:
    """Ask the plugins to look at `backend`'s cluster at `address` (hook
    `twinkle_doctor_probe`); the answer goes into `report[f"{backend}_cluster"]`, its problems,
    warnings and text lines into the report's lists. No answer: the backend is not installed."""
    try:
        answer = plugin_system().hook.twinkle_doctor_probe(
            backend=backend, address=address, timeout=timeout
        )
    except Exception as exc:  # a broken plugin must not stop the report
        answer = None
        report["problems"].append(
            _problem(
                f"the {backend!r} cluster probe raised {type(exc).__name__}: {exc}",
                "report it to the plugin that provides the backend",
            )
        )
        return
    if answer is None:
        hint = install_hint("backends", backend)
        extra, packages = hint if hint else (backend, ())
        provides = f"  (installs {', '.join(packages)})" if packages else ""
        report["problems"].append(
            _problem(
                f"--{backend} was given but {backend} is not installed in this environment "
                f"({sys.executable}), or its plugin failed to load (see plugins above)",
                f"{install_command(extra)}{provides}",
            )
        )
        report[f"{backend}_cluster"] = None
        return
    report[f"{backend}_cluster"] = answer.get("data")
    report["problems"].extend(answer.get("problems") or [])
    report["warnings"].extend(answer.get("warnings") or [])
    if answer.get("text"):
        report["cluster_text"].append(list(answer["text"]))


# --------------------------------------------------------------------------- report
def diagnose(probes: dict[str, str] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """The doctor's report (see the module docstring). `probes` maps backends to the cluster
    address to look at (`{"ray": "auto"}` for `--ray`), each with at most `timeout` s."""
    problems: list[dict[str, str]] = []
    warnings: list[dict[str, str]] = []
    report: dict[str, Any] = {
        "twinkle_core": core_version(),
        "python": _platform_module.python_version(),
        "executable": sys.executable,
        "torch": _version("torch"),
        "ray": _version("ray"),
    }
    dists = distributions()
    for dist in dists:
        for other in dist.get("shadowed", []):
            warnings.append(
                _problem(
                    f"{dist['name']} is installed twice: {dist['version']} at "
                    f"{dist['location']} is used, {other['version']} at {other['location']} is "
                    "shadowed",
                    f"uninstall one copy (pip uninstall {dist['name']}, or fix PYTHONPATH)",
                )
            )
    report["distributions"] = dists
    report["plugins"] = plugins_report(problems)
    report["platform"] = platform_report(warnings)
    torchrun, shown, hidden = environment_report()
    _torchrun_warnings(torchrun, warnings)
    report["torchrun"] = torchrun
    report["environment"] = shown
    report["hidden_environment"] = hidden
    report["problems"] = problems
    report["warnings"] = warnings
    report["cluster_text"] = []
    for backend, address in (probes or {}).items():
        cluster_report(backend, address, timeout, report)
    return report


def render_text(report: dict[str, Any]) -> str:
    """The report for people: one section per topic, problems with their fixes last."""
    out = [f"twinkle doctor (twinkle-core {report['twinkle_core']})", ""]
    out.append(f"python   {report['python']}  ({report['executable']})")
    out.append(f"torch    {report['torch'] or 'not installed'}")
    out.append(f"ray      {report['ray'] or 'not installed'}")
    p = report["platform"]
    line = f"platform {p.get('device_type')}  {p.get('device_count')} device(s)"
    if p.get("visible_devices_env"):
        line += f"  {p['visible_devices_env']}={p.get('visible_devices') or '(unset)'}"
    out.append(line + "  (detected)")
    others = [
        f"{name} {v['device_count'] if v['available'] else 'not available'}"
        for name, v in p.get("platforms", {}).items()
    ]
    if others:
        out.append(f"         registered platforms: {', '.join(others)}")
    out += ["", "distributions"]
    for d in report["distributions"]:
        where = f"{d.get('location') or ''}{'  (editable)' if d.get('editable') else ''}"
        out.append(f"  {d['name']} {d['version']}  {where}".rstrip())
    out += ["", "plugins"]
    for plugin in report["plugins"]:
        dist = (
            f"{plugin['distribution']} {plugin['version']}"
            if plugin["distribution"]
            else "(no distribution)"
        )
        status = "FAILED (see problems)" if plugin["error"] else "ok"
        what = "".join(
            f"  {kind}: {', '.join(plugin['registers'].get(kind) or [])}"
            for kind in ("backends", "platforms", "notifiers")
            if plugin["registers"].get(kind)
        )
        out.append(f"  {plugin['name']}  [{dist}]  {status}{what}")
    out += ["", "torchrun"]
    if report["torchrun"]:
        out += [f"  {k}={v}" for k, v in report["torchrun"].items()]
    else:
        out.append("  not set (this process was not started by torchrun)")
    if report["environment"] or report["hidden_environment"]:
        out += ["", "environment"]
        out += [f"  {k}={v}" for k, v in report["environment"].items()]
        if report["hidden_environment"]:
            out.append(f"  set, values not shown: {', '.join(report['hidden_environment'])}")
    for lines in report.get("cluster_text") or []:
        out += ["", *lines]
    for title, items in (("warnings", report["warnings"]), ("problems", report["problems"])):
        if items:
            out += ["", title]
            for item in items:
                out.append(f"  - {item['problem']}")
                out.append(f"    fix: {item['fix']}")
    if not report["problems"]:
        out += ["", "no problems found"]
    return "\n".join(out)

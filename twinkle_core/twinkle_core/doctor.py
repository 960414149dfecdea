"""`twinkle doctor`: what this machine (and a Ray cluster) offers a run, and what is in the way.

`diagnose()` gathers a report, a plain dict that `--json` prints as is:

- `twinkle_core`, `python`, `executable`; `torch` and `ray`: installed versions or None, read from
  package metadata (neither is imported for it);
- `distributions`: installed twinkle distributions (name `twinkle*`, or providing a `twinkle`
  entry point); `plugins`: every plugin found, with its load or compatibility error;
- `platform`: the detected accelerator platform, its device count, and each registered one;
- `torchrun`: torchrun's variables when set; `environment`: twinkle's own variables, never a
  value whose name looks like a secret (`hidden_environment` lists such names only);
- `ray_cluster` (with `--ray [ADDRESS]`): the cluster's nodes with CPUs, accelerators and memory;
- `problems`: what stops something asked for from working, each `{"problem", "fix"}` (the
  command exits 1 when there is one); `warnings`: the same shape, not fatal.

The Ray cluster is read in a child process (`ray.init(address=...)`, `ray.nodes()`,
`ray.shutdown()`) so that twinkle-core never imports ray, an unreachable address cannot hang
the command (`--timeout`), and Ray's own log lines stay out of the report.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata as metadata
import json
import os
import platform as _platform_module
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from packaging.utils import canonicalize_name

from .plugins import (
    ENTRY_POINT_GROUP,
    core_version,
    plugin_system,
    secret_env_patterns,
)

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

#: Names whose values are never printed (case-insensitive), besides plugins' declared secrets.
SECRET_NAMES = (
    "*TOKEN*",
    "*SECRET*",
    "*PASS*",
    "*KEY*",
    "*WEBHOOK*",
    "*CREDENTIAL*",
    "*AUTH*",
    "*PRIVATE*",
    "*COOKIE*",
    "*SIGN*",
)

#: Ray resources shown as accelerators besides the registered platforms' own.
RAY_ACCELERATORS = ("GPU", "NPU", "TPU", "HPU", "neuron_cores")

#: Printed by the child process before its JSON line.
_MARK = "TWINKLE-DOCTOR-RAY:"

_RAY_PROBE = f"""
import json, sys
out = {{}}
try:
    ray = __import__("ray")
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    try:
        out["address"] = ray.get_runtime_context().gcs_address
        out["nodes"] = ray.nodes()
    finally:
        ray.shutdown()
except BaseException as exc:
    out = {{"error": type(exc).__name__ + ": " + str(exc)}}
print({_MARK!r} + json.dumps(out, default=str), flush=True)
"""


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
    from .platform import _platform_classes, detect_platform

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
def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, p.upper()) for p in patterns)


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
        if _matches(n, declared)
        or (_matches(n, SHOWN_ENV) and _matches(n, SECRET_NAMES) and not _matches(n, NOT_SECRET))
    )
    torchrun = {n: env[n] for n in TORCHRUN_VARS if n in env and n not in hidden}
    shown = {
        n: _mask_url(env[n])
        for n in sorted(env)
        if _matches(n, SHOWN_ENV) and n not in hidden and n not in torchrun
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


# --------------------------------------------------------------------------- ray
def _accelerator_resources() -> set[str]:
    from .platform import _platform_classes

    names = set(RAY_ACCELERATORS)
    for cls in _platform_classes().values():
        resource = getattr(cls, "ray_resource", None)
        if resource:
            names.add(resource)
    names.discard("CPU")
    return names


def _node_entry(node: dict[str, Any], accelerators: set[str]) -> dict[str, Any]:
    resources = {k: float(v) for k, v in (node.get("Resources") or {}).items()}
    return {
        "node_id": node.get("NodeID"),
        "address": node.get("NodeManagerAddress"),
        "hostname": node.get("NodeManagerHostname"),
        "alive": bool(node.get("Alive")),
        "cpus": resources.get("CPU", 0.0),
        "accelerators": {k: v for k, v in sorted(resources.items()) if k in accelerators},
        "accelerator_type": next(
            (k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), None
        ),
        "memory_bytes": int(resources.get("memory", 0)),
        "object_store_memory_bytes": int(resources.get("object_store_memory", 0)),
        "other_resources": {
            k: v
            for k, v in sorted(resources.items())
            if k not in accelerators
            and k not in ("CPU", "memory", "object_store_memory")
            and not k.startswith(("node:", "accelerator_type:"))
        },
    }


_HOST_PORT = re.compile(r"^(?:ray://)?\[?([^\]/@\s]+?)\]?:(\d+)$")


def _unreachable(address: str, timeout: float) -> str | None:
    """Why `host:port` does not accept a connection (None when it does or is not host:port)."""
    match = _HOST_PORT.match(address.strip())
    if not match:
        return None
    host, port = match.group(1), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=max(0.5, min(timeout, 5.0))):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


#: What Ray's C++ client logs while a cluster refuses it for want of the right token.
_AUTH_FAILURE = ("InvalidAuthToken", "Unauthenticated")


def _run_probe(address: str, timeout: float) -> dict[str, Any]:
    """Run `_RAY_PROBE` in a child; its result, or `{"error": ...}` (with `auth`/`timeout`).

    Ray keeps retrying a cluster that refuses its token; the child is stopped as soon as its
    log says so, and in any case after `timeout` seconds.
    """
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(
        [sys.executable, "-c", _RAY_PROBE, address],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out: list[str] = []
    err: list[str] = []
    refused = threading.Event()

    def pump(stream: Any, into: list[str], watch: bool) -> None:
        for line in stream:
            into.append(line)
            if watch and any(marker in line for marker in _AUTH_FAILURE):
                refused.set()

    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, out, False), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err, True), daemon=True),
    ]
    for t in pumps:
        t.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not refused.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped = proc.poll() is None
    if stopped:
        proc.kill()
    proc.wait()
    for t in pumps:
        t.join(timeout=5)
    if refused.is_set():
        return {
            "error": "the cluster refused the connection: authentication token missing or "
            "incorrect",
            "auth": True,
        }
    if stopped:
        return {"error": f"no answer within {timeout:g}s", "timeout": True}
    for line in out:
        if line.startswith(_MARK):
            return dict(json.loads(line[len(_MARK) :]))
    tail = ("".join(err).strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"the Ray probe exited with status {proc.returncode}: {tail}"}


def ray_cluster_report(address: str, timeout: float, problems: list[dict[str, str]]) -> Any:
    """Connect to the running cluster at `address`, list its nodes, disconnect."""
    fix_address = (
        "start the cluster (`ray start --head`) or pass the head node's address, e.g. "
        "`twinkle doctor --ray 10.0.0.1:6379`"
    )
    if _version("ray") is None:
        problems.append(
            _problem(
                f"--ray was given but ray is not installed in this environment ({sys.executable})",
                'pip install "twinkle-core[ray]"  (installs twinkle-ray and ray)',
            )
        )
        return None
    if address.strip().lower() == "local":
        problems.append(
            _problem(
                "--ray local would start a new cluster; doctor only inspects a running one",
                f"pass the running cluster's address, or omit it for `auto`; {fix_address}",
            )
        )
        return None
    why = _unreachable(address, timeout)
    if why is not None:
        problems.append(_problem(f"cannot reach the Ray cluster at {address}: {why}", fix_address))
        return {"address": address, "error": why, "nodes": []}
    result = _run_probe(address, timeout)
    if "error" in result:
        if result.get("auth"):
            fix = (
                "the cluster uses Ray token authentication: set RAY_AUTH_MODE=token and give "
                "this machine the cluster's token (RAY_AUTH_TOKEN, or the file "
                "~/.ray/auth_token; `ray get-auth-token` on the head node prints it)"
            )
        elif result.get("timeout"):
            fix = (
                f"check the address and that this machine can reach the head node; "
                f"{fix_address}; or wait longer with --timeout"
            )
        else:
            fix = (
                f"{fix_address}; the cluster and this machine need the same Ray and Python versions"
            )
        problems.append(
            _problem(f"cannot connect to the Ray cluster at {address}: {result['error']}", fix)
        )
        return {"address": address, "error": result["error"], "nodes": []}
    accelerators = _accelerator_resources()
    nodes = [_node_entry(n, accelerators) for n in result.get("nodes", [])]
    nodes.sort(key=lambda n: (not n["alive"], str(n["address"]), str(n["node_id"])))
    alive = [n for n in nodes if n["alive"]]
    totals: dict[str, float] = {"CPU": sum(n["cpus"] for n in alive)}
    for n in alive:
        for k, v in n["accelerators"].items():
            totals[k] = totals.get(k, 0.0) + v
    if not alive:
        problems.append(
            _problem(
                f"the Ray cluster at {result.get('address', address)} has no live node",
                "restart the cluster's nodes (`ray start`), then run twinkle doctor --ray again",
            )
        )
    return {
        "address": result.get("address", address),
        "asked_address": address,
        "nodes": nodes,
        "alive_nodes": len(alive),
        "totals": totals,
    }


def _backend_problem(
    name: str, extra: str, plugins: list[dict[str, Any]], problems: list[dict[str, str]]
) -> None:
    if any(name in (p["registers"].get("backends") or []) for p in plugins if not p["error"]):
        return
    problems.append(
        _problem(
            f"the {name!r} backend is not installed (or its plugin failed to load), so "
            f"initialize(mode={name!r}) cannot work",
            f'pip install "twinkle-core[{extra}]"',
        )
    )


# --------------------------------------------------------------------------- report
def diagnose(ray_address: str | None = None, ray_timeout: float = 60.0) -> dict[str, Any]:
    """The doctor's report (see the module docstring); `ray_address` None skips Ray."""
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
    report["ray_cluster"] = None
    if ray_address is not None:
        report["ray_cluster"] = ray_cluster_report(ray_address, ray_timeout, problems)
        if report["ray"] is not None:
            _backend_problem("ray", "ray", report["plugins"], problems)
    report["problems"] = problems
    report["warnings"] = warnings
    return report


def _gib(n: float) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:.1f} GiB"
    return f"{n / 1024**2:.0f} MiB"


def _num(v: float) -> str:
    return f"{v:g}"


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
    cluster = report.get("ray_cluster")
    if cluster is not None:
        out += ["", f"ray cluster  {cluster.get('address')}"]
        if cluster.get("error"):
            out.append(f"  not reachable: {cluster['error']}")
        else:
            totals = ", ".join(f"{k}={_num(v)}" for k, v in cluster["totals"].items())
            out.append(f"  {cluster['alive_nodes']} live node(s); total {totals}")
            for n in cluster["nodes"]:
                acc = "".join(f"  {k} {_num(v)}" for k, v in n["accelerators"].items())
                kind = f" ({n['accelerator_type']})" if n["accelerator_type"] else ""
                state = "" if n["alive"] else "  DEAD"
                out.append(
                    f"  node {n['address']}/{str(n['node_id'])[:8]}{state}  CPU {_num(n['cpus'])}"
                    f"{acc}{kind}  memory {_gib(n['memory_bytes'])}  object store "
                    f"{_gib(n['object_store_memory_bytes'])}"
                )
    for title, items in (("warnings", report["warnings"]), ("problems", report["problems"])):
        if items:
            out += ["", title]
            for item in items:
                out.append(f"  - {item['problem']}")
                out.append(f"    fix: {item['fix']}")
    if not report["problems"]:
        out += ["", "no problems found"]
    return "\n".join(out)

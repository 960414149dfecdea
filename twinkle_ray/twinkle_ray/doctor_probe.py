"""`twinkle doctor --ray [ADDRESS]`: the Ray cluster's nodes, as twinkle would use them.

Implements core's `twinkle_doctor_probe` hook (see `plugin.py`). The cluster is read in a child
process (`ray.init(address=...)`, `ray.nodes()`, `ray.shutdown()`): the doctor process never
imports ray, an unreachable address cannot hang the command (`--timeout`), and Ray's own log
lines stay out of the report. The answer is `{"data", "problems", "warnings", "text"}`:
`data` is the report's `ray_cluster`, `text` the lines the doctor's text report shows.

`data["twinkle_runs"]` lists the health of every group of the twinkle runs on the cluster
(`health_board.py`: state, generation, restarts and the last cause), so a live run's restarts
show without asking its driver; a group of a live run that is dead or restarting is a warning.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from twinkle_core.plugin import get_plugin, registered_names

from . import health_board


def _problem(problem: str, fix: str) -> dict[str, str]:
    return {"problem": problem, "fix": fix}


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
        try:
            from twinkle_ray.health_board import read_all
            out["twinkle_runs"] = read_all()
        except Exception as exc:
            out["twinkle_runs_error"] = type(exc).__name__ + ": " + str(exc)
        try:
            from twinkle_ray.submission import SUPPORTED
            out["direct_submission"] = SUPPORTED
            out["ray_version"] = ray.__version__
        except Exception:
            out["direct_submission"] = False
    finally:
        ray.shutdown()
except BaseException as exc:
    out = {{"error": type(exc).__name__ + ": " + str(exc)}}
print({_MARK!r} + json.dumps(out, default=str), flush=True)
"""


def _accelerator_resources() -> set[str]:
    names = set(RAY_ACCELERATORS)
    for name in registered_names("platforms"):
        try:
            cls = get_plugin("platforms", name)
        except Exception:  # a broken platform plugin must not stop the report
            continue
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
    runs = list(result.get("twinkle_runs") or [])
    return {
        "address": result.get("address", address),
        "asked_address": address,
        "nodes": nodes,
        "alive_nodes": len(alive),
        "totals": totals,
        "twinkle_runs": runs,
        "twinkle_runs_error": result.get("twinkle_runs_error"),
        "direct_submission": result.get("direct_submission"),
        "driver_ray_version": result.get("ray_version"),
    }


def _submission_warnings(cluster: dict[str, Any]) -> list[dict[str, str]]:
    """This machine's Ray submits calls through `.remote()` (`twinkle_ray.submission`)."""
    if cluster.get("direct_submission") is not False:
        return []
    version = cluster.get("driver_ray_version") or "?"
    return [
        _problem(
            f"this machine's Ray ({version}) takes twinkle's calls through `.remote()`: its core "
            "worker's submit_actor_task has other parameters than the Ray 2.60 one twinkle-ray "
            "submits to directly, which costs about 7 us of driver CPU more per worker a call",
            "install the Ray twinkle-ray is tested with (ray 2.60), or a twinkle-ray release "
            "made for this Ray; calls work either way",
        )
    ]


def _health_warnings(cluster: dict[str, Any]) -> list[dict[str, str]]:
    """A group of a live run that is not serving calls (dead, or restarting)."""
    out = []
    for e in cluster.get("twinkle_runs") or []:
        if e.get("live") is False or e.get("state") == "healthy":
            continue
        cause = f" ({str(e.get('last_cause'))[:200]})" if e.get("last_cause") else ""
        fix = (
            "it serves calls again once the restart finishes; if it does not, look at the "
            "cause and at its workers' logs"
            if e.get("state") == "restarting"
            else "its restarts are spent or it had none (DeviceGroup(max_restarts=N)): create "
            "its objects again, or restart the run"
        )
        out.append(
            _problem(
                f"twinkle run {e.get('run')!r}: group {e.get('group')!r} is {e.get('state')} "
                f"at generation {e.get('generation')}{cause}",
                fix,
            )
        )
    return out


def _gib(n: float) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:.1f} GiB"
    return f"{n / 1024**2:.0f} MiB"


def _num(v: float) -> str:
    return f"{v:g}"


def _text(cluster: dict[str, Any]) -> list[str]:
    out = [f"ray cluster  {cluster.get('address')}"]
    if cluster.get("error"):
        out.append(f"  not reachable: {cluster['error']}")
        return out
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
    submission = cluster.get("direct_submission")
    if submission is not None:
        how = "directly to Ray's core worker" if submission else "through Ray's .remote()"
        out.append(f"  calls submitted {how} (Ray {cluster.get('driver_ray_version')})")
    if cluster.get("twinkle_runs_error"):
        out.append(f"  twinkle runs: could not be read ({cluster['twinkle_runs_error']})")
    else:
        out.extend(health_board.text(cluster.get("twinkle_runs") or []))
    return out


def probe(address: str, timeout: float) -> dict[str, Any]:
    """The hook's answer for the cluster at `address` (see the module docstring)."""
    problems: list[dict[str, str]] = []
    cluster = ray_cluster_report(address, timeout, problems)
    return {
        "data": cluster,
        "problems": problems,
        "warnings": (
            _submission_warnings(cluster) + _health_warnings(cluster) if cluster is not None else []
        ),
        "text": _text(cluster) if cluster is not None else [],
    }

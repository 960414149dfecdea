"""A fresh driver process for case 6 (`cases/ray_startup.py`); prints its timings as JSON.

python ray_startup_driver.py twinkle            # initialize + 4 workers + first call
python ray_startup_driver.py raw MODULES_JSON   # ray.init + 4 actors importing MODULES
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

from harness import emit, remove_soon

WORKERS = 4
STORE = 256 * 1024 * 1024
#: Top-level modules never imported on purpose (side effects, GUI, private).
SKIP = {"__main__", "this", "antigravity", "idlelib", "tkinter", "turtle", "turtledemo"}


def top_level_modules() -> list[str]:
    names = {m.split(".", 1)[0] for m in list(sys.modules)}
    return sorted(n for n in names if not n.startswith("_") and n not in SKIP)


def run_twinkle() -> dict:
    from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

    @remote_class()
    class Probe:
        @remote_function(collect="none")
        def noop(self) -> None:
            return None

        @remote_function(collect="first", execute="first")
        def modules(self) -> list[str]:
            return top_level_modules()

    start = time.perf_counter()
    initialize(
        mode="ray",
        groups=[DeviceGroup("g", WORKERS)],
        num_cpus=WORKERS,
        object_store_memory=STORE,
    )
    init_s = time.perf_counter() - start
    torch_after_init = "torch" in sys.modules
    probe = Probe(remote_group="g")
    probe.noop()(300)
    total = time.perf_counter() - start
    modules = probe.modules()(60)
    torch_after_call = "torch" in sys.modules
    start = time.perf_counter()
    shutdown()
    return {
        "startup_s": total,
        "initialize_s": init_s,
        "shutdown_s": time.perf_counter() - start,
        "driver_torch_after_initialize": torch_after_init,
        "driver_torch_after_first_call": torch_after_call,
        "worker_modules": modules,
        "worker_imported_torch": "torch" in modules,
    }


def run_raw(modules: list[str]) -> dict:
    start = time.perf_counter()
    import ray

    @ray.remote(num_cpus=1)
    class Probe:
        def __init__(self, modules: list[str]) -> None:
            import importlib

            for name in modules:
                try:
                    importlib.import_module(name)
                except Exception:
                    pass

        def noop(self) -> None:
            return None

    temp_dir = tempfile.mkdtemp(prefix="twb-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=WORKERS,
        include_dashboard=False,
        object_store_memory=STORE,
        _temp_dir=temp_dir,
        logging_level="ERROR",
    )
    init_s = time.perf_counter() - start
    actors = [Probe.remote(modules) for _ in range(WORKERS)]
    ray.get([a.noop.remote() for a in actors], timeout=300)
    total = time.perf_counter() - start
    start = time.perf_counter()
    ray.shutdown()
    remove_soon(temp_dir)
    return {"startup_s": total, "initialize_s": init_s, "shutdown_s": time.perf_counter() - start}


if __name__ == "__main__":
    if sys.argv[1] == "twinkle":
        emit(run_twinkle())
    else:
        emit(run_raw(json.loads(sys.argv[2])))

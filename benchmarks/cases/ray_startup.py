"""6. Ray start-up: a fresh driver's `initialize` + 4 workers + first call, and whether
`initialize` imports torch in the driver.

twinkle: `initialize(mode='ray', groups=[DeviceGroup('g', 4)])` (which starts its own embedded
cluster), a remote object on the group, its first no-op call resolved. raw: `import ray`,
`ray.init(address='local', ...)` with the same CPUs and object store, 4 actors whose
constructor imports the same top-level modules a twinkle worker holds after its first call
(read from a calibration run, torch included if twinkle's workers import it), first call on
each. Each run is a fresh driver process (`ray_startup_driver.py`), twinkle and raw
alternating; timed from before `initialize`/`import ray` to the first result (twinkle_core's
own import is case 9). Fair because both pay for the same cluster, the same number of worker
processes and the same module imports; the ratio is what twinkle's start-up adds on top.
"bare" (extra) is raw with actors importing nothing: what those imports cost.
"""

from __future__ import annotations

import json
import sys

from harness import BENCH_DIR, Context, Row, median, run_child

NUMBER, NAME, QUICK, SESSION = "6", "ray-startup", False, ()

DRIVER = str(BENCH_DIR / "cases" / "ray_startup_driver.py")


def run(ctx: Context) -> list[Row]:
    # Each round starts three clusters; their start-ups vary by a second on a shared machine,
    # so five rounds (about 2 min) keep the medians steady.
    rounds = 1 if ctx.quick else 5
    calibration = run_child([sys.executable, DRIVER, "twinkle"], timeout=600)
    modules = json.dumps(calibration["worker_modules"])
    runs: dict[str, list[dict]] = {"twinkle": [], "raw": [], "bare": []}
    commands = {
        "twinkle": [sys.executable, DRIVER, "twinkle"],
        "raw": [sys.executable, DRIVER, "raw", modules],
        "bare": [sys.executable, DRIVER, "raw", "[]"],
    }
    for r in range(rounds):
        order = list(commands) if r % 2 == 0 else list(commands)[::-1]
        for name in order:
            runs[name].append(run_child(commands[name], timeout=600))
    samples = {k: [run["startup_s"] for run in v] for k, v in runs.items()}
    torch_driver = any(run["driver_torch_after_initialize"] for run in runs["twinkle"])
    torch_worker = calibration["worker_imported_torch"]
    return [
        Row(
            NUMBER,
            "Ray start-up: initialize + 4 workers + first call (fresh driver)",
            median(samples["twinkle"]),
            median(samples["raw"]),
            unit="once",
            note=(
                f"torch imported by initialize in the driver: {'yes' if torch_driver else 'no'}"
                f"; by each worker: {'yes' if torch_worker else 'no'}; raw actors importing "
                f"nothing: {median(samples['bare']):.2f} s"
            ),
            extra={
                "driver_torch_after_initialize": torch_driver,
                "driver_torch_after_first_call": any(
                    run["driver_torch_after_first_call"] for run in runs["twinkle"]
                ),
                "worker_imported_torch": torch_worker,
                "twinkle_initialize_s": median([run["initialize_s"] for run in runs["twinkle"]]),
                "raw_ray_init_s": median([run["initialize_s"] for run in runs["raw"]]),
                "bare_s": median(samples["bare"]),
                "modules_imported_by_raw_actors": len(calibration["worker_modules"]),
            },
            samples=samples,
        )
    ]

"""19. Time from a worker's death to its group taking calls again: one worker of a group of 2
and of 8 SIGKILLed while idle (`DeviceGroup(max_restarts=...)`), until a call on the group
returns from the new generation; against raw Ray actors declared with `max_restarts` (Ray
restarts the killed actor itself), until a call on the killed actor returns.

Not the same work, and the table says so: twinkle rebuilds every worker of the group (the
survivors of a torch.distributed group would hang in their next collective) and replays their
constructors; Ray restarts one actor. Twinkle notices an idle death by a liveness probe every
second, so its time includes up to a second of waiting for the probe. On an embedded cluster,
in a child process; each worker's constructor is trivial (nothing imports torch).

19c/19d: what a restart costs the driver: the driver process's CPU time (every thread: the
restart's own thread, the liveness probe, Ray's driver threads) over the same window, polled
every 50 ms on both sides. The restart runs on a thread of its own; the driver's main thread
is free meanwhile (a call made on the group waits for the new generation).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from harness import BENCH_DIR, Context, Row, child_env, emit, median, run_child

from twinkle_core import get_worker_context, remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "19", "restart-time", False, ()


@remote_class()
class Worker:
    @remote_function(dispatch="all", collect="none")
    def where(self):
        ctx = get_worker_context()
        return [ctx.generation, os.getpid()]


class RawWorker:
    def where(self):
        return os.getpid()


def run(ctx: Context) -> list[Row]:
    rounds = 2 if ctx.quick else 3
    rows, cpu_rows = [], []
    for n, row_id in ((2, "19a"), (8, "19b")):
        result = run_child(
            [sys.executable, str(BENCH_DIR / "cases" / "restart_time.py"), str(n), str(rounds)],
            timeout=1200,
            env=child_env(),
        )
        s = result["samples"]
        cpu = {"twinkle": s.pop("twinkle_cpu"), "raw": s.pop("raw_cpu")}
        rows.append(
            Row(
                row_id,
                f"Ray: a worker of a group of {n} killed while idle, until the group serves "
                "calls again, vs a raw actor restarted by Ray",
                median(s["twinkle"]),
                median(s["raw"]),
                unit="per restart",
                note=f"twinkle rebuilds all {n} workers; Ray restarts the one actor",
                samples=s,
            )
        )
        cpu_rows.append(
            Row(
                {"19a": "19c", "19b": "19d"}[row_id],
                f"Ray: driver CPU time per restart of a group of {n} (all threads), vs raw",
                median(cpu["twinkle"]),
                median(cpu["raw"]),
                unit="CPU per restart",
                note="the driver process's CPU from the kill until calls are served again",
                samples=cpu,
            )
        )
    return rows + cpu_rows


# ------------------------------------------------------------------------------- child
def _until(call, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def child(n: int, rounds: int) -> None:
    import ray
    from harness import start_ray, stop_ray

    import cases.restart_time as me  # workers import the classes by this name
    from twinkle_core import DeviceGroup, group_state, initialize, shutdown

    temp_dir = start_ray(num_cpus=max(4, n // 2), object_store_mib=256)
    try:
        initialize(
            mode="ray",
            groups=[DeviceGroup("g", n, max_restarts=100)],
            cpus_per_worker=0.25,
        )
        group = me.Worker(remote_group="g")
        raw = [
            ray.remote(num_cpus=0.25, max_restarts=100, max_task_retries=0)(me.RawWorker).remote()
            for _ in range(n)
        ]
        samples: dict[str, list[float]] = {
            "twinkle": [],
            "raw": [],
            "twinkle_cpu": [],
            "raw_cpu": [],
        }
        for r in range(rounds):
            for name in ("twinkle", "raw") if r % 2 == 0 else ("raw", "twinkle"):
                if name == "twinkle":
                    before = group.where()(60)
                    generation = before[0][0]
                    start, cpu = time.monotonic(), time.process_time()
                    os.kill(before[-1][1], signal.SIGKILL)
                    while group_state("g").generation == generation:
                        time.sleep(0.05)
                    rows = group.where()(120)
                    assert all(g == generation + 1 for g, _ in rows), rows
                else:
                    pid = ray.get(raw[-1].where.remote(), timeout=60)
                    start, cpu = time.monotonic(), time.process_time()
                    os.kill(pid, signal.SIGKILL)
                    while _until(lambda: ray.get(raw[-1].where.remote(), timeout=60)) == pid:
                        time.sleep(0.05)
                samples[name].append(time.monotonic() - start)
                samples[f"{name}_cpu"].append(time.process_time() - cpu)
        emit({"samples": samples})
    finally:
        shutdown()
        stop_ray(temp_dir)


if __name__ == "__main__":
    child(int(sys.argv[1]), int(sys.argv[2]))

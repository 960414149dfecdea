"""What the short road for plain arguments (`twinkle_core.plain`) saves a call, in one process.

Not a suite case: an A/B of twinkle against itself. 1000 calls with case 1's config dict are
issued to a one-worker group whose worker is busy (only the issuing is timed, as in case 3),
in rounds alternating three variants: twinkle as it is ("new"), twinkle with the short road
turned off (`is_plain_data` answering False, so every argument is walked as before: "old"),
and raw Ray on a plain actor. Prints the medians per call and both ratios to raw.

    cd benchmarks && python ab_plain_arguments.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import ray
from cases.ray_call import CONFIG
from harness import ab_session, issue_while_busy

CALLS, ROUNDS, WARMUP = 1000, 14, 2


def main() -> None:
    import twinkle_core.calls as core_calls
    import twinkle_ray.workers as ray_workers

    with ab_session(CONFIG) as (one, (actor,)):
        new_plain, new_all = core_calls.is_plain_data, ray_workers.all_plain_data
        folder = tempfile.mkdtemp(prefix="twb-ab-")
        samples: dict[str, list[float]] = {"new": [], "old": [], "raw": []}
        for r in range(ROUNDS + WARMUP):
            for variant in ("new", "old", "raw") if r % 2 else ("raw", "old", "new"):
                path = os.path.join(folder, f"{variant}-{r}")
                if variant == "raw":
                    blocker = actor.block.remote(path)
                    start = time.perf_counter()
                    refs = [actor.take.remote(CONFIG) for _ in range(CALLS)]
                    took = time.perf_counter() - start
                    open(path, "w").close()
                    ray.get([blocker, *refs], timeout=300)
                else:
                    on = variant == "new"
                    core_calls.is_plain_data = new_plain if on else (lambda v, d=3: False)
                    ray_workers.all_plain_data = (
                        new_all if on else (lambda calls, known=None: False)
                    )
                    took = issue_while_busy(one, path, lambda: one.take(CONFIG), CALLS)
                if r >= WARMUP:
                    samples[variant].append(took / CALLS * 1e6)
        core_calls.is_plain_data, ray_workers.all_plain_data = new_plain, new_all
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(
            f"issue cost per call: new {med['new']:.0f} us, old {med['old']:.0f} us, "
            f"raw {med['raw']:.0f} us; new/raw {med['new'] / med['raw']:.2f}, "
            f"old/raw {med['old'] / med['raw']:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())

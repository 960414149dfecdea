"""5. torchrun, 2 CPU processes (gloo): collect='mean' of a scalar and collect='none'.

One job (`python -m torch.distributed.run --standalone --nproc_per_node=2 torchrun_job.py`)
runs both twinkle and raw torch.distributed, alternately:
- 5a twinkle `worker.scalar()()` with collect='mean' vs raw `dist.all_reduce` of a float64
  tensor holding the same scalar, divided by the world size, `.item()`;
- 5b twinkle `worker.nothing()()` with collect='none' (every rank gets the list of results) vs
  raw `dist.all_gather_object` of the same None;
- 5c the same with a result too big for the call's slot (a list of 1000 ints, about 2 KB
  pickled): over the sockets it follows the slot in the same message, over gloo it takes a
  second collective.
Fair because the raw calls are what each collect mode must do at least (one collective over the
same gloo transport between the same two processes); the ratio is twinkle's bookkeeping
(call numbering, failure exchange, result shapes) on top.

5a's note also gives the floor of a *checked* mean: one `all_reduce` of two float64s (the value
and one check number), the least a call needs that must also notice ranks at different calls.
gloo reduces a single element in one step and two or more in several, so on this machine that
floor is itself about 1.2-1.6x the one-number `all_reduce` (see docs/performance.md).

Both processes run on one machine, so twinkle's first exchange of each call goes over Unix
sockets (`twinkle_local/node_sockets.py`). In full mode a second job runs twinkle with
`node_sockets=False`, the gloo path a job across machines takes, and the notes give its ratios.
Each sample above is one call after a barrier, so it also holds how far apart the processes
left the barrier; the notes add samples of 20 calls back to back (twinkle's mean against the raw
all_reduce), which do not.
"""

from __future__ import annotations

import sys
import time

from harness import BENCH_DIR, Context, Row, median, run_child

NUMBER, NAME, QUICK, SESSION = "5", "torchrun", True, ()
BURST_NOTE = "20 calls back to back:"


def _job(rounds: int, calls: int, node_sockets: bool, bursts: bool = False) -> dict:
    return run_child(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(BENCH_DIR / "cases" / "torchrun_job.py"),
            f"--rounds={rounds}",
            f"--calls={calls}",
            f"--node-sockets={int(node_sockets)}",
            f"--bursts={int(bursts)}",
        ],
        timeout=300,
    )


def run(ctx: Context) -> list[Row]:
    rounds, calls = (60, 1) if ctx.quick else (400, 1)
    start = time.perf_counter()
    result = _job(rounds, calls, node_sockets=True, bursts=not ctx.quick)
    job_s = time.perf_counter() - start
    s = result["samples"]
    extra = {"job_wall_s": job_s, "initialize_s": result["initialize_s"]}
    checked = median(s["raw-all_reduce-checked"])
    floor = (
        f"all_reduce of value+check: {checked * 1e6:.0f} us, "
        f"{checked / median(s['raw-all_reduce']):.2f}x the one-number one; "
        f"twinkle {median(s['twinkle-mean']) / checked:.2f}x it"
    )
    gloo_mean = gloo_none = gloo_medium = ""
    if not ctx.quick:  # the path of a job across machines, measured in a job of its own
        g = _job(rounds, calls, node_sockets=False, bursts=True)["samples"]
        extra["gloo_path_s"] = {k: median(v) for k, v in g.items()}

        def burst(samples: dict) -> str:
            t, r = median(samples["twinkle-mean-burst"]), median(samples["raw-all_reduce-burst"])
            return f"{t * 1e6:.0f} vs {r * 1e6:.0f} us, x{t / r:.2f}"

        gloo_mean = (
            f"; {BURST_NOTE} {burst(s)}; over gloo (node_sockets=False): "
            f"{median(g['twinkle-mean']) * 1e6:.0f} us, "
            f"x{median(g['twinkle-mean']) / median(g['raw-all_reduce']):.2f}, "
            f"{BURST_NOTE} {burst(g)}"
        )
        gloo_medium = (
            f"over gloo (node_sockets=False): {median(g['twinkle-medium']) * 1e6:.0f} us, "
            f"x{median(g['twinkle-medium']) / median(g['raw-all_gather_object-medium']):.2f}"
        )
        gloo_none = (
            f"over gloo (node_sockets=False): {median(g['twinkle-none']) * 1e6:.0f} us, "
            f"x{median(g['twinkle-none']) / median(g['raw-all_gather_object']):.2f}"
        )

    def row(number: str, name: str, twinkle: str, raw: str, note: str) -> Row:
        return Row(
            number,
            f"torchrun 2 procs: {name}",
            median(s[twinkle]),
            median(s[raw]),
            note=note,
            extra=extra,
            samples={"twinkle": s[twinkle], "raw": s[raw]},
        )

    return [
        row(
            "5a",
            "collect='mean' of a scalar vs all_reduce",
            "twinkle-mean",
            "raw-all_reduce",
            floor + gloo_mean,
        ),
        row(
            "5b",
            "collect='none' vs all_gather_object",
            "twinkle-none",
            "raw-all_gather_object",
            gloo_none,
        ),
        row(
            "5c",
            "collect='none' of a 2 KB result vs all_gather_object",
            "twinkle-medium",
            "raw-all_gather_object-medium",
            gloo_medium,
        ),
    ]

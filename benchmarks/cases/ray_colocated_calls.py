"""24. Calls to a colocated role on Ray: the second object of a group runs in the first one's
actor (slot 1) with random generators of its own, switched in for its calls and left in place
after them (the first object's call puts the process's back). What a second role costs per
call, with a real call's shape, in runs of calls to one role and alternating between two.

On the one-worker group, a second `bench_ops.Bench` object is built beside the suite's first
(colocated: the same actor process). Four variants, each 1000 calls of `sample(CONFIG)` (a
sampler's small step: it draws one number from numpy's and one from python's global
generators, with case 1's config dict as argument) issued, then resolved:
- "second" (the row's twinkle figure): the colocated second role, one LazyCollect each;
- "first" (24b's baseline, and in 24a's note): the same calls to the first role, in the same
  process, resolved the same way: the difference is the call by name and one generator
  switch per round;
- "alternate" (24b's note): the first and the second role in turn, 500 calls each: a switch
  on every call;
- "raw" (24a's baseline): a plain actor of the same class, `actor.sample.remote(CONFIG)`,
  then `ray.get` of the list.
Fair because every variant queues the same 1000 actor tasks with the very same argument on
one worker running the same method, which draws the same numbers; the four run in the same
interleaved rounds.
"""

from __future__ import annotations

import ray
from harness import Context, Row, interleave, median

from cases.ray_call import CONFIG

NUMBER, NAME, QUICK, SESSION = "24", "ray-colocated", False, ("one",)


def run(ctx: Context) -> list[Row]:
    from bench_ops import Bench

    first, (actor,) = ctx.ray.twinkle("one"), ctx.ray.raw("one")
    second = Bench(remote_group="one")  # colocated: slot 1 of the same actor
    second.noop()(120)
    # Rounds of 1000 pipelined calls vary by +-40% here (see case 2): 15 rounds of the
    # three variants take about 15 s.
    calls, rounds = (150, 2) if ctx.quick else (1000, 15)

    def role(obj):
        def go() -> None:
            lazies = [obj.sample(CONFIG) for _ in range(calls)]
            for lazy in lazies:
                lazy(120)

        return go

    def alternate() -> None:
        lazies = [obj.sample(CONFIG) for _ in range(calls // 2) for obj in (first, second)]
        for lazy in lazies:
            lazy(120)

    def raw() -> None:
        ray.get([actor.sample.remote(CONFIG) for _ in range(calls)], timeout=120)

    samples = interleave(
        {"second": role(second), "first": role(first), "alternate": alternate, "raw": raw},
        rounds,
        per=calls,
    )
    s, f, r = median(samples["second"]), median(samples["first"]), median(samples["raw"])
    a = median(samples["alternate"])
    return [
        Row(
            "24a",
            "Colocated second role: 1000 calls with a dict, issued then resolved, 1 worker",
            s,
            r,
            note=f"first role {f * 1e6:.0f} us ({f / r:.2f}x raw); each call draws numbers",
            samples=samples,
        ),
        Row(
            "24b",
            "Colocated second role against the first (runs of 1000 calls to one role)",
            s,
            f,
            note=(
                "both twinkle, same process and method; baseline: the first role; the two in "
                f"turn (a generator switch every call): {a * 1e6:.0f} us ({a / f:.2f}x)"
            ),
            extra={"alternate_s": a, "alternate_vs_first": a / f},
            samples={"second": samples["second"], "first": samples["first"]},
        ),
    ]

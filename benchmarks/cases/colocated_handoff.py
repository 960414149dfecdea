"""18. A hand-off between colocated roles: a 512 MiB batch (256 MiB per rank) from a policy to
a reference role on the same 2-worker group, against the same hand-off from a policy group to
a reference group of its own (`reference.log_probs(policy.generate())`).

On Ray, in a child process with its own one-node cluster (object store 2.5 GiB). Both sides
use the same two roles, the same calls and the same data: each policy worker returns the
256 MiB tensor it holds (`collect='concat'`), each reference worker receives its share
(`dispatch='slice_dp'`, the policy rank's own part) and reads its first and last element. Only
the hosting differs: colocated, the reference takes the policy's tensor in its own process by
reference; between groups, the policy's result goes through the object store (the policy
worker puts it, the reference worker maps it). Three untimed rounds first touch the object
store's pages. Row 18a is what the payload adds, each side less the same two calls handing
on a 4-byte tensor (measured alongside): the hand-off's own cost, which the target of issue 27
(colocated under 5% of between groups) is about; 18b is the whole, both calls' round trips
included.
"""

from __future__ import annotations

import sys

from harness import BENCH_DIR, Context, Row, child_env, emit, interleave, median, run_child

from twinkle_core import remote_class, remote_function

NUMBER, NAME, QUICK, SESSION = "18", "colocated-handoff", False, ()

MIB_PER_RANK = 256


@remote_class()
class Policy:
    """Holds a batch of `MIB_PER_RANK` MiB per worker, made once; `generate` returns it."""

    def __init__(self) -> None:
        import torch

        from twinkle_core import get_worker_context

        rows = MIB_PER_RANK * 1024 * 1024 // 4 // 1024
        self.batch = torch.full((rows, 1024), float(get_worker_context().rank))

    @remote_function(dispatch="all", collect="concat")
    def generate(self):
        return self.batch

    @remote_function(dispatch="all", collect="concat")
    def generate_empty(self):
        return self.batch[:1, :1]  # the same calls, a 4-byte payload

    @remote_function(dispatch="all")
    def noop(self) -> None:
        return None


@remote_class()
class Reference:
    """Reads the first and the last element of its share: the hand-off is measured, not the
    consumer's work (reading every 4096th element of 256 MiB touches 16,384 pages, 1-2 ms
    here, on both sides alike). On one node nothing arrives lazily: the producer's put is the
    whole cost of the object-store path, and the consumer maps the result."""

    @remote_function(dispatch="slice_dp", collect="none")
    def log_probs(self, batch) -> float:
        return float(batch[0, 0] + batch[-1, -1])

    @remote_function(dispatch="all")
    def noop(self) -> None:
        return None


def run(ctx: Context) -> list[Row]:
    rounds = 5 if ctx.quick else 9
    result = run_child(
        [sys.executable, str(BENCH_DIR / "cases" / "colocated_handoff.py"), str(rounds)],
        timeout=1200,
        env=child_env(),
    )
    s = result["samples"]
    med = {k: median(v) for k, v in s.items()}
    # What the payload adds: the hand-off less the same two calls handing on a 4-byte tensor.
    payload = {
        "colocated": med["colocated"] - med["colocated_empty"],
        "between_groups": med["between_groups"] - med["between_groups_empty"],
    }
    extra = {"median_s": med, "payload_s": payload, "payload_mib": 2 * MIB_PER_RANK}
    return [
        Row(
            "18a",
            f"Ray: what a {2 * MIB_PER_RANK} MiB payload adds to a hand-off, colocated roles vs "
            "two groups",
            payload["colocated"],
            payload["between_groups"],
            unit="per hand-off",
            note="target < 0.05; each side less the same calls handing on a 4-byte tensor",
            extra=extra,
            samples=s,
        ),
        Row(
            "18b",
            f"Ray: the whole {2 * MIB_PER_RANK} MiB hand-off (both calls), colocated vs two groups",
            med["colocated"],
            med["between_groups"],
            unit="per hand-off",
            note="includes two calls' round trips on both sides",
        ),
    ]


# ------------------------------------------------------------------------------- child
def child(rounds: int) -> None:
    from harness import start_ray, stop_ray

    import cases.colocated_handoff as me  # workers import the classes by this name
    from twinkle_core import DeviceGroup, initialize, shutdown

    temp_dir = start_ray(num_cpus=6, object_store_mib=2560)
    try:
        initialize(
            mode="ray",
            groups=[DeviceGroup("model", 2), DeviceGroup("policy", 2), DeviceGroup("ref", 2)],
            cpus_per_worker=0.25,
        )
        together = (me.Policy(remote_group="model"), me.Reference(remote_group="model"))
        apart = (me.Policy(remote_group="policy"), me.Reference(remote_group="ref"))
        for role in (*together, *apart):
            role.noop()(600)
        expected = [0.0, 2.0]  # first + last element of rank 0's zeros and rank 1's ones

        def hand_off(roles) -> None:
            policy, reference = roles
            got = reference.log_probs(policy.generate())(600)
            assert got == expected, got

        def empty(roles) -> None:
            policy, reference = roles
            got = reference.log_probs(policy.generate_empty())(600)
            assert got == [0.0, 2.0], got

        # Six untimed rounds: 3 GiB through the object store first, so every page of it exists
        # (a fresh page costs a fault: about 0.35 s per 512 MiB, paid by whoever first uses it).
        samples = interleave(
            {
                "colocated": lambda: hand_off(together),
                "between_groups": lambda: hand_off(apart),
                "colocated_empty": lambda: empty(together),
                "between_groups_empty": lambda: empty(apart),
            },
            rounds,
            warmup=6,
        )
        emit({"samples": samples})
    finally:
        shutdown()
        stop_ray(temp_dir)


if __name__ == "__main__":
    child(int(sys.argv[1]))

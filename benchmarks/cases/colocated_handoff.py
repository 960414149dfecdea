"""18. A hand-off between colocated roles: a 512 MiB batch (256 MiB per rank) from a policy to
a reference role on the same 2-worker group, against the same hand-off from a policy group to
a reference group of its own (`reference.log_probs(policy.generate())`).

On Ray, in a child process with its own one-node cluster (object store 2.5 GiB). Both sides
use the same two roles, the same calls and the same data: each policy worker returns the
256 MiB tensor it holds (`collect='concat'`), each reference worker receives its share
(`dispatch='slice_dp'`, the policy rank's own part) and reads every 4096th element. Only the
hosting differs: colocated, the reference takes the policy's tensor in its own process by
reference; between groups, the policy's result goes through the object store (the policy
worker puts it, the reference worker maps it). Three untimed rounds first touch the object
store's pages. The target (issue 27): colocated under 5% of between groups.
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

    @remote_function(dispatch="all")
    def noop(self) -> None:
        return None


@remote_class()
class Reference:
    """Reads every 4096th element of its share (nothing arrives lazily unread)."""

    @remote_function(dispatch="slice_dp", collect="none")
    def log_probs(self, batch) -> float:
        return float(batch.view(-1)[::4096].sum())

    @remote_function(dispatch="all")
    def noop(self) -> None:
        return None


def run(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 7
    result = run_child(
        [sys.executable, str(BENCH_DIR / "cases" / "colocated_handoff.py"), str(rounds)],
        timeout=1200,
        env=child_env(),
    )
    s = result["samples"]
    med = {k: median(v) for k, v in s.items()}
    return [
        Row(
            "18",
            f"Ray: {2 * MIB_PER_RANK} MiB hand-off between colocated roles vs between groups",
            med["colocated"],
            med["between_groups"],
            unit="per hand-off",
            note="target < 0.05: the reference takes the policy's tensor in its own process",
            extra={"median_s": med, "payload_mib": 2 * MIB_PER_RANK},
            samples=s,
        )
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
        # every 4096th element of rank 0's zeros and of rank 1's ones
        expected = [0.0, float(MIB_PER_RANK * 1024 * 1024 // 4 // 4096)]

        def hand_off(roles) -> None:
            policy, reference = roles
            got = reference.log_probs(policy.generate())(600)
            assert got == expected, got

        samples = interleave(
            {"colocated": lambda: hand_off(together), "between_groups": lambda: hand_off(apart)},
            rounds,
            warmup=3,
        )
        emit({"samples": samples})
    finally:
        shutdown()
        stop_ray(temp_dir)


if __name__ == "__main__":
    child(int(sys.argv[1]))

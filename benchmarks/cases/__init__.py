"""The benchmark cases, in table order. Each module has a docstring (what it measures, why the
baseline is fair) and these attributes:

- `NUMBER`: its row number(s) in the table; `NAME`: what `--only` also accepts.
- `QUICK`: whether `--quick` runs it; `SESSION`: the groups it uses on the shared Ray cluster
  (`harness.RaySession`), empty when it uses none.
- `run(ctx) -> list[Row]`.
"""

MODULES = (
    "ray_call",
    "ray_many",
    "ray_busy",
    "ray_slice_mean",
    "torchrun",
    "ray_startup",
    "ray_failfast",
    "inprocess",
    "imports",
    "ray_overlap",
    "ray_tensor",
    "ray_handoff",
    "trace_overhead",
    "ray_transport",
    "torchrun_transport",
    "ray_rdt",
    "colocation",
    "colocated_handoff",
    "restart_time",
    "ray_args",
    "planning_scale",
    "ray_relay",
    "ray_colocated_calls",
)

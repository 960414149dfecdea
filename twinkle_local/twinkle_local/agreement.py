"""The start-up hand-shake of mode 'local': the processes agree on the run before any call.

Every process of the job runs the same script, so each must have called `initialize` the same
way. In the run's first exchange every process checks the others' settings against its own,
learns every process's host name (for placements, failures and the one-machine fast path) and
takes rank 0's run name, so alerts, logs and the run's keys in the store are named alike
everywhere. Processes that disagree all fail here, before any remote object is made.
"""

from __future__ import annotations

from twinkle_core import ConfigurationError

from .session import Session

# How many runs this process started in mode 'local'. Every process of a job starts them in the
# same order, so (run name, count) names a run's keys in the shared store alike everywhere.
_runs_started = 0


def agree(session: Session, config) -> None:
    """Exchange node names; check every process was initialized the same way; share the
    run name (rank 0's) so alerts and logs name the run alike on every process."""
    fingerprint = (
        config.seed,
        config.full_determinism,
        config.lazy_collect,
        [(g.name, g.num_workers, g.device_type) for g in config.groups.values()],
        None if config.global_device_mesh is None else repr(config.global_device_mesh),
    )
    hello = session.channel.all_gather(
        (session.node, config.name, fingerprint, session.env.local_world_size)
    )
    for rank, (_, _, theirs, _) in enumerate(hello):
        if theirs != fingerprint:
            raise ConfigurationError(
                f"mode 'local': process {rank} called initialize() differently from process "
                f"{session.env.rank} ({theirs} vs {fingerprint}); every process of the job must "
                "run the same script with the same seed, groups and mesh"
            )
    global _runs_started
    _runs_started += 1
    session.nodes = [h[0] for h in hello]
    session.local_worlds = [h[3] for h in hello]
    config.name = hello[0][1]
    session.channel.namespace = f"twinkle/{config.name}/{_runs_started}"

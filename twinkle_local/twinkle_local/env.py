"""Who this process is in a torchrun job, read from the variables torchrun sets."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from twinkle_core import ConfigurationError

#: What torchrun exports to every worker process.
TORCHRUN_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class TorchrunEnv:
    """The process's place in the job; a lone process (not started by torchrun) is world 1."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def launched(self) -> bool:
        """Whether torchrun (or an equivalent launcher) started this process."""
        return self.master_addr is not None

    @classmethod
    def detect(cls) -> TorchrunEnv:
        """torchrun's variables, or the world of a default group the user already started
        (e.g. under SLURM with `init_process_group` and no WORLD_SIZE/RANK variables)."""
        env = cls.from_environ()
        if env.launched:
            return env
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return env
        world, rank = dist.get_world_size(), dist.get_rank()
        local_world = _int(os.environ, "LOCAL_WORLD_SIZE", minimum=1, default=world)
        local_rank = _int(os.environ, "LOCAL_RANK", minimum=0, default=rank % local_world)
        return cls(world, rank, local_rank, local_world, "(existing process group)", None)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TorchrunEnv:
        """Parse torchrun's variables; none of them set means a single process.

        A partial or inconsistent set is an error naming the variable, since guessing would
        start a job whose processes disagree about the world.
        """
        env = os.environ if environ is None else environ
        present = [v for v in TORCHRUN_VARS if env.get(v, "") != ""]
        if not present:
            return cls()
        if "WORLD_SIZE" not in present or "RANK" not in present:
            raise ConfigurationError(
                f"mode 'local': found {', '.join(present)} in the environment but not both "
                "WORLD_SIZE and RANK; start the script with `torchrun --nproc_per_node=N "
                "script.py`, or unset these variables to run a single process"
            )
        world = _int(env, "WORLD_SIZE", minimum=1)
        rank = _int(env, "RANK", minimum=0)
        if rank >= world:
            raise ConfigurationError(f"mode 'local': RANK={rank} must be below WORLD_SIZE={world}")
        local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1, default=world)
        local_rank = _int(env, "LOCAL_RANK", minimum=0, default=rank % local_world)
        if local_rank >= local_world:
            raise ConfigurationError(
                f"mode 'local': LOCAL_RANK={local_rank} must be below "
                f"LOCAL_WORLD_SIZE={local_world}"
            )
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in present]
        if missing:
            raise ConfigurationError(
                f"mode 'local': {' and '.join(missing)} not set; torchrun sets them (use "
                "`torchrun --standalone --nproc_per_node=N script.py` on one machine)"
            )
        addr = env["MASTER_ADDR"]
        port = _int(env, "MASTER_PORT", minimum=1)
        return cls(world, rank, local_rank, local_world, addr, port)


def _int(env: Mapping[str, str], name: str, *, minimum: int, default: int | None = None) -> int:
    raw = env.get(name, "")
    if raw == "" and default is not None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigurationError(
            f"mode 'local': environment variable {name}={raw!r} must be an integer >= {minimum} "
            "(torchrun sets it; do not set it by hand)"
        )
    return value

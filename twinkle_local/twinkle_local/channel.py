"""twinkle's own traffic between the processes of a torchrun job.

It runs on a separate gloo process group (never the user's default group, which may be nccl
and busy with training collectives), so twinkle's object exchanges and the user's collectives
can never be matched against each other. Elections and hand-shakes that must work across nodes
and outlive a failing process use the torch.distributed key-value store (under torchrun it is
the launcher's store, which lives as long as the job).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from typing import Any

log = logging.getLogger("twinkle")


class ChannelError(RuntimeError):
    """A collective on the control group failed: a process died or stopped answering."""


class ControlChannel:
    """Collectives over twinkle's control group; a lone process exchanges with itself."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        group: Any = None,
        store: Any = None,
        namespace: str = "twinkle",
    ) -> None:
        self.world_size = world_size
        self.rank = rank
        self.group = group
        self.store = store
        self.namespace = namespace

    @property
    def distributed(self) -> bool:
        return self.group is not None

    def all_gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in rank order (on every process)."""
        if self.group is None:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except Exception as exc:
            raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
        return out

    def all_reduce_sum(self, buffers: dict[str, Any]) -> dict[str, Any]:
        """Sum each (CPU) tensor of `buffers` element-wise over all processes, in place."""
        if self.group is None:
            return buffers
        import torch.distributed as dist

        try:
            for tensor in buffers.values():
                if tensor.numel():
                    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        except Exception as exc:
            raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
        return buffers

    # ----------------------------------------------------------------- store
    def _key(self, *parts: str) -> str:
        digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]
        return f"{self.namespace}/{digest}"

    def claim(self, key: str) -> bool:
        """True in exactly one process of the job for each `key` (store counter)."""
        if self.store is None:
            return True
        return int(self.store.add(self._key("claim", key), 1)) == 1

    def mark_done(self, key: str) -> None:
        """Tell the other processes that the work claimed under `key` is finished."""
        if self.store is not None:
            self.store.set(self._key("done", key), "1")

    def wait_done(self, keys: list[str], timeout: float) -> bool:
        """Wait (at most `timeout` s) until every key was marked done; False on timeout."""
        if self.store is None or not keys:
            return True
        try:
            self.store.wait(
                [self._key("done", k) for k in keys], datetime.timedelta(seconds=timeout)
            )
        except Exception as exc:  # timeout, or the store went away with the job
            log.warning("twinkle: gave up waiting for the notifying rank: %s", exc)
            return False
        return True

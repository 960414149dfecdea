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

    @property
    def timed_out(self) -> bool:
        """Whether the group's own timeout ended it (the peer may be alive, but stuck)."""
        return "timed out" in str(self).lower() or "timeout" in str(self).lower()


class DoneWork:
    """The work of a collective with oneself: finished at once."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


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
        self._direct = True
        #: The slot gathers' Unix-socket mesh, when every process is on this machine
        #: (`use_node_sockets`); None: they go over gloo.
        self.sockets: Any = None

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

    @property
    def eager_bytes(self) -> int:
        """How many bytes a gather can carry after each slot (`start_gather(extra=...)`):
        up to `node_sockets.EAGER_BYTES` over the sockets, none on gloo. The same number in
        every process of the job."""
        return 0 if self.sockets is None else self.sockets.eager_bytes

    def start_gather(self, slot: bytearray, extra: bytes = b"") -> tuple[Any, Any]:
        """Start gathering every process's `slot` (the same size everywhere) and, within
        `eager_bytes`, the `extra` bytes after it: (a bytearray that will hold every slot in
        rank order, the collective's work object; over the sockets its `extras` holds the
        other processes' extra bytes by rank).

        On gloo the collective runs in gloo's own thread: `work.wait(timeout)` waits for it,
        and `work.is_completed()` tells without waiting.
        """
        if self.group is None:
            return slot, DoneWork()
        if self.sockets is not None:
            try:
                return self.sockets.start_gather(slot, extra)
            except Exception as exc:
                raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
        if extra:
            raise ChannelError("gloo gathers carry no extra bytes (eager_bytes is 0)")
        import torch
        import torch.distributed as dist

        mine = torch.frombuffer(slot, dtype=torch.uint8)
        gathered = bytearray(len(slot) * self.world_size)
        out = torch.frombuffer(gathered, dtype=torch.uint8)
        try:
            if self._direct:
                try:  # the process group itself: torch's argument checks cost a call's worth
                    return gathered, self.group._allgather_base(out, mine)
                except (AttributeError, TypeError):
                    self._direct = False
            return gathered, _gather_single(dist)(out, mine, group=self.group, async_op=True)
        except Exception as exc:
            raise ChannelError(f"{type(exc).__name__}: {exc}") from exc

    def use_node_sockets(self, timeout_s: float) -> bool:
        """Gather slots over Unix sockets from now on, if every process can (collective: every
        process calls it at the same point; `node_sockets.py` says why). True if they do."""
        if self.group is not None and self.world_size > 1 and self.sockets is None:
            from .node_sockets import SocketMesh

            self.sockets = SocketMesh.connect(self, timeout_s)
        return self.sockets is not None

    def close(self) -> None:
        """Close the socket mesh, if any (the process groups are the backend's to destroy)."""
        sockets, self.sockets = self.sockets, None
        if sockets is not None:
            sockets.close()

    def all_gather_bytes(self, payload: bytes, size: int) -> list[bytes]:
        """Every process's `payload` (at most `size` bytes, agreed beforehand), in rank order;
        each padded to `size` (callers know the real lengths)."""
        if self.group is None:
            return [payload]
        import numpy as np
        import torch
        import torch.distributed as dist

        mine = np.zeros(size, dtype=np.uint8)
        mine[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        out = torch.zeros(size * self.world_size, dtype=torch.uint8)
        try:
            _gather_single(dist)(out, torch.from_numpy(mine), group=self.group)
        except Exception as exc:
            raise ChannelError(f"{type(exc).__name__}: {exc}") from exc
        data = out.numpy().tobytes()
        return [data[r * size : (r + 1) * size] for r in range(self.world_size)]

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
    def key(self, *parts: Any) -> str:
        """A plain key of this run in the store (readable: for hand-shakes between threads)."""
        return "/".join([self.namespace, *(str(p) for p in parts)])

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


def _gather_single(dist: Any) -> Any:
    """torch's all-gather into one tensor (renamed all_gather_single in torch 2.13)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

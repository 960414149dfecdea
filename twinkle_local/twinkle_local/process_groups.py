"""The torch.distributed groups a run of mode 'local' makes, and their teardown.

At initialize a process joins the job's default group (made here, or the user's own, checked)
and makes twinkle's own gloo control group, so that twinkle's exchanges never share a group with
the user's collectives. Later come the groups of the transports' other backends (nccl, hccl:
made on first use) and the subgroups of collective groups. At shutdown exactly the groups made
here are destroyed, never the user's.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from twinkle_core import ConfigurationError
from twinkle_core.plugin import AcceleratorPlatform

from .channel import ControlChannel
from .distributed import init_from_env
from .session import Session

log = logging.getLogger("twinkle")


class ProcessGroups:
    """The groups of one run; each process makes them in the same order as the others."""

    def __init__(self, session: Session) -> None:
        self.session = session
        #: Whether twinkle made the default group (and so destroys it at shutdown).
        self.owns_default_group = False
        self._control_group: Any = None
        #: Subgroups of this run's collective groups (destroyed at shutdown).
        self._collective_links: list[Any] = []
        #: Groups of the transports' torch.distributed backends other than gloo (which uses
        #: the control group), by backend name: made on first use, destroyed at shutdown.
        self._transport_groups: dict[str, Any] = {}

    def join(
        self,
        platform: AcceleratorPlatform,
        dist_backend: str | None,
        dist_timeout: datetime.timedelta,
        timeout: datetime.timedelta,
    ) -> None:
        """Join the default group (made here unless the user made it) and make the control
        group; the session's channel then runs over it."""
        import torch.distributed as dist

        env = self.session.env
        if dist.is_initialized():
            if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
                raise ConfigurationError(
                    f"torch.distributed is already initialized with world size "
                    f"{dist.get_world_size()} and rank {dist.get_rank()}, but torchrun's "
                    f"environment says {env.world_size} and {env.rank}"
                )
            if platform.device_type != "cpu":
                platform.set_device(env.local_rank)
        else:
            init_from_env(
                platform, dist_backend or platform.dist_backend, dist_timeout, env.local_rank
            )
            self.owns_default_group = True
        # twinkle's own exchanges never share a group with the user's collectives.
        self._control_group = dist.new_group(backend="gloo", timeout=timeout)
        store = dist.distributed_c10d._get_default_store()
        self.session.channel = ControlChannel(env.world_size, env.rank, self._control_group, store)

    def transport_group(self, torch_backend: str) -> Any:
        """The group a transport of `torch_backend` broadcasts over: twinkle's gloo control
        group for gloo, else a group of that backend over the whole job, made on first use.

        Called in an exchange's second step, which every process takes at the same point, so
        every process makes the new group in the same order (as `new_group` needs)."""
        if torch_backend == "gloo":
            return self.session.channel.group
        group = self._transport_groups.get(torch_backend)
        if group is None:
            import torch.distributed as dist

            timeout = datetime.timedelta(seconds=self.session.timeout_s)
            group = dist.new_group(backend=torch_backend, timeout=timeout)
            self._transport_groups[torch_backend] = group
        return group

    def add_link(self, link: Any) -> None:
        """Keep a collective group's subgroup (`collective.py`) until shutdown."""
        self._collective_links.append(link)

    def destroy(self) -> None:
        """Destroy the process groups this run created, and only those."""
        links, self._collective_links = self._collective_links, []
        for link in links:
            link.destroy()
        transport_groups, self._transport_groups = self._transport_groups, {}
        if transport_groups:
            import torch.distributed as dist

            for name, pg in transport_groups.items():
                try:
                    if dist.is_initialized():
                        dist.destroy_process_group(pg)
                except Exception as exc:
                    log.warning("twinkle: destroying the %s transport group failed: %s", name, exc)
        if self._control_group is None and not self.owns_default_group:
            return
        import torch.distributed as dist

        group, self._control_group = self._control_group, None
        self.session.channel.close()
        self.session.channel = ControlChannel(1, 0)
        try:
            if group is not None and dist.is_initialized():
                dist.destroy_process_group(group)
        except Exception as exc:
            log.warning("twinkle: destroying the control group failed: %s", exc)
        if self.owns_default_group:
            self.owns_default_group = False
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception as exc:
                log.warning("twinkle: destroying the default group failed: %s", exc)

"""This process in one run of mode 'local': the facts every part of the run reads.

The backend, the worker groups, the exchanges, the watchdog and the trace all need the same few
facts: where this process sits in the torchrun job (its environment, every process's host
name), the control channel the exchanges travel on (replaced when the process groups are made,
and again when they are destroyed), and the run's settings that shape each call. They share one
`Session`, which the backend owns, rather than reaching into the backend.
"""

from __future__ import annotations

import socket

from .channel import ControlChannel
from .defaults import DEFAULT_TIMEOUT_S
from .env import TorchrunEnv
from .options import DEFAULT_OPTIONS


class Session:
    """One process's view of one run (one per `LocalBackend`)."""

    def __init__(self) -> None:
        self.env = TorchrunEnv()
        #: twinkle's control channel: a lone process's until the process groups exist.
        self.channel = ControlChannel(1, 0)
        self.node = socket.gethostname()
        #: Every process's host name, by rank (from the start-up hand-shake: `agreement.py`).
        self.nodes: list[str] = [self.node]
        #: Every process's LOCAL_WORLD_SIZE, by rank (from the same hand-shake).
        self.local_worlds: list[int] = [1]
        #: Copy arguments and results as a real transport would (option `isolate`).
        self.isolate = True
        #: Seconds a call waits for the other processes (option `timeout`).
        self.timeout_s = DEFAULT_TIMEOUT_S
        #: Seconds the others wait at shutdown for the elected process's alerts.
        self.notify_wait = float(DEFAULT_OPTIONS["notify_wait"])
        #: The run's name, the same on every process (rank 0's).
        self.run_name = ""
        #: Whether `shutdown()` ran: the run's workers and process groups are gone.
        self.closed = False

    def node_of(self, rank: int) -> str | None:
        return self.nodes[rank] if 0 <= rank < len(self.nodes) else None

    def one_machine(self) -> bool:
        """Whether every process of the job runs on this machine: one host name, and (under
        torchrun) one launcher holding the whole world. Every process answers alike (from
        what the start-up hand-shake gathered)."""
        world = self.env.world_size
        return len(set(self.nodes)) == 1 and all(n == world for n in self.local_worlds)

"""Mode `local`: the driver script runs in every process of a torchrun job.

`torchrun --nproc_per_node=N train.py` starts N copies of the script; `initialize(mode='local')`
in each joins them. Every group is colocated on the torchrun world (a group of k workers lives on
ranks 0..k-1), each process holds at most one worker of each remote class, and the outcome of
every call is exchanged over a private gloo group so all processes collect the same value as the
Ray driver would. Without torchrun's variables the script runs as one process (world size 1).

`LocalBackend` is the `ExecutionBackend` core drives; it composes the parts of a run, each in
its own module: this process's view of the run (`session.py`), the checks and hand-shake of
start-up (`options.py`, `planning.py`, `agreement.py`), the process groups (`process_groups.py`),
the ordered exchanges (`exchange_queue.py`, `exchange.py`), the watchdog (`watchdog.py`), the
worker groups (`workers.py`, `construction.py`) and the alert election (`alert_election.py`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from twinkle_core import ConfigurationError, DeviceGroup, DeviceMesh, WorkerDiedError
from twinkle_core.plugin import (
    AcceleratorPlatform,
    ExecutionBackend,
    WorkerGroup,
    class_options,
    detect_platform,
    user_call_site,
)

from . import collective as local_collective
from . import tracing as local_tracing
from .agreement import agree
from .alert_election import AlertElection
from .construction import construct, placements, raise_construction, worker_context
from .env import TorchrunEnv
from .exchange import KIND_CONSTRUCT, CallInfo, Exchange
from .exchange_queue import ExchangeQueue
from .options import parse_options
from .peer_reports import leave_shutdown_note
from .planning import plan
from .process_groups import ProcessGroups
from .session import Session
from .signals import AlertFlushOnTerm
from .watchdog import Watchdog
from .workers import LocalWorkerGroup

log = logging.getLogger("twinkle")


class LocalBackend(ExecutionBackend):
    """Mode `local` (alias `torchrun`): one process per device, all running the driver script."""

    name = "local"

    def __init__(self) -> None:
        super().__init__()
        self.session = session = Session()
        self.platform: AcceleratorPlatform | None = None
        self.groups = ProcessGroups(session)
        self.watchdog = Watchdog(session)
        self.exchanges = ExchangeQueue(session, self.watchdog, self.groups)
        self.election = AlertElection(session)
        self._on_term: AlertFlushOnTerm | None = None

    # ----------------------------------------------------------------- start
    def initialize(self, config) -> None:
        super().initialize(config)
        session = self.session
        options = parse_options(config.backend_options)
        session.isolate = options["isolate"]
        session.notify_wait = options["notify_wait"]
        session.timeout_s = options["timeout"].total_seconds()
        session.env = env = TorchrunEnv.detect()
        if not env.launched:
            log.warning(
                "twinkle: mode 'local' outside torchrun runs this one process (world size 1); "
                "to run one process per device, launch the script with `torchrun "
                "--nproc_per_node=N %s`",
                os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "script.py",
            )
        self.platform = platform = detect_platform()
        plan(config, env, platform)
        try:
            if env.launched:
                self.groups.join(
                    platform, options["dist_backend"], options["dist_timeout"], options["timeout"]
                )
            elif platform.device_type != "cpu":
                platform.set_device(env.local_rank)
            agree(session, config)
            if options["node_sockets"] and session.one_machine():
                session.channel.use_node_sockets(session.timeout_s)
            local_tracing.start(session)  # a traced run: clock offsets to rank 0 (tracing.py)
            session.run_name = config.name
            if env.launched:
                self._on_term = AlertFlushOnTerm(self._flush_alerts, session.notify_wait)
                self._on_term.install()
            self.watchdog.start(self.exchanges.progress)
        except BaseException:
            self.shutdown()
            raise

    # ----------------------------------------------------------------- workers
    def create_workers(
        self,
        cls: type,
        group: DeviceGroup,
        device_mesh: DeviceMesh,
        args: tuple,
        kwargs: dict,
        *,
        num_workers: int,
    ) -> WorkerGroup:
        session = self.session
        env = session.env
        exchanges = self.exchanges
        if exchanges.broken is not None:
            raise WorkerDiedError(exchanges.broken_message())
        if not class_options(cls)["colocate"]:
            raise ConfigurationError(
                f"{cls.__name__}: @remote_class(colocate=False) asks for worker processes of "
                f"its own, but under torchrun every object of group {group.name!r} lives in "
                "the job's one process per rank (the processes are torchrun's, fixed at "
                "launch). Drop colocate=False to run under torchrun; keep it for mode 'ray', "
                "where it gives the object actors of its own"
            )
        if num_workers > env.world_size:
            raise ConfigurationError(
                f"{cls.__name__} needs {num_workers} workers on group {group.name!r} but the "
                f"torchrun world has {env.world_size} process(es)"
            )
        where = placements(session, group, num_workers)
        label = f"{cls.__name__}(remote_group={group.name!r})"
        site = str(user_call_site())
        instance, state, failure = None, None, None
        with exchanges.lock:
            exchanges.drain(None)
            if exchanges.broken is not None:
                raise WorkerDiedError(exchanges.broken_message())
            info = CallInfo(
                exchanges.next_sequence(),
                KIND_CONSTRUCT,
                label,
                site,
                num_workers,
                threading.current_thread().name,
            )
            if env.rank < num_workers:
                context = worker_context(session, group, device_mesh, num_workers)
                instance, state, failure = construct(
                    session, self.config, cls, args, kwargs, context
                )
            mine = None if failure is None else (env.rank, False, failure)
            exchange = Exchange(exchanges, info, list(range(num_workers)), mine)
            exchange.start()
            outcome = exchange.finish()
        raise_construction(outcome, label, failure)
        return LocalWorkerGroup(self, group, device_mesh, cls, num_workers, where, instance, state)

    def create_collective_group(self, group, workers) -> None:
        """Members are workers of this job's processes (worker r in process r); processes meet
        over a new subgroup made by every process in the same order (`collective.py`)."""
        for w in workers:
            if not isinstance(w, LocalWorkerGroup) or w.host is not self:
                raise ConfigurationError(
                    f"collective_group({group.name!r}): {w.class_name} does not belong to this run"
                )
        exchanges = self.exchanges
        with exchanges.lock:
            exchanges.drain(None)  # every process makes the subgroup at the same point of its calls
            if exchanges.broken is not None:
                raise WorkerDiedError(exchanges.broken_message())
            session = self.session
            link = local_collective.create(
                group, workers, session.env.rank, session.channel.distributed
            )
        if link is not None:
            self.groups.add_link(link)

    @property
    def owns_console(self) -> bool:
        """Only rank 0 draws the live status line: every process of the job is a driver
        writing to the same terminal. Read from the environment, as core asks before
        `initialize` has run."""
        try:
            return TorchrunEnv.detect().rank == 0
        except Exception:  # an inconsistent environment: initialize() will say so
            return False

    # ----------------------------------------------------------------- failures
    def claim_notification(self, key: str) -> bool:
        """One process of the whole job sends each alert: elected through the store."""
        return self.election.claim(key)

    def _flush_alerts(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until this process's queued alerts are sent."""
        return self.flush_alerts(timeout)

    # ----------------------------------------------------------------- stop
    @property
    def closed(self) -> bool:
        """Whether `shutdown()` ran: workers and process groups of this run are gone."""
        return self.session.closed

    def shutdown(self) -> None:
        session = self.session
        if session.closed:
            return
        try:
            self._finish_exchanges()
        finally:
            session.closed = True
            try:
                # Core's alert queue (set by core) bounds the others' wait for the sender.
                self.election.settle(self._flush_alerts, self.alerts)
            finally:
                self.watchdog.stop()
                if self._on_term is not None:
                    self._on_term.uninstall()
                self.groups.destroy()

    def _finish_exchanges(self) -> None:
        """Take part in the exchanges still open (another process may be collecting them), and
        tell the others through the store where this process stopped.

        Bounded: an exchange another process never reached is waited for at most
        min(timeout, notify_wait) seconds, and not at all when a wait for it already timed out.
        """
        session = self.session
        self.exchanges.finish_open(min(session.timeout_s, session.notify_wait))
        leave_shutdown_note(session.channel, session.env.rank, self.exchanges.sequence)

    def gather_trace(self, recorder: Any) -> None:
        """Every process's trace events to rank 0, which writes the trace (tracing.py)."""
        local_tracing.gather(recorder, self.session, self.exchanges.broken)

    def describe(self) -> dict[str, Any]:
        session = self.session
        out: dict[str, Any] = {
            "launched": "torchrun" if session.env.launched else "no (a single process)",
            "world": session.env.world_size,
            "rank": session.env.rank,
            "node": session.node,
        }
        if self.platform is not None:
            out["device"] = self.platform.device_type
        if session.channel.distributed:  # how each call's first exchange travels
            out["exchange"] = "unix-sockets" if session.channel.sockets is not None else "gloo"
        return out

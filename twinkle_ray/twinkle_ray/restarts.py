"""Restarting a device group's actors after one of them died (`DeviceGroup(max_restarts=N)`).

A death is noticed two ways: a call whose worker died (`RayWorkerGroup.on_failures`), or, for
a group that may restart, the `Watcher` (a liveness probe per actor every second, so a worker
killed while the group is idle is rebuilt before the next call). Either way `Restarter.died`
asks the group's health (`twinkle_core.plugin.GroupHealth`) what to do:

- tear down (no budget, or it is spent): the actors are killed and every hosted object fails
  its later calls with an error saying so, as groups without restarts always did;
- restart: the actors are killed at once (every call in flight fails with `WorkerDiedError`),
  and a thread rebuilds them on the same placement (`RayBackend.rebuild`): new processes, the
  same ranks, devices and environment, every hosted object's constructor replayed in slot
  order with its original arguments, then `on_restart(generation)` on every object that
  defines it. Only then does the group take calls again, as the next generation; calls made
  meanwhile wait for it (at most `start_timeout`). A restart that fails (a death during it
  included) spends another restart of the budget, or leaves the group dead.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray

from twinkle_core.plugin import RESTART, TEAR_DOWN

from .deaths import DEATH_ERRORS, how_it_died
from .hosts import Hosts

log = logging.getLogger("twinkle")

#: Seconds between two liveness probes of an actor of a group that may restart.
PING_SECONDS = 1.0


class Restarter:
    """Turns deaths into restarts or teardowns, for one backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.watcher = Watcher(self)
        #: Set by `close()` (the run shuts down): no restart begins or finishes after it.
        self.closed = False
        self._threads: list[threading.Thread] = []

    def close(self, timeout: float = 10.0) -> None:
        """Stop watching and restarting (before the run's actors and placement groups go):
        waits up to `timeout` s for restarts under way, which then give up."""
        self.closed = True
        self.watcher.stop()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout)

    def health(self, hosts: Hosts) -> Any:
        return self.backend.config.health.of(hosts.group)

    def died(self, hosts: Hosts, cause: str) -> None:
        """A worker of `hosts` died: tear down, or restart in the background. Safe to call
        from any thread, and again for the same death (only the first counts)."""
        with hosts.lock:
            if not hosts.alive or self.closed:
                return  # torn down already (a restart under way, or for good), or shut down
            health = self.health(hosts)
            decision = health.died(cause)
            if decision == RESTART:
                hosts.teardown(f"{cause}; twinkle is restarting the group")
                thread = threading.Thread(
                    target=self._restart,
                    args=(hosts, cause),
                    name=f"twinkle-restart-{hosts.group.name}",
                    daemon=True,
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                thread.start()
                return
            assert decision == TEAR_DOWN
            hosts.teardown(self._gone(health, cause))

    def _restart(self, hosts: Hosts, cause: str) -> None:
        health = self.health(hosts)
        decision = RESTART
        while decision == RESTART:
            if self.closed:
                return  # the run shut down: nothing to serve any more
            generation = health.generation + 1
            try:
                self.backend.rebuild(hosts, generation)
                if self.closed:
                    raise RuntimeError("the run shut down during the restart")
            except BaseException as exc:
                if self.closed:
                    hosts.teardown("the run shut down")
                    return
                text = str(exc).strip().splitlines()
                why = f"{type(exc).__name__}: {text[0][:300] if text else ''}"
                log.warning(
                    "twinkle: restarting group %r as generation %d failed: %s",
                    hosts.group.name,
                    generation,
                    why,
                )
                cause = f"{cause}; restart as generation {generation} failed ({why})"
                state = health.snapshot()
                if state.restarts >= state.max_restarts:
                    # This failure spends the budget: the final word goes up before the
                    # health says dead, so no call sees "dead" with "restarting" as its reason.
                    for member in hosts.members:
                        member.workers.torn_down = self._gone(health, cause)
                decision = health.restart_failed(cause)
                continue
            for member in hosts.members:
                member.workers.torn_down = None
            hosts.pings = {}
            health.restarted()  # the log line, the hook and the alert (core)
            return
        for member in hosts.members:
            member.workers.torn_down = self._gone(health, cause)

    @staticmethod
    def _gone(health: Any, cause: str) -> str:
        if health.max_restarts:
            return (
                f"{cause}; the group is torn down for good: its restarts are spent "
                f"({health.budget_text()})"
            )
        return cause


class Watcher:
    """Probes the actors of groups that may restart, so an idle death is noticed."""

    def __init__(self, restarter: Restarter) -> None:
        self.restarter = restarter
        self.watched: list[Hosts] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, hosts: Hosts) -> None:
        with self._lock:
            if hosts not in self.watched:
                self.watched.append(hosts)
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="twinkle-ray-watch", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self.watched = []
        self._stop.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(PING_SECONDS):
            with self._lock:
                watched = list(self.watched)
            for hosts in watched:
                try:
                    self._probe(hosts)
                except Exception as exc:  # the cluster is going away; the next round retries
                    log.debug("twinkle: probing group %r: %s", hosts.group.name, exc)

    def _probe(self, hosts: Hosts) -> None:
        if not hosts.alive or not ray.is_initialized():
            return
        handles = hosts.first.handles
        pings = hosts.pings
        for rank, handle in enumerate(handles):
            ref = pings.get(rank)
            if ref is None:
                pings[rank] = handle._tw_ping.remote()
                continue
            ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
            if not ready:
                continue  # busy with a call: it answers after it
            pings[rank] = None
            try:
                ray.get(ref, timeout=0)
            except DEATH_ERRORS as exc:
                node = hosts.first.node_of(rank) or "?"
                cause = (
                    f"worker rank {rank} of group {hosts.group.name!r} on node {node} "
                    f"{how_it_died(exc)} while idle ({type(exc).__name__})"
                )
                self.restarter.died(hosts, cause)
                return
            except Exception:
                pass

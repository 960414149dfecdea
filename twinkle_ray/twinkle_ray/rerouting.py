"""Replacing a group's relays after one of them died on its own (its node and workers live).

A relay (`relay.py`) is twinkle's, not the user's: its death must not cost the workers, their
state or the group's restart budget, where the direct path would not have failed at all. The
calls it was handing on fail with `CallLostError` (`pending.py` tells a relay's death from a
worker's by asking the GCS whether the worker is alive). Then, once per dead route, a thread:

1. holds the group's new calls (`Hosts.rerouting`; they wait at most the start timeout);
2. kills the old relays, so every call still in them fails the same way, instead of some
   running after the new relays' calls (Ray orders one caller's tasks, and the callers change);
3. waits until every worker has run what the old relays handed it (a liveness task of the
   driver's, which each worker runs after the tasks that reached it first); a worker found
   dead then is a death as any other (restart or teardown);
4. starts new relays on the same nodes and routes the calls through them; if they do not
   start, calls go straight to the workers for the rest of the run (correct, only dearer).

Lock order: `Hosts.lock`, then the actors' send lock.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray

from .deaths import DEATH_ERRORS
from .hosts import Hosts
from .relay import register, unregister
from .transports import forget_given

log = logging.getLogger("twinkle")


class Rerouter:
    """Turns a relay's death into new relays, for one backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.closed = False
        self._threads: list[threading.Thread] = []

    def close(self, timeout: float = 10.0) -> None:
        """Stop (the run shuts down): no replacement begins after this; waits up to `timeout`
        s for those under way."""
        self.closed = True
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout)

    def watch(self, hosts: Hosts, route: Any) -> None:
        """Replace `route` (the relays of `hosts`) as soon as one of its relays dies on its
        own, even while no call is in flight: the next call then waits for new relays instead
        of failing in a dead one."""
        route.watch(lambda ended: self._relay_ended(hosts, ended))

    def _relay_ended(self, hosts: Hosts, route: Any) -> None:
        """A relay of `route` ended (on Ray's thread: asking the GCS whether it died alone
        blocks, so a thread of ours asks). Killed by twinkle (a restart, a teardown, a
        replacement, the shutdown), the route is no longer `hosts`' and nothing happens."""
        if self.closed or not hosts.alive or hosts.route is not route:
            return
        threading.Thread(
            target=self._check, args=(hosts, route), name="twinkle-relay-ended", daemon=True
        ).start()

    def _check(self, hosts: Hosts, route: Any) -> None:
        try:
            alone = route.any_died_alone(hosts.first.handles)
        except Exception as exc:  # the cluster is going away
            log.debug("twinkle: looking at group %r's relays failed: %s", hosts.group.name, exc)
            return
        if alone:  # else its node is gone: the workers' death, found by their calls
            self.relay_died(hosts, route)

    def relay_died(self, hosts: Hosts, route: Any) -> None:
        """A relay of `route` (the relays of `hosts`) died on its own: replace the route in
        the background, once. Safe to call from any thread, again for the same death."""
        with hosts.lock:
            if self.closed or not hosts.alive or hosts.route is not route or hosts.rerouting:
                return  # replaced already (or being), restarted, torn down, or shut down
            hosts.rerouting = threading.Event()
        thread = threading.Thread(
            target=self._replace,
            args=(hosts, route),
            name=f"twinkle-reroute-{hosts.group.name}",
            daemon=True,
        )
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _replace(self, hosts: Hosts, old: Any) -> None:
        ready = hosts.rerouting
        try:
            self._reroute(hosts, old)
        except Exception as exc:  # the cluster is going away; calls then fail on their own
            log.warning("twinkle: replacing group %r's relays failed: %s", hosts.group.name, exc)
        finally:
            hosts.rerouting = None
            if ready is not None:
                ready.set()

    def _reroute(self, hosts: Hosts, old: Any) -> None:
        backend = self.backend
        first = hosts.first
        timeout = backend.options.start_timeout
        generation = first.restarts
        with first._send_lock:  # no call is being handed to the old relays right now
            unregister(first.handles)
            hosts.route = None
            for member in hosts.members:
                member.workers.route = None
        old.kill()
        forget_given(first.handles)  # refs the old relays owned: lost with them
        log.warning(
            "twinkle: a relay of group %r died on its own (its workers live): the calls it "
            "was handing on fail with CallLostError; starting new relays",
            hosts.group.name,
        )
        if not self._workers_caught_up(hosts, timeout):
            return
        with hosts.lock:
            if self.closed or not hosts.alive or first.restarts != generation:
                return
            hosts.reroutes += 1
            instance = f"{hosts.instance}.{generation}.r{hosts.reroutes}"
        route = backend._relays(first, hosts.slots, instance)
        if route is not None:
            try:
                ray.get([r._tw_ready.remote() for r in route.relays], timeout=timeout)
            except Exception as exc:
                route.kill()
                route = None
                log.warning(
                    "twinkle: group %r's new relays did not start (%s): its calls go straight "
                    "to the workers from now on",
                    hosts.group.name,
                    exc,
                )
        with hosts.lock:
            if self.closed or not hosts.alive or first.restarts != generation:
                if route is not None:
                    route.kill()
                return
            with first._send_lock:
                hosts.route = route
                for member in hosts.members:
                    member.workers.route = route
                if route is not None:
                    register(route, first.handles)
        if route is not None:
            self.watch(hosts, route)

    def _workers_caught_up(self, hosts: Hosts, timeout: float) -> bool:
        """Wait until every worker ran what reached it before now (one liveness task each).
        False when one died meanwhile: that death is handled as any other."""
        first = hosts.first
        pings = [handle._tw_ping.remote() for handle in first.handles]
        try:
            ray.get(pings, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            log.warning(
                "twinkle: group %r's workers did not answer within %gs after its relay died; "
                "new relays start anyway",
                hosts.group.name,
                timeout,
            )
        except DEATH_ERRORS:
            for rank, ping in enumerate(pings):
                try:
                    ray.get(ping, timeout=0)
                except DEATH_ERRORS as exc:
                    first.on_failures([first.failure(rank, exc)], first.restarts)
                    return False
                except Exception:
                    continue
        return True

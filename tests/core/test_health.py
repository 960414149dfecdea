"""The group health state machine (`twinkle_core.health`), without a cluster: every
transition, the restart budget, a death during a restart, and what the driver sees."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    group_state,
    initialize,
    remote_class,
    shutdown,
)
from twinkle_core.health import (
    DEAD,
    HEALTHY,
    RESTART,
    RESTARTING,
    TEAR_DOWN,
    GroupHealth,
    HealthBook,
)


def test_a_group_without_a_budget_dies_at_its_first_death():
    health = GroupHealth("g")
    assert health.died("rank 1 died") == TEAR_DOWN
    state = health.snapshot()
    assert (state.state, state.generation, state.restarts, state.last_cause) == (
        DEAD,
        0,
        0,
        "rank 1 died",
    )
    assert health.died("again") == TEAR_DOWN and health.snapshot().last_cause == "rank 1 died"


def test_restart_then_serve_the_next_generation_and_tell_once():
    told = []
    health = GroupHealth("g", 2, lambda *a: told.append(a))
    assert health.died("rank 0 died") == RESTART
    assert health.state == RESTARTING and not health.serving.is_set()
    assert health.died("rank 1 died too") == TEAR_DOWN  # the restart already under way goes on
    assert health.restarted() == 1
    assert health.state == HEALTHY and health.serving.is_set()
    assert told == [("g", 1, "rank 0 died")]
    state = health.snapshot()
    assert (state.generation, state.restarts, state.restarts_left) == (1, 1, 1)


def test_a_death_during_the_restart_spends_budget_and_ends_dead_when_spent():
    told = []
    health = GroupHealth("g", 2, lambda *a: told.append(a))
    assert health.died("killed") == RESTART
    assert health.restart_failed("killed during the replay") == RESTART  # second of two
    assert health.restart_failed("killed again") == TEAR_DOWN
    state = health.snapshot()
    assert (state.state, state.restarts, state.generation) == (DEAD, 2, 0)
    assert state.last_cause == "killed again" and told == []
    assert health.serving.is_set()  # nobody is left waiting for a dead group


def test_transitions_that_make_no_sense_are_errors():
    health = GroupHealth("g", 1)
    with pytest.raises(RuntimeError, match="no restart in progress"):
        health.restarted()
    with pytest.raises(RuntimeError, match="no restart in progress"):
        health.restart_failed("x")


@given(st.integers(0, 5), st.lists(st.sampled_from(["die", "fail"]), max_size=12))
def test_the_budget_is_never_exceeded(budget, events):
    health = GroupHealth("g", budget)
    restarts_done = 0
    for event in events:
        state = health.state
        if state == DEAD:
            break
        if state == HEALTHY:
            health.died(event)
        elif event == "fail":
            health.restart_failed(event)
        else:
            health.restarted()
            restarts_done += 1
    snap = health.snapshot()
    assert snap.restarts <= budget and snap.generation == restarts_done <= snap.restarts
    assert (snap.state == DEAD) == (snap.restarts == budget and health.state == DEAD)


def test_the_book_makes_one_health_per_group_with_its_budget():
    book = HealthBook()
    group = DeviceGroup("g", 2, max_restarts=3)
    assert book.of(group) is book.of(group) and book.of(group).max_restarts == 3
    seen = []
    book.on_restarted = lambda *a: seen.append(a)  # set after the health exists (the runtime)
    book.of(group).died("x")
    book.of(group).restarted()
    assert seen == [("g", 1, "x")]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_max_restarts_is_checked(bad):
    with pytest.raises(ConfigurationError, match="max_restarts must be an integer >= 0"):
        DeviceGroup("g", 2, max_restarts=bad)


@remote_class()
class Plain:
    pass


def test_group_state_of_an_object_or_a_name_in_process():
    initialize("inprocess", groups=[DeviceGroup("g", 2, max_restarts=1)])
    try:
        obj = Plain(remote_group="g")
        assert group_state(obj) == group_state("g")
        assert (group_state(obj).state, group_state(obj).max_restarts) == (HEALTHY, 1)
        with pytest.raises(ConfigurationError, match="no group of that name"):
            group_state("nope")
        with pytest.raises(ConfigurationError, match="takes a remote object or a group name"):
            group_state(42)
    finally:
        shutdown()


def test_the_state_is_read_consistently_while_another_thread_restarts():
    health = GroupHealth("g", 100)
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            s = health.snapshot()
            if s.generation > s.restarts:
                bad.append(s)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(100):
        health.died("x")
        health.restarted()
    stop.set()
    thread.join()
    assert bad == [] and health.snapshot().generation == 100


def test_every_transition_is_told_to_the_book_listeners_once_with_the_new_state():
    book = HealthBook()
    told = []
    book.listen(told.append)
    book.listen(lambda state: 1 / 0)  # a broken listener is logged, never passed on
    health = book.of(DeviceGroup("g", 2, max_restarts=2))
    assert health.died("rank 0 died") == RESTART
    assert health.died("rank 1 died too") == TEAR_DOWN  # no transition: not told
    assert health.restart_failed("killed during the replay") == RESTART
    assert health.restarted() == 1
    assert health.died("again") == TEAR_DOWN  # the budget is spent
    assert health.died("after the end") == TEAR_DOWN  # dead stays dead: not told
    assert [(s.state, s.generation, s.restarts, s.last_cause) for s in told] == [
        (RESTARTING, 0, 1, "rank 0 died"),
        (RESTARTING, 0, 2, "killed during the replay"),
        (HEALTHY, 1, 2, "killed during the replay"),
        (DEAD, 1, 2, "again"),
    ]
    assert [(s.group, s.state) for s in book.states()] == [("g", DEAD)]

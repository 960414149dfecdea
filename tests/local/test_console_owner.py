"""Under torchrun every process is a driver writing to one terminal: only rank 0 draws the
live status line (core's `ExecutionBackend.owns_console`, asked before `initialize`)."""

from __future__ import annotations

import pytest

from twinkle_local.backend import LocalBackend

TORCHRUN = {"LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}


@pytest.mark.parametrize(("rank", "owns"), [("0", True), ("1", False)])
def test_only_rank_0_owns_the_console(monkeypatch, rank, owns):
    for name, value in {**TORCHRUN, "WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": rank}.items():
        monkeypatch.setenv(name, value)
    assert LocalBackend().owns_console is owns


def test_a_lone_process_owns_the_console(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert LocalBackend().owns_console is True


def test_an_inconsistent_environment_draws_nothing(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # RANK missing: initialize() names the problem
    monkeypatch.delenv("RANK", raising=False)
    assert LocalBackend().owns_console is False

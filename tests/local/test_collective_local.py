"""Collective groups under a real `torchrun --nproc_per_node=4` job (gloo on CPU)."""

from __future__ import annotations

import json

import pytest
from _support import prestart

from .conftest import run_job

pytestmark = pytest.mark.slow


@prestart.fixture
def ranks(tmp_path_factory):
    job = run_job("collective_job.py", tmp_path_factory.mktemp("collective"), nproc=4)
    assert job.returncode == 0, job.output[-6000:]
    return [json.loads((job.out_dir / f"rank{r}.json").read_text()) for r in range(4)]


def test_every_process_collects_the_same_values(ranks):
    for r in range(1, 4):
        assert {k: v for k, v in ranks[r].items()} == ranks[0], r


def test_weight_sync_from_the_policy_reaches_the_sampler(ranks):
    out = ranks[0]
    assert out["sync"] == [4, [2, 3]]
    first = [100.0, 101.0, 102.0, 103.0]
    # members: policy 0, policy 1, sampler 0, sampler 1; they share processes 0 and 1, so
    # there is no process group of their own
    assert out["policy_from_0"] == [[0, 4, False, first], [1, 4, False, first]]
    assert out["sampler_from_0"] == [[2, 4, False, first], [3, 4, False, first]]
    # from policy rank 1 (process 1): process 0's first member receives over the subgroup
    second = [110.0, 111.0, 112.0, 113.0]
    assert out["policy_from_1"] == [[0, 4, False, second], [1, 4, False, second]]
    assert out["sampler_from_1"] == [[2, 4, False, second], [3, 4, False, second]]


def test_a_source_in_another_process_and_object(ranks):
    out = ranks[0]
    source = [1020.0, 1021.0, 1022.0, 1023.0]  # wide's worker 2 (member 4, process 2)
    assert [row[3] for row in out["mixed_sampler"]] == [source] * 2
    assert [row[3] for row in out["mixed_wide"]] == [source] * 4
    assert [row[:2] for row in out["mixed_wide"]] == [[2, 6], [3, 6], [4, 6], [5, 6]]
    # the sampler's call first would leave processes 2 and 3 out: refused, nothing hangs
    assert "Holder (group 'sampler') reached broadcast #1 first" in out["mixed_refused"]
    assert "no worker in 2 of the group's 4 processes" in out["mixed_refused"]
    assert "(Holder (group 'wide'))" in out["mixed_refused"]


def test_collectives_needing_everyone_are_refused_where_members_share_a_process(ranks):
    assert "all_reduce needs every member at once" in ranks[0]["refused"]
    assert "mode 'local'" in ranks[0]["refused"]


def test_one_member_per_process_gets_a_real_process_group(ranks):
    out = ranks[0]
    assert out["wide_reduce"] == [[[10.0, 10.0], [2.5, 2.5], [0.0, 1.0, 2.0, 3.0]]] * 4
    assert out["wide_raw"] == [[5.0, 5.0]] * 4
    assert out["own_world"] == [4.0] * 4  # the job's own world is untouched


def test_names_are_unique_and_groups_end_with_the_run(ranks):
    assert "named 'sync' already exists" in ranks[0]["twice"]
    assert all(r["destroyed"] is False for r in ranks)


@pytest.mark.usefixtures("single_process")
def test_a_one_process_job_holds_every_member():
    """Without torchrun the world is this process: members meet in it, torch is not needed."""
    import torch

    from twinkle_core import (
        ConfigurationError,
        DeviceGroup,
        collective,
        collective_group,
        initialize,
        remote_class,
        remote_function,
        shutdown,
    )

    @remote_class()
    class Holder:
        def __init__(self, value: float) -> None:
            self.w = torch.full((3,), value)

        @remote_function(dispatch="all", collect="flatten")
        def bcast(self) -> list:
            c = collective("sync")
            c.broadcast(self.w, src=0)
            return [(c.rank, c.world_size, c.process_group, self.w.tolist())]

        @remote_function(dispatch="all", collect="none")
        def reduce(self) -> None:
            collective("sync").all_reduce(self.w)

    initialize("local", groups=[DeviceGroup("a", 1), DeviceGroup("b", 1)])
    try:
        a, b = Holder(5.0, remote_group="a"), Holder(0.0, remote_group="b")
        collective_group("sync", [a, b])
        assert a.bcast()() == [(0, 2, None, [5.0] * 3)]
        assert b.bcast()() == [(1, 2, None, [5.0] * 3)]
        with pytest.raises(ConfigurationError, match="needs every member at once"):
            b.reduce()()
    finally:
        shutdown()

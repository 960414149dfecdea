"""Transports under torchrun (issue 11, item 3): large tensor results broadcast as raw tensors.

One real `torchrun --standalone --nproc_per_node=2` job on CPU/gloo (`jobs/transport_job.py`)
runs every call first in mode 'inprocess' (the reference) and then in mode 'local', counting
every torch.distributed collective. A `transport='gloo'` result must equal the in-process value
bit for bit for every built-in collector and structure, travel as broadcasts of exactly the
tensor bytes of the results the collector uses (`first`: rank 0's only) after the one slot
all-gather, and never as an all-gather of its pickled bytes. `auto` moves a 2 MiB CPU tensor
the same way and leaves a small one in the exchange; `object_store` keeps today's path. A numpy
result under `gloo` falls back with one log line; an unknown name fails on every process; a
failing producer or diverging calls raise on every process with nothing broadcast.
"""

from __future__ import annotations

import json

import pytest
from _support import prestart

from .conftest import run_job

pytestmark = pytest.mark.slow

SCRIPT = "transport_job.py"
GATHERS = ("socket_gather", "_allgather_base", "all_gather_single", "allgather")
SLOT_BYTES = 512  # the exchange's slot all-gather: 2 processes x 256 bytes
#: The slot gather of a job on one machine: over Unix sockets, not gloo (node_sockets.py).
SLOT_GATHER = ["socket_gather", SLOT_BYTES]


@prestart.fixture
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("transport")
    job = run_job(SCRIPT, out, timeout=180)
    assert job.returncode == 0, job.output[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _broadcast_bytes(seen: list) -> int:
    return sum(n for name, n in seen if name == "broadcast")


def _assert_handed_over(seen: list, used: int) -> None:
    """One slot all-gather, then broadcasts of exactly the used tensors' bytes (envelopes that
    do not fit the slot add a few hundred bytes), and no all-gather of the payload."""
    assert seen[0] == SLOT_GATHER, seen
    big_gathers = [c for c in seen if c[0] in GATHERS and c[1] > SLOT_BYTES]
    assert not big_gathers, seen
    tensors = sum(n for name, n in seen if name == "broadcast" and n >= 4096)
    assert tensors == used, (tensors, used, seen)
    assert _broadcast_bytes(seen) - tensors < 4096, seen
    assert {name for name, _ in seen} <= {"socket_gather", "broadcast"}, seen


@pytest.mark.parametrize("rank", [0, 1])
def test_every_collector_and_structure_equals_inprocess(reports, rank):
    cases = reports[rank]["cases"]
    assert len(cases) == 21
    wrong = [name for name, case in cases.items() if not case["same"]]
    assert not wrong, wrong


@pytest.mark.parametrize("rank", [0, 1])
def test_held_results_are_broadcast_not_gathered(reports, rank):
    for name, case in reports[rank]["cases"].items():
        try:
            _assert_handed_over(case["seen"], case["used_bytes"])
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


@pytest.mark.parametrize("rank", [0, 1])
def test_only_the_used_results_travel(reports, rank):
    cases = reports[rank]["cases"]
    # 'first' of two workers (dp=2) and 'last_pp' (pp=2): one result; 'none': both.
    assert cases["first/tensor"]["used_bytes"] * 2 == cases["none/tensor"]["used_bytes"]
    assert _broadcast_bytes(cases["first/tensor"]["seen"]) == 512 * 1024
    assert _broadcast_bytes(cases["last_pp/tensor"]["seen"]) == 512 * 1024
    assert _broadcast_bytes(cases["none/tensor"]["seen"]) == 2 * 512 * 1024


@pytest.mark.parametrize("rank", [0, 1])
def test_weight_handoff_moves_rank0s_tensors_once(reports, rank):
    handoff = reports[rank]["handoff"]
    assert handoff["value"] == handoff["expected"]
    producer_call = handoff["seen"][:-1]  # the consumer's call is one slot gather (a float)
    _assert_handed_over(producer_call, handoff["used_bytes"])
    assert handoff["seen"][-1] == SLOT_GATHER
    assert handoff["later_same"] and handoff["after_writes"]
    assert handoff["later_is_a_copy"] and handoff["writable_is_a_copy"]


@pytest.mark.parametrize("rank", [0, 1])
def test_auto_moves_large_cpu_tensors_and_leaves_small_ones(reports, rank):
    report = reports[rank]
    assert report["big_auto"]["same"] and report["big_store"]["same"]
    assert report["small_auto"]["same"]
    _assert_handed_over(report["big_auto"]["seen"], 2 * 1024 * 1024)
    # object_store: today's path, the pickled payload all-gathered, nothing broadcast.
    store = report["big_store"]["seen"]
    assert _broadcast_bytes(store) == 0 and store[1][0] in GATHERS, store
    assert store[1][1] > 2 * 2 * 1024 * 1024, store
    small = report["small_auto"]["seen"]
    assert _broadcast_bytes(small) == 0, small


@pytest.mark.parametrize("rank", [0, 1])
def test_a_sum_of_held_and_unheld_results_equals_inprocess(reports, rank):
    mixed = reports[rank]["mixed_sum"]
    assert mixed["same"], mixed
    # Rank 0's tensor broadcast; rank 1's (it requires grad) gathered as an object.
    assert _broadcast_bytes(mixed["seen"]) == 512 * 1024, mixed["seen"]
    assert any(name in GATHERS and n > SLOT_BYTES for name, n in mixed["seen"]), mixed["seen"]


@pytest.mark.parametrize("rank", [0, 1])
def test_received_tensors_are_writable_copies(reports, rank):
    assert reports[rank]["writable"] == {"changed": True, "again_same": True}


@pytest.mark.parametrize("rank", [0, 1])
def test_a_result_gloo_cannot_carry_falls_back_with_one_line(reports, rank):
    fallback = reports[rank]["fallback"]
    assert fallback["same"]
    assert len(fallback["lines"]) == 1, fallback["lines"]
    line = fallback["lines"][0]
    assert "transport 'gloo' moves torch tensors" in line and "using the object store" in line


@pytest.mark.parametrize("rank", [0, 1])
def test_an_unknown_transport_name_fails_on_every_process(reports, rank):
    kind, message = reports[rank]["unknown"]
    assert kind == "ConfigurationError"
    assert "no transport named 'no_such_transport'" in message and "'gloo'" in message


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("failing", ["0", "1"])
def test_a_failing_producer_raises_everywhere_without_a_broadcast(reports, rank, failing):
    failure = reports[rank]["failure"][failing]
    kind, message = failure["caught"]
    assert kind == "ValueError" and message.endswith(f"no weights on rank {failing}"), message
    assert _broadcast_bytes(failure["seen"]) == 0, failure["seen"]
    assert failure["seconds"] < 30, failure  # bounded: nobody waits in a broadcast
    assert reports[rank]["failure"]["after"] is True


@pytest.mark.parametrize("rank", [0, 1])
def test_diverging_held_calls_raise_everywhere_without_a_broadcast(reports, rank):
    diverged = reports[rank]["diverged"]
    kind, message = diverged["error"]
    assert kind == "TwinkleError" and "diverged" in message, message
    assert _broadcast_bytes(diverged["seen"]) == 0, diverged["seen"]
    assert diverged["after"] is True

"""The success path of a call under torchrun: one collective, and the slow path only on trouble.

Real `torchrun --standalone --nproc_per_node=2` jobs on CPU/gloo (`jobs/collect_fast_job.py`)
count every collective each call runs (the methods of torch's `ProcessGroup`, and the slot
gathers over Unix sockets). A `mean` of a python float and a `collect='none'` call must each cost
one collective (the slot all-gather of `twinkle_local/exchange.py`) and give exactly the
collector's `(r0 + r1) / 2`; a failure or diverging calls take the slow path and are reported as
before (the failure with the caller's line, divergence as an error on every rank, never a mixed
value). Each check runs twice: with the slot gathers over Unix sockets (the default on one
machine) and over gloo (`node_sockets=False`, the path of a job across machines).
"""

from __future__ import annotations

import json

import pytest
from _support import prestart

from .conftest import JOBS, run_job

pytestmark = pytest.mark.slow

SCRIPT = "collect_fast_job.py"


def _line_of(marker: str) -> int:
    lines = (JOBS / SCRIPT).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


#: The one collective of a successful call on each path: the slot gather (2 x 256 bytes).
SLOT_GATHER = {"sockets": ["socket_gather", 512], "gloo": ["_allgather_base", 512]}


@prestart.fixture(params=["sockets", "gloo"])
def reports(tmp_path_factory, param):
    out = tmp_path_factory.mktemp(f"collect_fast_{param}")
    job = run_job(SCRIPT, out, param)
    assert job.returncode == 0, job.output[-6000:]
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["control"] for r in got] == [param, param]
    shown = {"sockets": "exchange unix-sockets", "gloo": "exchange gloo"}[param]
    assert all(shown in r["placement"] for r in got), got[0]["placement"]
    for report in got:
        report["slot_gather"] = SLOT_GATHER[param]
    return got


@pytest.mark.parametrize("rank", [0, 1])
def test_mean_of_a_float_is_one_collective(reports, rank):
    value, seen = reports[rank]["first"]
    # The first also sends the structure: all_gather_object (sizes, then data) after the slot.
    assert value == 1.0 and len(seen) <= 3, seen
    assert seen[0] == reports[rank]["slot_gather"], seen
    for value, seen in reports[rank]["counts"]:
        assert value == (0.5 + 1.5) / 2
        assert seen == [reports[rank]["slot_gather"]], seen  # no second step


@pytest.mark.parametrize("rank", [0, 1])
def test_a_gathering_call_is_one_collective(reports, rank):
    for seen in reports[rank]["none_counts"]:
        assert seen == [reports[rank]["slot_gather"]], seen


@pytest.mark.parametrize("rank", [0, 1])
def test_a_result_too_big_for_the_slot_follows_it_over_the_sockets(reports, rank):
    """About 2 KB per rank: over the sockets it travels in the slot's own message (one
    collective); over gloo it takes a second one (an all-gather of its bytes)."""
    slot = reports[rank]["slot_gather"]
    for value, seen in reports[rank]["medium"]:
        assert value == [[0] * 1000, [1] * 1000]
        if slot[0] == "socket_gather":
            assert seen == [slot], seen
        else:
            # the second: an all-gather of both payloads' bytes (2 x about 2 KB)
            assert seen[0] == slot and len(seen) == 2 and seen[1][1] > 2 * 2000, seen


@pytest.mark.parametrize("rank", [0, 1])
def test_sums_and_means_equal_the_collector_bit_for_bit(reports, rank):
    values = reports[rank]["values"]
    for case, got in values.items():
        assert got["mean"] == got["expected_mean"], (case, got)
        if "sum" in got:
            assert got["sum"] == got["expected_sum"], (case, got)
    # Floats whose structure every process already knows: one collective.
    for case in ("tenths", "big_small", "negative_zero", "zero_and_negative_zero", "nan", "solo"):
        assert len(values[case]["mean_collectives"]) == 1, case
    assert values["negative_zero"]["mean"] == ["float", "-0.0"]
    assert values["solo_negative_zero"]["mean"] == ["float", "-0.0"]
    assert values["nan"]["mean"] == ["float", "nan"]
    assert values["ints"]["sum"] == ["int", "3"]
    assert values["numpy"]["mean"][0] == "float64"


@pytest.mark.parametrize("rank", [0, 1])
def test_a_failure_on_one_rank_reaches_every_caller(reports, rank):
    failure = reports[rank]["failure"]
    script = str(JOBS / SCRIPT)
    line = _line_of("CALL-FAIL")
    assert failure["caught"] is not None, failure
    kind, message, notes = failure["caught"]
    assert kind == "ValueError"
    assert message == f"[twinkle driver caller: {script}:{line}] bad batch on rank 1"
    assert "twinkle: Worker.fails_on failed in group 'g' on rank 1" in "\n".join(notes)
    assert failure["after"] == 1.0  # the run goes on


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("case", ["method", "site", "kind"])
def test_diverging_calls_raise_on_every_rank_instead_of_mixing(reports, rank, case):
    result = reports[rank]["diverged"][case]
    assert "error" in result, result  # a value here would mix two different calls
    kind, message = result["error"]
    assert kind == "TwinkleError" and "diverged" in message, message
    if case == "site":
        script = str(JOBS / SCRIPT)
        for marker in ("DIVERGE-SITE-0", "DIVERGE-SITE-1"):
            assert f"{script}:{_line_of(marker)}" in message, message
    assert result["after"] == 1.0  # aligned calls work again

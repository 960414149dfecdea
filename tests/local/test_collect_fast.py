"""The quick path of `sum`/`mean` under torchrun: one small all-reduce when all went well.

One real `torchrun --standalone --nproc_per_node=2` job on CPU/gloo (`jobs/collect_fast_job.py`)
counts every collective each call runs (the methods of torch's `ProcessGroup`). A `mean` of a
python float must cost one all-reduce of two float64 numbers (the value and the call's check)
and give exactly the collector's `(r0 + r1) / 2`; a failure or diverging calls take the slow
path and are reported as before (the failure with the caller's line, divergence as an error on
every rank, never a mixed value).
"""

from __future__ import annotations

import json

import pytest

from .conftest import JOBS, run_job

pytestmark = pytest.mark.slow

SCRIPT = "collect_fast_job.py"


def _line_of(marker: str) -> int:
    lines = (JOBS / SCRIPT).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("collect_fast")
    job = run_job(SCRIPT, out)
    assert job.returncode == 0, job.output[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("rank", [0, 1])
def test_mean_of_a_float_is_one_all_reduce_of_two_numbers(reports, rank):
    for value, seen in reports[rank]["counts"]:
        assert value == (0.5 + 1.5) / 2
        assert seen == [["allreduce", 16]], seen  # one collective, 16 bytes: no second step


@pytest.mark.parametrize("rank", [0, 1])
def test_gathering_calls_stay_bounded(reports, rank):
    for seen in reports[rank]["none_counts"]:
        assert 1 <= len(seen) <= 2, seen


@pytest.mark.parametrize("rank", [0, 1])
def test_sums_and_means_equal_the_collector_bit_for_bit(reports, rank):
    values = reports[rank]["values"]
    for case, got in values.items():
        assert got["mean"] == got["expected_mean"], (case, got)
        if "sum" in got:
            assert got["sum"] == got["expected_sum"], (case, got)
    # A float on every rank that counts: the quick path (one collective).
    for case in ("tenths", "big_small", "negative_zero", "zero_and_negative_zero", "solo"):
        assert values[case]["mean_collectives"] == [["allreduce", 16]], case
    assert values["negative_zero"]["mean"] == ["float", "-0.0"]
    assert values["solo_negative_zero"]["mean"] == ["float", "-0.0"]
    # Not one finite python float everywhere: the slow path, same values as before.
    for case in ("nan", "inf", "ints", "float_and_int", "numpy"):
        assert len(values[case]["mean_collectives"]) >= 2, case
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

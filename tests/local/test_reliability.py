"""The control plane under torchrun: one collective per call, timeouts that hold on every rank,
calls checked across ranks by call site, driver threads, and objects used after shutdown.

One real 2-process job (`jobs/reliability_job.py`) runs every section; the tests read what each
rank wrote.
"""

from __future__ import annotations

import json

import pytest
from _support import prestart

from .conftest import JOBS, run_job

pytestmark = pytest.mark.slow
SCRIPT = str(JOBS / "reliability_job.py")


def _site(marker: str) -> str:
    lines = (JOBS / "reliability_job.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if marker in text)
    return f"{SCRIPT}:{line}"


class Ranks(list):
    """Each rank's results; a section that raised fails the tests that read it."""

    def section(self, rank: int, name: str) -> dict:
        result = self[rank].get(name)
        assert result is not None, f"rank {rank} never reached section {name!r}"
        assert "error" not in result, f"rank {rank}, section {name!r}: {result['error']}"
        return result


@prestart.fixture
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("reliability")
    return run_job("reliability_job.py", out, timeout=300)


@pytest.fixture(scope="module")
def ranks(job):
    files = [job.out_dir / f"rank{r}.json" for r in (0, 1)]
    return Ranks(json.loads(f.read_text()) if f.exists() else {} for f in files)


def test_the_job_ends_cleanly(job):
    assert job.returncode == 0, job.output[-6000:]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_successful_call_is_one_collective_and_copies_no_generator_state(ranks, rank):
    """collect='mean' of a scalar (or of a dict) and collect='none' each cost one collective;
    no python/numpy generator state is copied when the method draws from neither."""
    counts = ranks.section(rank, "collectives")
    for case in ("mean", "none", "dict_mean", "torch_draws"):
        assert counts[case] == {"collective": 1.0}, (case, counts[case])
    # A result too large for the slot follows it in the same message over the Unix sockets
    # of a one-machine job (up to 64 KiB); a larger one in a second collective.
    assert counts["big"] == {"collective": 1.0}
    assert counts["huge"] == {"collective": 2.0}
    assert counts["values"] == [0.5, {"loss": 1.0, "tokens": 7.0}, [None, None]]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_method_timeout_raises_on_every_rank_with_the_hung_stack(ranks, rank):
    """@remote_function(timeout=3) while rank 1 sleeps 300 s: every rank raises
    CallTimeoutError within seconds, naming where rank 1 was; the run goes on."""
    result = ranks.section(rank, "timeouts")
    kind, message = result["method"]
    assert kind == "CallTimeoutError", message
    assert message.startswith("[twinkle driver caller: "), message
    assert "Worker.hang_on_rank1" in message
    assert "time.sleep(300)  # SITE-HANG" in message  # rank 1's stack, on every rank
    assert result["method_took"] < 60  # not the 300 s sleep, nor the run's 120 s timeout
    assert result["after_method"] == [0, 1]


def test_a_lazy_collect_timeout_bounds_the_wait(ranks):
    """lazy(timeout=2) on rank 0 while rank 1 still runs the method (6 s): CallTimeoutError
    with rank 1's stack; collecting again later gives the value. Rank 1, done, gets it too."""
    waited = ranks.section(0, "timeouts")
    kind, message = waited["lazy"]
    assert kind == "CallTimeoutError", message
    assert "did not finish within 2s" in message
    assert "time.sleep(seconds)  # SITE-SLOW" in message
    assert waited["lazy_took"] < 5.9  # before rank 1's 6 s method ended
    assert waited["lazy_again"] == [0, 1] and waited["after_lazy"] == [0, 1]
    assert ranks.section(1, "timeouts")["lazy"] == ["value", [0, 1]]


@pytest.mark.parametrize("rank", [0, 1])
def test_diverging_calls_name_both_call_sites_on_every_rank(ranks, rank):
    result = ranks.section(rank, "divergence")
    kind, message = result["sites"]  # the same method from two lines
    assert kind == "TwinkleError" and "diverged" in message, message
    assert _site("SITE-C1-A") in message and _site("SITE-C1-B") in message
    kind, message = result["extra"]  # an extra call on rank 0
    assert kind == "TwinkleError", message
    assert _site("SITE-C2-EXTRA") in message and _site("SITE-C2-NEXT") in message
    assert "process 0: call" in message and "process 1: call" in message
    assert result["after"] == [0, 1]  # the processes are still in step


@pytest.mark.parametrize("rank", [0, 1])
def test_a_keyboard_interrupt_on_one_rank_fails_that_call_everywhere_and_keeps_step(ranks, rank):
    result = ranks.section(rank, "interrupted")
    kind, message = result["call"]
    assert kind == "WorkerExitError", message
    assert "interrupt_on_rank1 raised KeyboardInterrupt('stop here') on worker rank 1" in message
    assert result["next"] == [[[0, 5], [1, 5]], [0, 1]]  # the processes are still in step


@pytest.mark.parametrize("rank", [0, 1])
def test_threads_calling_one_line_with_different_arguments_never_get_anothers_results(ranks, rank):
    """The processes interleave the threads' calls differently: each call's arguments are
    part of its key, so a mispairing is a divergence error, never a silent wrong result."""
    counts = ranks.section(rank, "threads_distinct")
    assert counts["wrong"] == 0, counts
    assert counts["ok"] + counts["diverged"] == 40, counts


@pytest.mark.parametrize("rank", [0, 1])
def test_driver_threads_calling_one_group_get_the_single_threaded_streams(ranks, rank):
    """Core's in-process test under torchrun: 8 threads x 25 calls give, as a set, what one
    thread making 200 calls gets; the driver's generators are untouched."""
    result = ranks.section(rank, "threads")
    assert result["untouched"] is True
    assert result["distinct"] == 200
    assert result["concurrent"] == result["serial"]
    assert result["serial"] == ranks.section(0, "threads")["serial"]  # every rank holds the same


@pytest.mark.parametrize("rank", [0, 1])
def test_after_shutdown_calls_raise_and_made_calls_are_kept(ranks, rank):
    after = ranks.section(rank, "shutdown")
    assert after["pending"] == [0, 1]  # made before shutdown, collected after it
    kind, message = after["call"]
    assert kind == "NotInitializedError"
    assert message.startswith("Worker.ok: this object belongs to run ")
    assert "which was shut down" in message

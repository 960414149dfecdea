"""The conformance kit against mode 'local' under real torchrun jobs (CPU, gloo).

`python -m twinkle_core.testing --mode local --launcher "<torchrun>"` re-runs the kit on every
rank and agrees their outcomes. Two ranks run every check but the dp=2 x tp=2 ones, which the kit
reports as not applicable (never as passed); a four-rank job runs those.
"""

from __future__ import annotations

import os
import sys

import pytest
from _support import prestart

from twinkle_core.testing import conformance_checks, run_kit

from .conftest import TORCHRUN_VARS

pytestmark = pytest.mark.slow

FOUR_RANK_CHECKS = ["mesh_accessors", "mesh_dp2_tp2_reductions", "mesh_dp2_tp2_slice_dp"]


def _torchrun(nproc: int) -> str:
    return f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node={nproc}"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.pop("TWINKLE_MODE", None)
    return env


# Both kit runs start in the background at the session's start (tests/_support/prestart.py).


@prestart.fixture
def two_ranks(tmp_path_factory):
    return run_kit(
        "local",
        launcher=_torchrun(2),
        options={"timeout": 120},  # twinkle's exchanges: fail, never hang, if a rank is lost
        # not the repository root, whose source folders would shadow packages
        cwd=tmp_path_factory.mktemp("kit2"),
        env=_env(),
        timeout=600,
    )


@prestart.fixture
def four_ranks(tmp_path_factory):
    return run_kit(
        "local",
        launcher=_torchrun(4),
        options={"timeout": 120},
        select=["mesh_dp2_tp2", "mesh_accessors"],
        cwd=tmp_path_factory.mktemp("kit4"),
        env=_env(),
        timeout=300,
    )


@pytest.mark.timeout(700)
def test_two_ranks_pass_every_check_that_fits(two_ranks):
    run = two_ranks
    assert run.returncode == 0, run.output
    assert run.passed >= 20 and run.failed == 0 and run.errors == 0, run.output
    assert sorted(run.not_applicable_checks) == FOUR_RANK_CHECKS, run.output
    assert run.passed + run.not_applicable == len(conformance_checks())
    assert f"{run.passed} passed, 0 failed, 3 not applicable" in run.output.splitlines()


@pytest.mark.timeout(700)
def test_four_ranks_run_the_dp2_tp2_checks(four_ranks):
    run = four_ranks
    assert run.returncode == 0, run.output
    assert "3 passed, 0 failed" in run.output.splitlines(), run.output

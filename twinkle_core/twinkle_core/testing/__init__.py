"""The conformance kit for backend authors: the same checks in every mode, with the expected
values written down in the kit (never taken from another backend's run).

From a shell (an SPMD backend through its launcher; see docs/plugins.md)::

    python -m twinkle_core.testing --mode inprocess
    python -m twinkle_core.testing --mode ray --option address=127.0.0.1:6379
    python -m twinkle_core.testing --mode local \
        --launcher "torchrun --standalone --nproc_per_node=2"

From a plugin's own tests: subclass `BackendConformance`, or use `conformance_checks()` and
`run_check()` with your own parametrization, or `run_kit()` to run the command above and read
its counts. Importing this package imports neither torch nor ray.
"""

from __future__ import annotations

from .checks import CALLER_TAG, DRIVER_FILE, conformance_checks
from .cli import KitRun, main, run_kit
from .runner import (
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    SEED,
    Check,
    CheckFailed,
    CheckResult,
    ConformanceReport,
    run_check,
    run_checks,
)
from .suite import BackendConformance

__all__ = [
    "CALLER_TAG",
    "DRIVER_FILE",
    "FAILED",
    "NOT_APPLICABLE",
    "PASSED",
    "SEED",
    "BackendConformance",
    "Check",
    "CheckFailed",
    "CheckResult",
    "ConformanceReport",
    "KitRun",
    "conformance_checks",
    "main",
    "run_check",
    "run_checks",
    "run_kit",
]

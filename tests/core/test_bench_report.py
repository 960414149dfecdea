"""The benchmark suite's report (benchmarks/run.py) names a failed case's error in full."""

from __future__ import annotations

import importlib.util
from pathlib import Path

RUN_PY = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
_spec = importlib.util.spec_from_file_location("twinkle_benchmarks_run", RUN_PY)
bench_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_run)  # imports neither torch nor ray

TRACEBACK = """Traceback (most recent call last):
  File "harness.py", line 250, in start
    initialize(mode="ray", groups=groups)
  File "backend.py", line 150, in initialize
    check_worker_imports()
twinkle_core.errors.ConfigurationError: mode='ray': a folder shadows a package:
  - twinkle_core: the driver imports /site/twinkle_core/__init__.py; a worker: /clone/twinkle_core
Start the driver from another directory.
"""


def test_a_failed_case_shows_the_whole_message_of_its_exception():
    shown = bench_run.error_summary(TRACEBACK)
    assert shown.startswith("twinkle_core.errors.ConfigurationError: mode='ray'")
    assert "/clone/twinkle_core" in shown  # not only the message's last line
    assert shown.endswith("Start the driver from another directory.")
    assert "Traceback" not in shown and "harness.py" not in shown


def test_the_summary_fits_a_table_cell():
    shown = bench_run.error_summary("ValueError: a | b\n" + "x" * 2000)
    assert "|" not in shown and len(shown) <= 600
    assert bench_run.error_summary("no exception line\nthe last one") == "the last one"


def test_slow_rounds_are_reported_instead_of_hidden_in_the_median():
    """A round over twice its variant's median shows in the row's notes and JSON."""
    import harness

    samples = {"twinkle": [1.0, 1.1, 0.9, 5.0, 1.0], "raw": [1.0, 1.0, 1.1], "memcpy": [1.0, 9.0]}
    row = harness.Row("9z", "a case", 1.0, 1.0, samples=samples)
    assert row.slow == {"twinkle": {"slow": 1, "rounds": 5, "worst_x": 5.0}}  # memcpy: 2 rounds
    assert row.slow_note() == "slow rounds (over 2x the median): twinkle 1/5 (up to 5.0x)"
    assert row.as_json()["slow_rounds"] == row.slow
    quiet = harness.Row("9y", "a case", 1.0, 1.0, samples={"raw": [1.0, 1.9, 1.2]})
    assert quiet.slow_note() == "" and quiet.slow == {}

    class Args:
        quick = False

    info = {
        "elapsed_s": 1,
        "date": "d",
        "cpus": 2,
        "cpu_model": "m",
        "memory_gib": 1,
        "python": "3",
        "torch": "t",
        "ray": "r",
        "numpy": "n",
        "twinkle_commit": "c",
    }
    table = bench_run.markdown([row, quiet], {}, info, Args())
    assert (
        "| 9z | a case | 1 s | 1 s | 1.00 | slow rounds (over 2x the median): twinkle 1/5" in table
    )
    assert "| 9y | a case | 1 s | 1 s | 1.00 |  |" in table

"""The design's example and every exception shape in mode 'inprocess' (golden values)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

import design_example


def test_design_example_in_process_gives_the_written_down_values():
    assert design_example.run("inprocess") == design_example.EXPECTED

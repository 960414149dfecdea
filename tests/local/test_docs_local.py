"""The docs' blocks marked `<!-- requires: local -->` run as printed (torch and twinkle-local;
run as `python train.py` would: one process, no torchrun). See tests/_support/docs.py."""

from __future__ import annotations

import pytest
from _support import docs


@pytest.mark.parametrize("page", docs.pages_requiring("local"))
def test_page_runs_as_printed(page, tmp_path):
    assert docs.run_page(page, "local", tmp_path) > 0

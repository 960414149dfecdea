"""The docs' blocks marked `<!-- requires: ray -->` run as printed (twinkle-ray, ray and torch;
an embedded cluster, as `python train.py` starts one). See tests/_support/docs.py."""

from __future__ import annotations

import pytest
from _support import docs


@pytest.mark.parametrize("page", docs.pages_requiring("ray"))
def test_page_runs_as_printed(page, tmp_path):
    assert docs.run_page(page, "ray", tmp_path) > 0

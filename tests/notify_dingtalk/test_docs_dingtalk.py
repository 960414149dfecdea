"""The docs' blocks marked `<!-- requires: dingtalk -->` run as printed (twinkle-core and
twinkle-notify-dingtalk). See tests/_support/docs.py."""

from __future__ import annotations

import pytest
from _support import docs


@pytest.mark.parametrize("page", docs.pages_requiring("dingtalk"))
def test_page_runs_as_printed(page, tmp_path):
    assert docs.run_page(page, "dingtalk", tmp_path) > 0

"""The design's example and every exception shape in mode 'inprocess' (golden values)."""

from __future__ import annotations

from _support import design_example


def test_design_example_in_process_gives_the_written_down_values():
    assert design_example.run("inprocess") == design_example.EXPECTED


def test_wait_and_as_completed_reject_bad_arguments():
    import pytest

    from twinkle_core import ConfigurationError, LazyCollect, as_completed, wait

    lazy = LazyCollect.of_value(1)
    with pytest.raises(ConfigurationError, match="got one LazyCollect"):
        wait(lazy)
    with pytest.raises(ConfigurationError, match="num_returns"):
        wait([lazy], num_returns=2)
    with pytest.raises(ConfigurationError, match="timeout"):
        wait([lazy], timeout=-1)
    with pytest.raises(ConfigurationError, match="only LazyCollect"):
        list(as_completed([lazy, 3]))
    with pytest.raises(ConfigurationError, match="twice"):
        wait([lazy, lazy])


def test_as_completed_times_out_with_the_calls_still_running():
    import pytest

    from twinkle_core import CallTimeoutError, LazyCollect, as_completed, wait

    never = LazyCollect(lambda timeout: None, lambda: False, describe="never")
    ready = LazyCollect.of_value(5)
    seen = []
    with pytest.raises(CallTimeoutError, match="1 of 2 call"):
        for item in as_completed([never, ready], timeout=0.2):
            seen.append(item())
    assert seen == [5]
    assert wait([never, ready], num_returns=2, timeout=0.1) == ([ready], [never])

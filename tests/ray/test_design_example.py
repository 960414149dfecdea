"""The design's example and every exception shape on a real Ray cluster (golden values)."""

from __future__ import annotations

from _support import design_example


def test_design_example_on_ray_gives_the_written_down_values(cluster):
    import ray.cloudpickle

    # By value, as a driver script's own classes travel: exceptions defined in it included.
    ray.cloudpickle.register_pickle_by_value(design_example)
    assert design_example.run("ray", address=cluster.address) == design_example.EXPECTED


def test_awaiting_a_ray_call_keeps_the_event_loop_running(cluster):
    """While one `await` waits on a 0.5 s call, other coroutines keep running."""
    import asyncio

    from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown

    @remote_class()
    class Sleeper:
        @remote_function(dispatch="all", collect="first")
        def nap(self, seconds):
            import time

            time.sleep(seconds)
            return seconds

    async def main(sleeper):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.ensure_future(ticker())
        value = await sleeper.nap(0.5)
        beat.cancel()
        return value, ticks

    initialize("ray", groups=[DeviceGroup("s", 1)], address=cluster.address)
    try:
        value, ticks = asyncio.run(main(Sleeper(remote_group="s")))
    finally:
        shutdown()
    assert value == 0.5
    assert ticks >= 10  # 0.5 s at one tick per 10 ms: the loop was never blocked for long

"""The design's example and every exception shape on a real Ray cluster (golden values)."""

from __future__ import annotations

import sys
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_design_example_on_ray_gives_the_written_down_values(cluster):
    import ray.cloudpickle

    sys.path.insert(0, str(INTEGRATION))
    import design_example

    # By value, as a driver script's own classes travel: exceptions defined in it included.
    ray.cloudpickle.register_pickle_by_value(design_example)
    assert design_example.run("ray", address=cluster.address) == design_example.EXPECTED

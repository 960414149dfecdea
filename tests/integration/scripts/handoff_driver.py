"""By-reference hand-off between colocated objects, run as a user runs it in each mode.

Usage: `handoff_driver.py --mode MODE --out FILE` (under torchrun for mode 'local'). A policy
role returns torch tensors; a reference role on the same group reports, inside its workers,
whether what it received is the very tensor its rank's policy worker returned (`is`, and the
same storage: `data_ptr()`); a role on another group and the driver report the values.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

import torch

from twinkle_core import (
    DeviceGroup,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ROWS = 256  # 256 x 256 float32 = 256 KiB per rank: above every backend's inline threshold


def made() -> dict:
    """This process's table of what each policy rank returned last. Kept in a module of its
    own: on Ray each class of this script travels by value, with copies of its globals."""
    module = sys.modules.setdefault("_handoff_made", types.ModuleType("_handoff_made"))
    return module.__dict__.setdefault("made", {})


def rank() -> int:
    return get_worker_context().rank


@remote_class()
class Policy:
    @remote_function(dispatch="all", collect="concat")
    def generate(self):
        out = made()[rank()] = torch.full((ROWS, 256), float(rank()))
        return out

    @remote_function(dispatch="all", collect="none")
    def rollout(self):
        return {"logits": self.generate(), "rank": rank()}


@remote_class()
class Reference:
    @remote_function(dispatch="slice_dp", collect="none")
    def same_tensor(self, x):
        mine = made().get(rank())
        return [rank(), x is mine, x.data_ptr() == mine.data_ptr(), float(x[0, 0])]

    @remote_function(dispatch="all", collect="none")
    def same_per_result(self, rollouts):
        mine = made().get(rank())
        return [
            rank(),
            [[r["logits"] is mine, r["logits"].data_ptr() == mine.data_ptr()] for r in rollouts],
        ]

    @remote_function(dispatch="all", collect="none")
    def values(self, x):
        return [rank(), list(x.shape), float(x[0, 0]), float(x[-1, 0])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    groups = [DeviceGroup("model", 2, "cpu"), DeviceGroup("other", 1, "cpu")]
    initialize(mode=args.mode, groups=groups)
    try:
        policy = Policy(remote_group="model")
        reference = Reference(remote_group="model")
        elsewhere = Reference(remote_group="other")
        batch = policy.generate()
        out = {
            "slice_dp": reference.same_tensor(batch)(),
            "all": reference.same_per_result(policy.rollout())(),
            "other_group": elsewhere.values(batch)(),
            "whole": reference.values(policy.generate())(),
        }
        value = batch()
        out["driver"] = [list(value.shape), float(value[0, 0]), float(value[-1, 0])]
    finally:
        shutdown()
    if os.environ.get("RANK", "0") == "0":
        with open(args.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()

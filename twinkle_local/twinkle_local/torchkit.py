"""The torch-level pieces every backend that runs torch needs, defined once: twinkle-local's
public module for other plugins (the Ray backend imports only this of twinkle-local; an
import-linter contract holds it to that).

- the transports `gloo`, `nccl` and `hccl` (registered by this package's plugin, carried by
  any backend that builds torch.distributed groups between its groups), their hardware probes,
  and where a receiver allocates tensors (`receive_device`);
- tensor skeletons: a result's structure with its tensors taken out (`split`), put back
  (`fill`), and why a value cannot travel as raw tensors (`why_not_carried`, `NotTensors`);
- `reduce_op`: torch.distributed's op for a twinkle op name;
- `carries`: whether a backend building torch.distributed groups can carry a transport.

Why here and not in core: core never imports torch, and twinkle-local is the package that
registers the torch platforms, so the torch knowledge of every backend lives with them.
"""

from __future__ import annotations

from .collective import as_inputs, reduce_op, torch_views
from .skeleton import NotTensors, Slot, fill, split, why_not_carried
from .transports import (
    GlooTransport,
    HcclTransport,
    NcclTransport,
    carries,
    cuda_probe,
    gloo_probe,
    npu_probe,
    receive_device,
)

__all__ = [
    "GlooTransport",
    "HcclTransport",
    "NcclTransport",
    "NotTensors",
    "Slot",
    "as_inputs",
    "carries",
    "cuda_probe",
    "fill",
    "gloo_probe",
    "npu_probe",
    "receive_device",
    "reduce_op",
    "split",
    "torch_views",
    "why_not_carried",
]

"""The mark a host tensor carries when a target's worker sent it back from its device.

A run on the host holds every tensor on the CPU: a tensor that came back from the target's device
carries that device's name, so the next cell's runs put it on their own device again.
"""

from __future__ import annotations

import torch

__all__ = ["ORIGIN_ATTR", "origin_of"]

#: Attribute a host tensor carries when it was sent back from a target worker's device (its device).
ORIGIN_ATTR = "_workbench_device"


def origin_of(tensor: torch.Tensor) -> str | None:
    """The device ``tensor`` is on, or was sent back from (None: the host's own)."""
    if not tensor.is_cpu:
        return str(tensor.device)
    return vars(tensor).get(ORIGIN_ATTR)

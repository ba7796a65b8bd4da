"""``torch.compile`` on the cpu reference standing in for cuda: Inductor's CPU code path.

While a cell runs on the host as cuda, ``torch.cuda`` answers as a GPU would (``run/cuda_module``).
Inductor reads ``torch.cuda`` too (whether CUDA is there, its caching allocator, CUDA graphs for
``mode="max-autotune"``), and would then generate or check CUDA code a CPU build cannot run. While
Inductor compiles a graph of the reference, it sees the real module: the graph is on the CPU, so it
takes the CPU code path, as CUDA takes its own. The cell's own code, traced by Dynamo before, still
sees the stand-in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["inductor_on_the_host"]


@contextlib.contextmanager
def inductor_on_the_host() -> Iterator[None]:
    """For the body: Inductor compiles the reference's graphs with the real ``torch.cuda``."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    original = wrapper.__dict__.get("__call__") if wrapper is not None else None
    if wrapper is None or original is None:
        yield
        return

    def call(self: Any, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
        stand_in = torch.cuda
        real = getattr(stand_in, "_real", None)
        if real is None:
            return original(self, model_, inputs_, **kwargs)
        torch.cuda = real
        try:
            return original(self, model_, inputs_, **kwargs)
        finally:
            torch.cuda = stand_in

    wrapper.__call__ = call
    try:
        yield
    finally:
        wrapper.__call__ = original

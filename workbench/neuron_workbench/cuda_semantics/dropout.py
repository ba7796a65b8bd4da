"""Dropout as ATen runs it on CUDA, for CPU tensors: the fused ``native_dropout`` kernel.

``aten::dropout`` picks the fused kernel for CUDA (and PrivateUse1) inputs: one rounding of
``x * mask / (1 - p)`` and a boolean mask saved for backward. On the CPU it runs ``bernoulli_``,
``div_`` and ``mul``: two roundings in bf16/fp16 and a floating mask saved for backward. Besides the
numbers, the saved mask's dtype matters: activation checkpointing checks that the recompute during
backward saves tensors with the forward's metadata.

:func:`fused_dropout_on_cpu` registers kernels for ``aten::dropout`` at the dispatcher
(``AutogradCPU`` and ``CPU``), so every call takes CUDA's path wherever it comes from: the cell, a
module's ``forward``, a checkpoint's recompute in the autograd engine, a hook, another thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    # The same cases as ATen's dropout: the fused kernel when it is acceptable for a device input
    # (0 < p < 1, non-empty), the input itself when nothing is dropped, zeros when all is.
    if not train or p == 0 or x.numel() == 0:
        return x
    if p == 1:
        return x.mul(torch.zeros((), dtype=x.dtype, device=x.device))
    return torch.ops.aten.native_dropout.default(x, p, True)[0]


@contextlib.contextmanager
def fused_dropout_on_cpu() -> Iterator[None]:
    """While the body runs, ``aten::dropout`` on CPU tensors runs CUDA's fused kernel.

    The registration is process-wide (the dispatcher has no per-thread kernels): enter it only
    while the host stands in for a CUDA device.
    """
    library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - removed on exit
    try:
        # AutogradCPU: native_dropout carries its own backward; CPU: under inference_mode, where
        # the autograd keys are skipped.
        library.impl("dropout", _dropout, "AutogradCPU")
        library.impl("dropout", _dropout, "CPU")
        yield
    finally:
        library._destroy()

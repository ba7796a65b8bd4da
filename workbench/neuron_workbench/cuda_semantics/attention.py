"""``scaled_dot_product_attention`` under ``sdpa_kernel``, for devices without CUDA's kernels.

``with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):`` (or ``CUDNN_ATTENTION``, or
``torch.backends.cuda.enable_math_sdp(False)`` with the memory-efficient kernel left on) leaves a
GPU one of its fused kernels. The CPU has neither of those two, so with its own two (flash and
math) switched off it finds no viable kernel and raises, where the GPU computes. A PrivateUse1
device without a kernel choice of its own (ATen's ``_fused_sdp_choice_stub``) takes the math
kernel whatever the flags say, so neither does a real Trainium or TPU raise there.

:func:`host_attention_kernels` lets the host compute such a call with its math kernel, as the
nearest to the GPU's fused one (each computes the same softmax in another order).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: The dtypes cuDNN's attention kernel takes (it has no float32 one).
_CUDNN_DTYPES = (torch.float16, torch.bfloat16)


def gpu_kernel_without_host_one(query: torch.Tensor) -> bool:
    """Whether only kernels the CPU lacks are on for an attention call on ``query``.

    True when neither of the CPU's kernels (flash, math) is enabled but a GPU still has one of its
    own for ``query``'s dtype: the memory-efficient kernel (every floating dtype), or cuDNN's
    (float16 and bfloat16).

    Parameters
    ----------
    query : torch.Tensor
        The call's query, whose dtype decides whether cuDNN's kernel takes it.

    Returns
    -------
    bool
        Whether the CPU would find no viable kernel where a GPU finds one.
    """
    backends = torch.backends.cuda
    if backends.math_sdp_enabled() or backends.flash_sdp_enabled():
        return False
    return backends.mem_efficient_sdp_enabled() or (
        backends.cudnn_sdp_enabled() and query.dtype in _CUDNN_DTYPES
    )


@contextlib.contextmanager
def host_attention_kernels(query: torch.Tensor) -> Iterator[None]:
    """While the body runs, the host's math kernel computes what a GPU's fused one would.

    Only where :func:`gpu_kernel_without_host_one` holds for ``query``; otherwise the flags stay
    as the cell set them (a cell that allows the math kernel alone gets it, as on a GPU). The
    flags are process-wide: the math kernel is switched off again on exit.

    Parameters
    ----------
    query : torch.Tensor
        The call's query.
    """
    if not gpu_kernel_without_host_one(query):
        yield
        return
    torch.backends.cuda.enable_math_sdp(True)
    try:
        yield
    finally:
        torch.backends.cuda.enable_math_sdp(False)

"""CUDA's autocast op lists, applied on another device's autocast dispatch key.

``torch.autocast("cuda")`` and ``torch.autocast("cpu")`` cast different ops (PyTorch's
``aten/src/ATen/autocast_mode.cpp``): under CUDA's lists softmax, log_softmax, layer_norm, the losses,
exp, pow ... run in float32; under CPU's they stay in the lower precision. When the host CPU stands
in for a CUDA GPU, :func:`cuda_autocast_lists` swaps the ``AutocastCPU`` kernels for CUDA's policy for
as long as a run lasts; TorchNeuron registers CUDA's lists for its device as well, and the emulated
devices use the same tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet

from neuron_workbench.quiet import warnings_ignored

#: Ops autocast runs in the lower precision (CUDA's ``lower_precision_fp`` list).
LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)  # fmt: skip
#: Ops autocast runs in float32 (CUDA's ``fp32`` list).
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)  # fmt: skip
#: Ops whose optional ``dtype`` argument autocast sets to float32 (CUDA's ``fp32_set_opt_dtype``).
FLOAT32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip
#: Ops autocast runs in the widest input type (CUDA's ``promote`` list).
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)  # fmt: skip

POLICIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lower", LOWER_PRECISION),
    ("fp32", FLOAT32),
    ("set_opt_dtype", FLOAT32_SET_OPT_DTYPE),
    ("promote", PROMOTE),
)

BCE_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


def resolve_op(name: str) -> Any:
    """``torch.ops.aten`` overload for ``name`` (``softmax.int``); AttributeError if absent."""
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def make_kernel(op: Any, policy: str, device_type: str, key: DispatchKey) -> Callable[..., Any]:
    """An autocast kernel for ``op`` that applies CUDA's ``policy`` to ``device_type`` tensors.

    The kernel excludes ``key`` while it calls ``op`` again, so the call reaches the backend.
    """
    exclude = DispatchKeySet(key)
    names = [a.name for a in op._schema.arguments]
    dtype_pos = names.index("dtype") if "dtype" in names else -1
    dtype_kwonly = dtype_pos >= 0 and op._schema.arguments[dtype_pos].kwarg_only

    def eligible(t: Any) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and t.device.type == device_type
            and t.is_floating_point()
            and t.dtype != torch.float64
        )

    def cast(x: Any, dtype: torch.dtype) -> Any:
        if eligible(x) and x.dtype != dtype:
            return x.to(dtype)
        if isinstance(x, list | tuple) and x and isinstance(x[0], torch.Tensor):
            return type(x)(cast(y, dtype) for y in x)
        return x

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if policy == "lower":
                dt = torch.get_autocast_dtype(device_type)
                args = tuple(cast(a, dt) for a in args)
                kwargs = {k: cast(v, dt) for k, v in kwargs.items()}
            elif policy == "fp32":
                args = tuple(cast(a, torch.float32) for a in args)
                kwargs = {k: cast(v, torch.float32) for k, v in kwargs.items()}
            elif policy == "promote":
                dt = torch.get_autocast_dtype(device_type)
                for a in (*args, *kwargs.values()):
                    if eligible(a):
                        dt = torch.promote_types(dt, a.dtype)
                args = tuple(cast(a, dt) for a in args)
                kwargs = {k: cast(v, dt) for k, v in kwargs.items()}
            elif policy == "set_opt_dtype" and args and eligible(args[0]):
                if dtype_kwonly or dtype_pos >= len(args):
                    if kwargs.get("dtype") is None:
                        kwargs = dict(kwargs, dtype=torch.float32)
                elif dtype_pos >= 0 and args[dtype_pos] is None:
                    args = (*args[:dtype_pos], torch.float32, *args[dtype_pos + 1 :])
            return op(*args, **kwargs)

    return kernel


def make_norm_kernel(target: Any, device_type: str, key: DispatchKey) -> Callable[..., Any]:
    """``norm.Scalar``/``norm.ScalarOpt_dim`` under autocast: CUDA appends ``dtype=float32``."""
    exclude = DispatchKeySet(key)

    def kernel(self: Any, p: Any = 2, *rest: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if (
                self.device.type == device_type
                and self.is_floating_point()
                and self.dtype != torch.float64
            ):
                return target(self, p, *rest, dtype=torch.float32)
            return target(self, p, *rest) if rest else torch.ops.aten.norm.Scalar(self, p)

    return kernel


def bce_banned(*args: Any, **kwargs: Any) -> Any:
    """CUDA autocast refuses ``binary_cross_entropy`` (it is unsafe in lower precision)."""
    raise RuntimeError(BCE_BANNED_MESSAGE)


def register_cuda_policy(library: Any, device_type: str, key: DispatchKey) -> set[str]:
    """Register CUDA's autocast kernels in ``library`` (an ``IMPL`` library for ``key``).

    Returns the names of the ops registered.
    """
    registered: set[str] = set()
    for policy, names in POLICIES:
        for name in names:
            try:
                op = resolve_op(name)
            except AttributeError:  # an op this torch version does not have
                continue
            library.impl(name, make_kernel(op, policy, device_type, key))
            registered.add(name)
    norms = (
        ("norm.Scalar", torch.ops.aten.norm.ScalarOpt_dtype),
        ("norm.ScalarOpt_dim", torch.ops.aten.norm.ScalarOpt_dim_dtype),
    )
    for name, target in norms:
        library.impl(name, make_norm_kernel(target, device_type, key))
        registered.add(name)
    library.impl("binary_cross_entropy", bce_banned)
    registered.add("binary_cross_entropy")
    return registered


def _cpu_autocast_ops() -> list[str]:
    """Ops with a kernel of their own for ``AutocastCPU`` (CPU's lists), as ``name.overload``."""
    names = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if qualified.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(
            qualified, "AutocastCPU"
        ):
            names.append(qualified[len("aten::") :])
    return names


@contextlib.contextmanager
def cuda_autocast_lists() -> Iterator[None]:
    """While active, ``torch.autocast("cpu")`` casts exactly the ops ``torch.autocast("cuda")`` casts.

    CUDA's policy kernels replace CPU's on the ``AutocastCPU`` key; ops only CPU's lists name get a
    fallthrough (no cast). Everything is unregistered on exit, which restores CPU's own kernels.
    """
    from torch.library import Library, fallthrough_kernel

    with warnings_ignored():
        # The dispatcher warns (once) that registrations override existing kernels: that is the point.
        library = Library("aten", "IMPL", "AutocastCPU")
        try:
            registered = register_cuda_policy(library, "cpu", DispatchKey.AutocastCPU)
            for name in _cpu_autocast_ops():
                if name not in registered:
                    library.impl(name, fallthrough_kernel)
        except BaseException:
            library._destroy()
            raise
    try:
        yield
    finally:
        library._destroy()

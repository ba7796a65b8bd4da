"""Kernels registered with ``torch.library`` for the emulated device.

- PrivateUse1: every factory op (``randn``, ``zeros``, ``empty_strided``...), ``_copy_from`` and
  ``_copy_from_and_resize``, plus a catch-all fallback for ops that arrive with only
  ``device=neuron``. Ops that can see an emulated tensor get a per-op kernel, never the fallback
  (a Python fallback with a Python-key tensor argument hits an internal assert in torch 2.13).
- AutocastPrivateUse1: a fallthrough plus per-op cast kernels built from PyTorch's CUDA autocast
  lists (``aten/src/ATen/autocast_mode.h``), which TorchNeuron registers as well.
- AutogradPrivateUse1: shims for ops whose decomposition depends on the device: SDPA (to the
  overrideable fused op, as TorchNeuron) and the CUDA-only fused LSTM/GRU cells; the same shims at
  PrivateUse1, which ``torch.inference_mode()`` reaches without the autograd keys.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._C import DispatchKey
from torch.library import Library

from neuron_workbench.cuda_semantics.attention import host_attention_kernels
from neuron_workbench.cuda_semantics.autocast import register_cuda_policy
from neuron_workbench.cuda_semantics.rnn import fused_gru_cell, fused_lstm_cell
from neuron_workbench.emulator import _core
from neuron_workbench.emulator import events as _events

_LIBS: list[Library] = []
_CEA = DispatchKey.CompositeExplicitAutograd

# Factory composites that allocate empty(0) and grow it through out= (impossible here): run on CPU.
_FACTORY_NO_DECOMP = frozenset(
    {"arange", "eye", "linspace", "logspace", "range", "empty", "empty_strided"}
)


def _payload(t: Any) -> Any:
    """The CPU data of a device tensor (a CPU alias of its memory with the native core)."""
    if isinstance(t, _core.EmulatedTensor):
        return t.elem
    if _core.NATIVE_CORE is not None and isinstance(t, torch.Tensor) and t.device.type != "cpu":
        return _core.NATIVE_CORE.cpu_alias(t)
    return t


def _check_index(dev: Any) -> None:
    if dev is None:
        return
    d = torch.device(dev)
    if d.index not in (None, 0):
        raise RuntimeError(
            f"emulated {_core.DEVICE_TYPE} has a single device ({_core.DEVICE}); {d} cannot be "
            "emulated (the Python device guard reports one device). Use "
            f"'{_core.DEVICE_TYPE}' or '{_core.DEVICE_TYPE}:0'."
        )


def pin_memory_error() -> RuntimeError:
    """The error for a device factory asked for pinned memory (CUDA's wording)."""
    return RuntimeError("Only dense CPU tensors can be pinned")


def _factory_ops() -> list[Any]:
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        base, _, ov = name[6:].partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, base), ov or "default")
        except (AttributeError, RuntimeError):
            continue
        args = op._schema.arguments
        if not any(a.name == "device" for a in args):
            continue
        if any("Tensor" in str(a.type) for a in args):
            continue
        if op.has_kernel_for_dispatch_key(DispatchKey.CompositeImplicitAutograd):
            continue
        found.append(op)
    return found


def _make_factory(op: Any) -> Any:
    base = op._schema.name.split("::", 1)[1]
    overload = _core.overload_name(op)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        _check_index(kwargs.get("device"))
        if kwargs.get("pin_memory"):
            raise pin_memory_error()
        refused = _core.memory_format_error(_core.DEVICE_TYPE, overload, kwargs)
        if refused is not None:
            raise refused
        native = base in _core.NATIVE
        if not native and base not in _FACTORY_NO_DECOMP and op.has_kernel_for_dispatch_key(_CEA):
            # As the real dispatcher would: the composite runs on the device, its pieces
            # (empty + normal_, ...) are checked op by op.
            return op._op_dk(_CEA, *args, **kwargs)
        if not native and not _core.CPU_FALLBACK:
            layout = _core.sparse_layout_of(base, kwargs)
            if layout is not None:
                raise _core.layout_error(layout, overload)
            raise _core.not_implemented_error(overload)
        kw = dict(kwargs)
        kw["device"] = torch.device("cpu")
        t0 = _core._perf()
        out = op(*args, **kw)
        if not native:
            _events.record_event(f"aten::{base}", overload, (), _core._perf() - t0)
        if out.layout != torch.strided:
            raise _core.layout_error(out.layout, overload)
        return _core.wrap_new(out)

    return kernel


def _copy_from(self: Any, dst: Any, non_blocking: bool = False) -> Any:
    _payload(dst).copy_(_payload(self))
    return dst


def _copy_from_and_resize(self: Any, dst: Any) -> Any:
    d = _payload(dst)
    s = _payload(self)
    if d.numel() == 0 and s.numel() != 0:
        d.resize_(s.shape)
        if isinstance(dst, _core.EmulatedTensor):
            _core._resync(dst)
    d.copy_(s)
    return dst


def _backend_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    # Reached only by ops whose sole link to the device is a device= argument.
    if "device" in kwargs:
        _check_index(kwargs["device"])
        kwargs = dict(kwargs, device=torch.device("cpu"))
    out = op(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        return _core.wrap_new(out)
    return out


def _sparse_constructors() -> list[str]:
    """Overloads of the composite constructors of sparse compressed tensors."""
    names = []
    for qualified in torch._C._dispatch_get_all_op_names():
        name = qualified[len("aten::") :]
        if not qualified.startswith("aten::") or name.startswith("_validate"):
            continue
        if "sparse_compressed_tensor" in name or any(
            f"sparse_{tag}_tensor" in name for tag in ("csr", "csc", "bsr", "bsc")
        ):
            if torch._C._dispatch_has_kernel_for_dispatch_key(
                qualified, "CompositeImplicitAutograd"
            ):
                names.append(name)
    return names


def _refuse_to_copy(self: Any, **kwargs: Any) -> Any:
    raise _core.layout_error(self.layout, "aten::_to_copy")


def _sparse_fallback(default_layout: str | None) -> Any:
    def fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
        base = op._schema.name.split("::", 1)[1]
        layout = _core.sparse_layout_of(base, kwargs) or default_layout or "sparse compressed"
        raise _core.layout_error(layout, _core.overload_name(op))

    return fallback


# ---- autocast: CUDA's op lists, as TorchNeuron registers (cuda_semantics.autocast) ----


# ---- device-dependent decompositions (AutogradPrivateUse1) ----------------------------------

_SDPA_FUSED = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
_FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)


def _sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    # Choose the kernel CPU would choose, so results match CPU; the fused path goes through the
    # overrideable op, which TorchNeuron and TorchTPU register.
    choice = -1
    mask_grad = isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad
    if not mask_grad:
        # A device without a kernel choice of its own takes the math kernel whatever the flags
        # say: where the CPU would find none (sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)), the
        # choice is the one the cpu reference makes there.
        with host_attention_kernels(query):
            choice = _sdp_choice(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
    # Grouped-query attention (fewer key/value heads) goes to the fused op as it is: CPU's flash
    # kernel shares each key/value head among its group of query heads and sums their gradients in
    # float32, which expanding the heads first would not reproduce.
    # Public SDPA turns a boolean mask into an additive one before either kernel: the math op
    # would add the booleans themselves (0 or 1) to the scores.
    attn_mask = _additive_mask(attn_mask, query.dtype)
    if choice == _FLASH:
        return _SDPA_FUSED(query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[
            0
        ]
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def _additive_mask(attn_mask: Any, dtype: torch.dtype) -> Any:
    """``attn_mask`` as public SDPA hands it to its kernels (ATen's ``convert_boolean_attn_mask``).

    A boolean mask becomes 0 where it is True and -inf where it is False, in ``dtype`` (the
    query's) and on the mask's device; any other mask (``None`` or an additive float mask) is
    returned as it is.
    """
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
        return attn_mask
    neg_inf = torch.scalar_tensor(float("-inf"), dtype=dtype, device=attn_mask.device)
    return torch.where(attn_mask, 0.0, neg_inf)


def _sdp_choice(*tensors: Any, **kwargs: Any) -> int:
    """CPU's SDPA kernel choice for these inputs (query, key, value, mask, then the options).

    While torch.compile traces with fake tensors (no data), the choice is made on empty CPU
    tensors of the same metadata, outside the fake mode.
    """
    inputs, options = tensors[:4], tensors[4:]
    if all(not isinstance(t, torch.Tensor) or type(t) in _PLAIN for t in inputs):
        return torch._fused_sdp_choice(*(_payload(t) for t in inputs), *options, **kwargs)
    from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

    if not any(isinstance(t, torch.Tensor) and is_fake(t) for t in inputs):
        return torch._fused_sdp_choice(*(_payload(t) for t in inputs), *options, **kwargs)
    with unset_fake_temporarily():
        empty = [_empty_like(t) for t in inputs]
        return torch._fused_sdp_choice(*empty, *options, **kwargs)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _empty_like(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    shape = [int(s) for s in t.shape]
    stride = [int(s) for s in t.stride()]
    empty = torch.empty_strided(shape, stride, dtype=t.dtype, device="cpu")
    return empty.requires_grad_(t.requires_grad) if t.is_floating_point() else empty


def _sdpa_fused_cpu(
    query: Any,
    key: Any,
    value: Any,
    attn_bias: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> Any:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale
    )
    e = torch.empty(0)
    return _laid_out_like(out, query), lse, e, e, 0, 0, e, e, e


def _sdpa_fused_backward_cpu(
    grad_out: Any,
    query: Any,
    key: Any,
    value: Any,
    attn_bias: Any,
    grad_input_mask: Any,
    out: Any,
    logsumexp: Any,
    cum_seq_q: Any,
    cum_seq_k: Any,
    max_q: Any,
    max_k: Any,
    dropout_p: float,
    is_causal: bool,
    philox_seed: Any,
    philox_offset: Any,
    *,
    scale: float | None = None,
) -> Any:
    gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
        attn_mask=attn_bias, scale=scale,
    )  # fmt: skip
    gb = torch.zeros_like(attn_bias) if attn_bias is not None else torch.empty(0)
    return _laid_out_like(gq, query), _laid_out_like(gk, key), _laid_out_like(gv, value), gb


def _laid_out_like(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` with the strides the fused op's meta function gives it, from ``like``'s layout.

    A compiled graph is traced with those strides and views its results accordingly: CPU's flash
    kernel lays its output and gradients out its own way, and a compiled backward's ``view`` of a
    gradient failed ("view size is not compatible with input tensor's size and stride"). Torch's
    meta functions give a gradient ``empty_like`` its input, and the output the query's dimension
    order (``alloc_with_matching_layout``).
    """
    if result.shape == like.shape:
        laid_out = torch.empty_like(like)
    elif result.dim() == like.dim() == 4:
        order = sorted(range(4), key=lambda i: like.stride(i), reverse=True)
        strides, stride = [0] * 4, 1
        for i in reversed(order):
            strides[i] = stride
            stride *= result.shape[i]
        laid_out = torch.empty_strided(result.shape, strides, dtype=like.dtype, device=like.device)
    else:
        return result
    if laid_out.stride() == result.stride():
        return result
    return laid_out.copy_(result)


def _native_composites() -> list[str]:
    """Overloads of natively registered ops that also have a CompositeImplicitAutograd kernel.

    Ops such as ``silu_backward`` have per-backend kernels *and* a math decomposition for backends
    without one. The real backend registers them, so its autograd runs the op itself; without a
    PrivateUse1 kernel the dispatcher would decompose them above the emulator (other ops, other
    rounding). Only ops with a CPU kernel qualify (they have an autograd formula of their own).
    """
    names = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name = qualified[len("aten::") :]
        if name.partition(".")[0] not in _core.NATIVE:
            continue
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        if (
            has(qualified, "CompositeImplicitAutograd")
            and has(qualified, "CPU")
            and not has(qualified, "PrivateUse1")
        ):
            names.append(name)
    return names


def _unreachable_native(op_name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        # Emulated tensors carry the Python key, which dispatches before PrivateUse1.
        raise RuntimeError(
            f"emulated {_core.DEVICE_TYPE}: {op_name} reached its placeholder kernel without an "
            "emulated tensor argument"
        )

    return kernel


def register_all(native: bool = False) -> None:
    """Register every kernel (once per process; the caller guards re-entry).

    With the native core (``native=True``) the device's own kernels and its fallback are C++;
    the sparse, autocast and autograd kernels below are the same for both cores.
    """
    glob = Library("_", "IMPL")
    _LIBS.append(glob)
    if not native:
        pu1 = Library("aten", "IMPL", "PrivateUse1")
        _LIBS.append(pu1)
        for op in _factory_ops():
            pu1.impl(_core.overload_name(op)[6:], _make_factory(op))
        pu1.impl("_copy_from", _copy_from)
        pu1.impl("_copy_from_and_resize", _copy_from_and_resize)
        for name in _native_composites():
            pu1.impl(name, _unreachable_native(name))
        glob.fallback(_backend_fallback, "PrivateUse1")
    else:
        # Sparse compressed tensors are assembled in C++ from dense device components, with no
        # kernel of the device involved: refuse at their constructor, as for the other layouts.
        pu1 = Library("aten", "IMPL", "PrivateUse1")
        _LIBS.append(pu1)
        refuse = _sparse_fallback(None)
        for name in _sparse_constructors():
            base, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            pu1.impl(name, functools.partial(refuse, op))
        # csr.to(device): _to_copy's composite kernel would build the device tensor itself.
        csr = Library("aten", "IMPL", "SparseCsrPrivateUse1")
        _LIBS.append(csr)
        csr.impl("_to_copy", _refuse_to_copy)

    # Sparse dispatch keys of the device (e.g. torch.zeros(..., layout=torch.sparse_coo,
    # device=...)): one fallback that refuses, as TorchTPU's sparse-op fallback does.
    glob.fallback(_sparse_fallback("torch.sparse_coo"), "SparsePrivateUse1")
    glob.fallback(_sparse_fallback(None), "SparseCsrPrivateUse1")
    # torch 2.13 has no AutocastPrivateUse1 fallthrough: without it the first op fails.
    glob.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")

    ac = Library("aten", "IMPL", "AutocastPrivateUse1")
    _LIBS.append(ac)
    register_cuda_policy(ac, _core.DEVICE_TYPE, DispatchKey.AutocastPrivateUse1)

    ag = Library("aten", "IMPL", "AutogradPrivateUse1")
    _LIBS.append(ag)
    # torch.inference_mode() leaves the autograd keys out of dispatch, and these kernels with
    # them: SDPA took ATen's math path, not the kernel CPU picks (a bfloat16 model's outputs
    # differed from CPU's), and the fused RNN cells, CUDA-only ops, reached the device's CPU
    # fallback, which has no kernel for them (an LSTM raised NotImplementedError). The device's
    # own key, which inference mode reaches, gets the same kernels.
    below = Library("aten", "IMPL", "PrivateUse1")
    _LIBS.append(below)
    for name, kernel in (
        ("scaled_dot_product_attention", _sdpa),
        ("_thnn_fused_lstm_cell", fused_lstm_cell),
        ("_thnn_fused_gru_cell", fused_gru_cell),
    ):
        ag.impl(name, kernel)
        below.impl(name, kernel)
        _core.DEVICE_KERNELS.add(name)  # the Python core's tensors reach its dispatch first

    _core.CPU_IMPLS[_SDPA_FUSED] = _sdpa_fused_cpu
    _core.CPU_IMPLS[torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default] = (
        _sdpa_fused_backward_cpu
    )  # fmt: skip

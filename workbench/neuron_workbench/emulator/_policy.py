"""The emulator's shared policy: which ops get which treatment, and the numerics both cores apply.

Read by the pure-Python core (``_core``) and the native core's Python half (``_native_core``):
the op sets (host/device plumbing never reported, composites never decomposed, ops exempt from the
device check, ops that restride or share storage), the neuron 64-bit rules (float64 computed as
float32, integer arithmetic wrapping like int32, :data:`RULE_OPS` counting the ops they touched),
TPU-style bf16 matmul passes, and CUDA dtypes a CPU kernel lacks computed wider
(:func:`dtype_gaps`, :func:`run_widened`). Nothing here reads the emulator's runtime state: the
caller passes what it needs (the number of matmul passes).
"""

from __future__ import annotations

from typing import Any

import torch

_STRIDED = torch.strided

# Ops each numeric rule touched (evidence for hints): matmul-like ops computed with bf16 passes,
# and (Python core only; the native core counts its own in C++) ops with float64 / int64 inputs
# computed narrower. One increment per op. "tpu-matmul-1pass" counts the matmul-like ops of those that
# ran at one pass: a cell may change the precision mid-run, so the mode read before the run is not
# evidence of what its matmuls did. "int64-wrapped" counts the int64 ops of those in which narrowing
# to int32 changed a value (an input or a result beyond int32's range): an int64 op that ran is no
# evidence that anything wrapped around. "fp64-rounded" likewise counts the float64 ops in which
# float32 changed a value (see :func:`narrow_outputs`): a float64 op on values float32 holds (a
# GradScaler's power-of-two scale and its reciprocal) computes what float64 would.
RULE_OPS = {
    "tpu-matmul": 0,
    "tpu-matmul-1pass": 0,
    "fp64": 0,
    "int64": 0,
    "int64-wrapped": 0,
    "fp64-rounded": 0,
}

# Ops that must never be reported or decomposed: host/device plumbing the real backends register.
INTERNAL = frozenset(
    {
        "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "_local_scalar_dense",
        "empty", "empty_strided", "set_", "resize_", "lift_fresh", "lift_fresh_copy",
        "_has_compatible_shallow_copy_type", "is_pinned", "record_stream", "_unsafe_view",
        "detach", "alias", "_reshape_alias", "view", "as_strided", "clone",
    }
)  # fmt: skip
# Composites the emulator does not decompose: they allocate empty(0) and grow it through out=.
NO_DECOMP = frozenset({"arange", "eye", "linspace", "logspace", "range"})
# Mixing devices is allowed for these (as on CUDA): copies and indexing with CPU indices.
DEVICE_EXEMPT = frozenset(
    {
        "copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "index", "index_put",
        "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put", "set_",
        "_has_compatible_shallow_copy_type",
    }
)  # fmt: skip
# Ops that can change a mutated tensor's sizes/strides (besides every out= op).
RESTRIDE = frozenset(
    {
        "resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
        "unsqueeze_", "swapdims_", "swapaxes_", "_resize_output_",
    }
)  # fmt: skip
# Shares storage with its input although the schema does not mark it as a view.
SHARES = frozenset({"_unsafe_view", "_reshape_alias", "lift_fresh"})
# Numerics: integer arithmetic that wraps like int32 on neuron (indexing ops keep int64).
INT_ARITH = frozenset(
    {
        "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "neg", "neg_", "sum", "cumsum",
        "cumsum_", "prod", "cumprod", "mm", "bmm", "addmm", "dot", "mv", "pow", "pow_",
        "floor_divide", "floor_divide_", "remainder", "remainder_", "fmod", "fmod_", "abs",
        "abs_", "square", "__lshift__", "bitwise_left_shift", "addcmul", "addcmul_", "matmul",
        "div", "div_",
    }
)  # fmt: skip
# Not subject to the float64 rounding: data movement, views, comparisons of stored values.
NO_FP64_ROUND = INTERNAL | frozenset(
    {"fill_", "zero_", "cat", "stack", "index_select", "gather", "index", "masked_select"}
)
# Matmul-like ops and the argument positions of their two operands.
_MATMUL_OPERANDS = {
    "mm": (0, 1), "bmm": (0, 1), "mv": (0, 1), "dot": (0, 1), "addmm": (1, 2),
    "baddbmm": (1, 2), "addmv": (1, 2), "convolution": (0, 1),
}  # fmt: skip
_BIAS_FREE = {"addmm", "baddbmm", "addmv"}  # passes after the first use beta=0


def matmul_operands(base: str) -> tuple[int, ...] | None:
    """Argument positions of a matmul-like op's operands (bf16 passes round them), else None."""
    if base == "convolution_backward":
        return (0, 1, 2)
    if base.startswith("_scaled_dot_product_fused_attention_overrideable") and not base.endswith(
        "backward"
    ):
        return (0, 1, 2)
    return _MATMUL_OPERANDS.get(base)


#: Plan kinds: run as is, CPU fallback, decompose (CompositeExplicitAutograd), a Python
#: implementation, decompose (CompositeImplicitAutograd), the device's own registered kernel.
K_RUN, K_FALLBACK, K_DECOMP, K_IMPL, K_IMPLICIT, K_DEVICE = 0, 1, 2, 3, 4, 5

#: PyTorch's own namespaces outside ``aten``: ``prims`` ops appear in the graphs decompositions make
#: for ``torch.compile`` (batch norm's ``prims::var``), which the backends' compilers lower; they
#: are not a library's ops, and they ran on the device before library ops were told apart.
_TORCH_PRIMITIVES = frozenset({"prims"})


def library_op_kind(func: Any, view: bool) -> int:
    """The plan kind of an op outside ``aten`` (torchvision's, a user's ``torch.library`` op).

    No profile lists such ops, so the dispatcher's own rules decide, as on the real backends: a
    kernel registered for the device (PrivateUse1) runs it; a CompositeExplicitAutograd kernel
    (``torch.library.custom_op`` without ``device_types``) or a CompositeImplicitAutograd one runs
    on the device as its parts; anything else (a CPU-only kernel, a Meta/fake kernel) reaches the
    backend's global fallback: TorchNeuron's boxed CPU fallback (an event), TorchTPU's missing-op
    error (shared/notes/torchneuron.md §6.2, torchtpu.md §3).
    """
    if view or func.namespace in _TORCH_PRIMITIVES:
        return K_RUN
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = overload_name(func)
    if has(name, "PrivateUse1"):
        return K_DEVICE
    if has(name, "CompositeExplicitAutograd"):
        return K_DECOMP
    if has(name, "CompositeImplicitAutograd"):
        return K_IMPLICIT
    return K_FALLBACK


def overload_name(func: Any) -> str:
    """``aten::add.Tensor``: the op's name and overload, as events and errors spell it."""
    s = func._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


# Vendor text for non-strided layouts (shared/notes/torchtpu.md §3; shared/coverage/).
LAYOUT_BEHAVIOUR = {
    "tpu": "sparse operators are not supported on TPU yet (TorchTPU's sparse-op fallback)",
    "neuron": "TorchNeuron's registered coverage has no op for sparse tensors (its kernels are "
    "registered for dense PrivateUse1 tensors only)",
}


# Vendor text for a copy to the device asked for in a memory format other than contiguous or
# preserve (shared/notes/torchneuron.md §10: TorchNeuron rejects channels_last), as in
# `x.contiguous(memory_format=...)`, `x.to(device, memory_format=...)` and `model.to(memory_format=
# ...)`. TorchTPU's answer is not known: a device not listed here takes every format, as the host
# does.
MEMORY_FORMAT_REFUSAL = {
    "neuron": "Neuron tensors only support contiguous or preserve memory format",
}
_KEPT_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


def memory_format_error(device_type: str, overload: str, kwargs: dict) -> RuntimeError | None:
    """The device's refusal of the memory format an op's ``kwargs`` ask for, else None.

    Only a tensor made on the device is refused: ``x.to("cpu", memory_format=...)`` of a device
    tensor asks the host for the format.
    """
    refusal = MEMORY_FORMAT_REFUSAL.get(device_type)
    if refusal is None or kwargs.get("memory_format") in _KEPT_FORMATS:
        return None
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != device_type:
        return None
    return RuntimeError(f"{overload}: {refusal}")


def sparse_layout_of(base: str, kwargs: dict) -> Any:
    """The non-strided layout an op is about to create (by its layout= or its name), else None."""
    layout = kwargs.get("layout")
    if layout is not None and layout != _STRIDED:
        return layout
    if "sparse" not in base:
        return None
    for tag, lay in (("csr", "torch.sparse_csr"), ("csc", "torch.sparse_csc"),
                     ("bsr", "torch.sparse_bsr"), ("bsc", "torch.sparse_bsc")):  # fmt: skip
        if tag in base:
            return lay
    return "torch.sparse_coo"


# ---- numerics ------------------------------------------------------------------------------

_GAPS_FILE = "cuda-dtype-gaps.json"
_gaps: dict[str, dict[torch.dtype, torch.dtype]] | None = None


def dtype_gaps() -> dict[str, dict[torch.dtype, torch.dtype]]:
    """Overloads whose CPU kernel lacks a dtype CUDA supports: ``{overload: {dtype: wider}}``.

    Derived from PyTorch's OpInfo tables (``dtypesIfCUDA`` vs ``dtypes``) by
    ``tests/emulator/cuda_dtype_gaps.py`` into ``coverage/cuda-dtype-gaps.json``; read once.
    """
    global _gaps
    if _gaps is None:
        import json
        from pathlib import Path

        path = Path(__file__).resolve().parent / "coverage" / _GAPS_FILE
        table = json.loads(path.read_text(encoding="utf-8")).get("gaps", {})
        _gaps = {
            op: {getattr(torch, src): getattr(torch, wide) for src, wide in dtypes.items()}
            for op, dtypes in table.items()
        }
    return _gaps


def _mutated(widened: torch.Tensor, original: torch.Tensor) -> bool:
    """Whether the kernel changed ``widened``, the exact wider copy of ``original``."""
    if widened.is_inference():
        # made under torch.inference_mode(): no version counter to read (reading it raises)
        return not torch.equal(widened.to(original.dtype), original)
    return widened._version > 0


def run_widened(fn: Any, gaps: dict, args: list, kwargs: dict) -> Any:
    """Run ``fn`` with tensors of a dtype its CPU kernel lacks computed in a wider, exact one.

    The first tensor argument whose dtype is in ``gaps`` picks the rule: every tensor of that
    dtype is widened, the kernel runs, outputs in the wider dtype come back in the original one
    (CUDA's result dtype: the table's generator checks it against the meta kernels), and widened
    arguments the op mutates get their new values.
    """
    src = None
    for a in (*args, *kwargs.values()):
        if type(a) is torch.Tensor and a.dtype in gaps:
            src = a.dtype
            break
        if type(a) in (list, tuple):
            src = next((t.dtype for t in a if type(t) is torch.Tensor and t.dtype in gaps), None)
            if src is not None:
                break
    if src is None:
        return fn(*args, **kwargs)
    wide = gaps[src]
    widened: list[tuple[torch.Tensor, torch.Tensor]] = []

    def widen(a: Any) -> Any:
        if type(a) is torch.Tensor and a.dtype is src:
            w = a.to(wide)
            widened.append((a, w))
            return w
        if type(a) in (list, tuple):
            return type(a)(widen(x) for x in a)
        return a

    out = fn(*[widen(a) for a in args], **{k: widen(v) for k, v in kwargs.items()})
    for orig, w in widened:
        if _mutated(w, orig):  # by the kernel (rrelu_with_noise's noise)
            orig.copy_(w)

    def narrow(o: Any) -> Any:
        for orig, w in widened:
            if o is w:
                return orig  # an in-place result is the caller's tensor
        if isinstance(o, torch.Tensor) and o.dtype is wide:
            return o.to(src)
        if type(o) in (list, tuple):
            return type(o)(narrow(x) for x in o)
        return o

    return narrow(out)


_F64 = torch.float64
_F32 = torch.float32
_I64 = torch.int64
_I32 = torch.int32
_BF16 = torch.bfloat16
_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


def _wrap_int(v: int) -> int:
    return ((v - _I32_MIN) % 2**32) + _I32_MIN


def _rounding_changed(t: torch.Tensor, narrowed: torch.Tensor) -> bool:
    """Whether ``narrowed`` (float64 ``t`` rounded to float32) holds another value somewhere.

    A sparse tensor (on its way to the device's refusal) has no elementwise comparison: taken as
    changed, the float64 op it went into stays evidence, as every float64 op was.
    """
    if t.layout is not _STRIDED:
        return True
    return not torch.allclose(t, narrowed.to(_F64), rtol=0.0, atol=0.0, equal_nan=True)


def _beyond_int32(t: torch.Tensor) -> bool:
    """Whether int32 cannot hold some value of the int64 tensor ``t`` (narrowing would change it)."""
    if not t.numel():
        return False
    lo, hi = torch.aminmax(t)
    return int(lo) < _I32_MIN or int(hi) > _I32_MAX


#: Ops whose CPU kernels write arguments their schemas do not mark as written, when a bool argument
#: is true: ``{op: (positions written, position of the bool)}``. Those arguments are narrowed in
#: place, as a marked one is (a copy would lose the write). ``native_batch_norm`` updates
#: ``running_mean`` and ``running_var`` in training only. The native core's plan has the same entry.
UNMARKED_WRITES: dict[str, tuple[tuple[int, ...], int]] = {"aten::native_batch_norm": ((3, 4), 5)}


def unmarked_writes(overload: str, cargs: list) -> tuple[int, ...]:
    """Positions of the arguments ``overload`` writes though its schema does not say so, this call."""
    entry = UNMARKED_WRITES.get(overload)
    if entry is None:
        return ()
    written, flag = entry
    return written if len(cargs) > flag and cargs[flag] is True else ()


def narrow_inputs(
    cargs: list,
    ckw: dict,
    fp64_ok: bool,
    int_arith: bool,
    ret_alias: tuple,
    written: tuple[int, ...] = (),
) -> tuple[Any, bool | None, bool | None]:
    """Round float64 inputs through float32 / wrap int64 inputs through int32.

    Returns the dtype the outputs are narrowed to (None: leave them); for an int64 op (one with an
    int64 tensor input) whether wrapping an input (a tensor's value or a Python int beyond int32's
    range) changed it, None for any other op; and for a float64 op (one with a float64 tensor
    input) whether rounding a float64 input to float32 changed it, None for any other op.
    ``written``: positions of arguments the op writes that its returns do not alias
    (:data:`UNMARKED_WRITES`).
    """
    found = None
    saw_fp64 = saw_int64 = wrapped = rounded = False
    mutated = {a[1] for a in ret_alias if a is not None}.union(written)
    for i, a in enumerate(cargs):
        if type(a) is torch.Tensor:
            dt = a.dtype
            if dt is _F64 and fp64_ok:
                found = _F32
                saw_fp64 = True
                narrowed = a.to(_F32)
                rounded = rounded or _rounding_changed(a, narrowed)
                if i in mutated:
                    a.copy_(narrowed)
                else:
                    cargs[i] = narrowed.to(_F64)
            elif dt is _I64 and int_arith:
                found = _I32
                saw_int64 = True
                if not _beyond_int32(a):
                    continue  # int32 holds every value: narrowing changes nothing
                wrapped = True
                if i in mutated:
                    a.copy_(a.to(_I32))
                else:
                    cargs[i] = a.to(_I32).to(_I64)
        elif int_arith and type(a) is int and not (_I32_MIN <= a < 2**31):
            cargs[i] = _wrap_int(a)
            wrapped = True
    if saw_fp64:
        RULE_OPS["fp64"] += 1
    if saw_int64:
        RULE_OPS["int64"] += 1
    return found, (wrapped if saw_int64 else None), (rounded if saw_fp64 else None)


def narrow_outputs(
    out: Any, target: Any, wrapped: bool | None = None, rounded: bool | None = None
) -> None:
    """Narrow an op's results to ``target`` in place; count an op whose narrowing changed a value.

    ``wrapped`` and ``rounded`` are :func:`narrow_inputs`'s answers (None: no int64 op, no float64
    op; an int32 tensor's Python int wraps on CPU as well). An int64 result changes only where it
    holds a value beyond int32's range, so only such results are rewritten. A float64 op changed a
    value where a float64 result float32 cannot hold was rounded, or where a rounded input went
    into a result that keeps more than float32's precision (a float64 result, an index, a
    comparison): a float32 result (``x64.float()``) rounds it on CUDA as well.
    """
    changed = _narrow_output(out, target)
    if wrapped is not None and (wrapped or (changed and target is _I32)):
        RULE_OPS["int64-wrapped"] += 1
    if rounded is not None and (
        (changed and target is _F32) or (rounded and not _no_wider_than_float32(out))
    ):
        RULE_OPS["fp64-rounded"] += 1


def _no_wider_than_float32(out: Any) -> bool:
    """Whether the results are float32, float16 or bfloat16 tensors (none at all: False)."""
    if isinstance(out, torch.Tensor):
        return out.is_floating_point() and out.dtype is not _F64
    if isinstance(out, (tuple, list)) and out:
        return all(_no_wider_than_float32(o) for o in out)
    return False


def _narrow_output(out: Any, target: Any) -> bool:
    """Narrow one result (or a tuple/list of them); whether that changed a value."""
    if isinstance(out, torch.Tensor):
        src = _F64 if target is _F32 else _I64
        if out.dtype is not src:
            return False
        if target is _I32 and not _beyond_int32(out):
            return False
        narrowed = out.to(target)
        changed = target is _I32 or _rounding_changed(out, narrowed)
        out.copy_(narrowed)
        return changed
    if isinstance(out, (tuple, list)):
        changed = False
        for o in out:
            changed = _narrow_output(o, target) or changed
        return changed
    return False


def _bf16_split(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Split an fp32 tensor into n bf16-representable fp32 terms (hi, mid, lo)."""
    parts = []
    rest = t
    for _ in range(n):
        p = rest.to(_BF16).to(_F32)
        parts.append(p)
        rest = rest - p
    return parts


_PASS_PAIRS = {
    1: ((0, 0),),
    3: ((0, 0), (0, 1), (1, 0)),
    6: ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0)),
}


def matmul_passes(func: Any, base: str, pos: tuple, cargs: list, ckw: dict, passes: int) -> Any:
    """Run a matmul-like op as bf16 multiplies with fp32 accumulation (1, 3 or 6 ``passes``)."""
    ops = [cargs[p] for p in pos]
    if not all(isinstance(o, torch.Tensor) and o.dtype is _F32 for o in ops):
        return func(*cargs, **ckw)
    RULE_OPS["tpu-matmul"] += 1
    n = passes
    if passes == 1:
        RULE_OPS["tpu-matmul-1pass"] += 1
    if base == "convolution_backward":
        return _conv_backward_passes(func, cargs, ckw, n)
    nterms = {1: 1, 3: 2, 6: 3}[n]
    if base.startswith("_scaled_dot_product"):
        # Attention's matmuls are inside one kernel (a softmax between them), so their passes
        # cannot be summed from separate calls: each input keeps what the mode's bf16 terms hold
        # of it (one term at DEFAULT, two at HIGH, three, all of float32's bits, at HIGHEST).
        # Rounding them to one term whatever the mode made attention under 'highest' differ
        # from the reference by bfloat16's rounding, with no rule to name.
        args = list(cargs)
        for p in pos:
            args[p] = sum(_bf16_split(cargs[p], nterms))
        return func(*args, **ckw)
    a_parts = _bf16_split(cargs[pos[0]], nterms)
    b_parts = _bf16_split(cargs[pos[1]], nterms)
    result = None
    for k, (i, j) in enumerate(_PASS_PAIRS[n]):
        args = list(cargs)
        args[pos[0]] = a_parts[i]
        args[pos[1]] = b_parts[j]
        kw = ckw
        if k > 0:
            if base in _BIAS_FREE:
                kw = dict(ckw, beta=0)
            elif base == "convolution":
                args[2] = None
        r = func(*args, **kw)
        result = r if result is None else result.add_(r)
    return result


def _conv_backward_passes(func: Any, cargs: list, ckw: dict, n: int) -> Any:
    go, inp, w = cargs[0], cargs[1], cargs[2]
    mask = list(cargs[-1])
    nterms = {1: 1, 3: 2, 6: 3}[n]
    go_p, in_p, w_p = _bf16_split(go, nterms), _bf16_split(inp, nterms), _bf16_split(w, nterms)
    gi = gw = None
    for i, j in _PASS_PAIRS[n]:
        args = list(cargs)
        args[0], args[1], args[2] = go_p[i], in_p[j], w_p[j]
        args[-1] = [mask[0], mask[1], False]
        r = func(*args, **ckw)
        if mask[0]:
            gi = r[0] if gi is None else gi.add_(r[0])
        if mask[1]:
            gw = r[1] if gw is None else gw.add_(r[1])
    gb = None
    if mask[2]:
        args = list(cargs)
        args[-1] = [False, False, True]
        gb = func(*args, **ckw)[2]  # bias grad is a reduction on the vector unit: full fp32
    return gi, gw, gb

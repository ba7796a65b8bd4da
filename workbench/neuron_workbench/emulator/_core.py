"""The emulator's pure-Python core, used where no C++ compiler is available.

An :class:`EmulatedTensor` is a wrapper subclass whose device is ``neuron:0`` (or ``tpu:0``) and
whose data is a CPU tensor in ``.elem``. ``__torch_dispatch__`` runs every ATen op on the CPU
payloads, after the device check and the profile's numerics policy, and decides per op (once, then
cached) whether it is native, a CPU fallback (recorded, or an error on tpu), or a composite to be
decomposed into other ops the way the real dispatcher would. The runtime state both cores read (the
device, the profile's native ops, fallback and numerics switches) lives here; the policy tables and
numerics both cores apply are in ``_policy`` (the native core, ``emulator/native``, reads them
through ``_native_core``), the memory accounting in ``_memory``. Design:
``shared/notes/emulator.md``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet

from neuron_workbench.dispatch_calls import bump_unchanged, written_through_lists
from neuron_workbench.emulator import events as _events
from neuron_workbench.emulator._memory import MEM, Allocation
from neuron_workbench.emulator._policy import (
    DEVICE_EXEMPT,
    INT_ARITH,
    INTERNAL,
    K_DECOMP,
    K_DEVICE,
    K_FALLBACK,
    K_IMPL,
    K_IMPLICIT,
    K_RUN,
    LAYOUT_BEHAVIOUR,
    NO_DECOMP,
    NO_FP64_ROUND,
    RESTRIDE,
    RULE_OPS,
    SHARES,
    dtype_gaps,
    library_op_kind,
    matmul_operands,
    matmul_passes,
    memory_format_error,
    narrow_inputs,
    narrow_outputs,
    overload_name,
    run_widened,
    sparse_layout_of,
    unmarked_writes,
)

# ---------------------------------------------------------------------------------------------
# Runtime state (module globals: read on every op, so kept flat)

DEVICE_TYPE = "neuron"
DEVICE: Any = None  # torch.device("neuron", 0), set by configure_device() after the rename
NATIVE: frozenset[str] = frozenset()
CPU_FALLBACK = True
NARROW_64BIT = True  # neuron: float64 computed as float32, int64 arithmetic as int32
MATMUL_PASSES = 0  # 0: exact fp32; 1/3/6: bf16 passes (tpu DEFAULT/HIGH/HIGHEST, neuron what-if)
TPU_WARN_EVERY_CALL = True
NATIVE_CORE: Any = None  # the compiled core (emulator/native) when it runs the device, else None

_PY_KEY = DispatchKeySet(DispatchKey.Python)
_CEA = DispatchKey.CompositeExplicitAutograd
_CEANF = DispatchKey.CompositeExplicitAutogradNonFunctional
_CIA = DispatchKey.CompositeImplicitAutograd
_PU1 = DispatchKey.PrivateUse1
_perf = time.perf_counter


def configure_device(device_type: str) -> None:
    """Set the device the wrappers report (called once at install)."""
    global DEVICE_TYPE, DEVICE
    DEVICE_TYPE = MEM.device_type = device_type
    DEVICE = torch.device(device_type, 0)


class GrowthError(NotImplementedError):
    """An in-place op needed to grow a tensor's storage: impossible for a Python backend."""


# ---------------------------------------------------------------------------------------------
# The tensor


class EmulatedTensor(torch.Tensor):
    """A tensor on the emulated device; its data is the CPU tensor ``elem``.

    No ``__slots__`` on purpose: ``Module._apply`` swaps wrapper subclasses with
    ``torch.utils.swap_tensors``, which needs equal slots, and swaps ``__dict__`` (the payload).
    """

    elem: torch.Tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False) -> EmulatedTensor:
        """Wrap a CPU tensor (advanced use; prefer ``x.to(device)``)."""
        return _wrap(elem, None, requires_grad)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        s = repr(self.elem)
        cut = len(s) - 1
        for kw in (", size=", ", dtype=", ", layout="):
            i = s.find(kw)
            if i != -1 and i < cut:
                cut = i
        s = s[:cut] + f", device='{DEVICE}'" + s[cut:]
        if self.grad_fn is not None:
            s = s[:-1] + f", grad_fn=<{type(self.grad_fn).__name__}>)"
        elif self.requires_grad:
            s = s[:-1] + ", requires_grad=True)"
        return s

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def numpy(self, *, force: bool = False) -> Any:
        """Raise as CUDA does; with ``force=True`` copy to CPU first."""
        if force:
            return self.detach().cpu().numpy()
        raise TypeError(
            f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the "
            "tensor to host memory first."
        )

    def tolist(self) -> Any:
        """Copy to CPU and convert."""
        return self.elem.tolist()

    def __reduce_ex__(self, proto: int) -> Any:
        # The format torch uses for storage-less PrivateUse1 tensors: checkpoints load with
        # weights_only=True, and load on machines without the emulator (map_location="cpu").
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.elem.detach().clone(), self.dtype, str(DEVICE), self.requires_grad),
        )

    def __deepcopy__(self, memo: dict) -> EmulatedTensor:
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_(True)
        import copy

        for k, v in self.__dict__.items():
            if k not in ("elem", "_acct"):
                new.__dict__[k] = copy.deepcopy(v, memo)
        memo[id(self)] = new
        return new

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict, meta: Any, outer_size: Any, outer_stride: Any
    ) -> EmulatedTensor:
        # The payload may be a FakeTensor or FunctionalTensor under torch.compile.
        return _wrap(inner["elem"], None, False)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        plan = _PLANS.get(func)
        if plan is None:
            plan = _make_plan(func)
        kwargs = kwargs or {}
        # a foreach or fused in-place op bumps no version of a subclass tensor it wrote
        # (pytorch/pytorch#191154): the native core bumps them too (emucore.cpp's bump_written)
        written = written_through_lists(func, args, kwargs)
        out = _dispatch(func, plan, args, kwargs)
        if written:
            bump_unchanged(written)
        return out


_make_wrapper = torch.Tensor._make_wrapper_subclass
_set_conj = torch._C._set_conj
_STRIDED = torch.strided
_set_neg = torch._C._set_neg
_Emu = EmulatedTensor


class _LayoutError(Exception):
    def __init__(self, layout: Any) -> None:
        self.layout = layout


def layout_error(layout: Any, overload: str | None) -> NotImplementedError:
    """The one-line error for a sparse (or other non-strided) tensor on the emulated device."""
    op = f" by {overload}" if overload else ""
    behaviour = LAYOUT_BEHAVIOUR.get(DEVICE_TYPE, "the real backend supports strided tensors")
    return NotImplementedError(
        f"emulated {DEVICE_TYPE}: a {layout} tensor cannot be created on {DEVICE}{op}: {behaviour}. "
        "Keep it on CPU, or call .to_dense() before moving it to the device."
    )


def _wrap(
    elem: torch.Tensor, acct: Allocation | None, requires_grad: bool = False
) -> EmulatedTensor:
    if elem.layout is not _STRIDED:
        raise _LayoutError(elem.layout)
    if acct is None:
        acct = Allocation(elem.untyped_storage().nbytes() if elem.layout == torch.strided else 0)
    r = _make_wrapper(
        _Emu,
        elem.size(),
        strides=elem.stride(),
        storage_offset=elem.storage_offset(),
        dtype=elem.dtype,
        layout=elem.layout,
        device=DEVICE,
        requires_grad=requires_grad,
    )
    d = r.__dict__
    d["elem"] = elem
    d["_acct"] = acct
    if elem.is_complex() and elem.is_conj():
        # Lazy conjugation is a bit on the tensor: the wrapper must carry the payload's, or
        # composites that test it (real, view_as_real in the backward of hfft) see a
        # different tensor than the kernel that runs on the payload.
        _set_conj(r, True)
    if elem.is_neg():
        _set_neg(r, True)
    return r


def wrap_new(elem: torch.Tensor) -> EmulatedTensor:
    """Wrap a fresh CPU tensor as a new device tensor (with memory accounting)."""
    return _wrap(elem, Allocation(elem.nbytes))


# ---------------------------------------------------------------------------------------------
# Per-op plans

_PLANS: dict[Any, tuple] = {}
CPU_IMPLS: dict[Any, Any] = {}  # op -> python impl on CPU payloads (ops without a CPU kernel)
#: aten ops the emulator gives a PrivateUse1 kernel of its own (kernels.register_all), which
#: inference mode reaches below autograd: called with the device tensors, as the dispatcher does
DEVICE_KERNELS: set[str] = set()


def is_native(func: Any) -> bool:
    """Whether the active profile runs ``func`` on the device."""
    base = func._schema.name.split("::", 1)[1]
    if base in NATIVE:
        return True
    # Structured family rule (shared/coverage/README.md): x_ and x.out run through a registered
    # x.out kernel via PyTorch's generated CompositeExplicitAutogradNonFunctional wrappers.
    if base.endswith("_") and base[:-1] in NATIVE:
        return func.has_kernel_for_dispatch_key(_CEANF)
    return False


def _make_plan(func: Any) -> tuple:
    schema = func._schema
    ns, base = schema.name.split("::", 1)
    view = bool(func.is_view)
    # return index -> ("a", position) or ("k", name) for outputs that alias a mutated input
    args_info = list(schema.arguments)
    ret_alias: list[Any] = []
    mutates = False
    has_out = False
    for r in schema.returns:
        target = None
        ai = r.alias_info
        if ai is not None and ai.is_write:
            mutates = True
            for i, a in enumerate(args_info):
                if a.alias_info is not None and a.alias_info.before_set == ai.before_set:
                    if a.kwarg_only:
                        target = ("k", a.name)
                        has_out = True
                    else:
                        target = ("a", i)
                    break
        ret_alias.append(target)
    if not mutates:
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in args_info)
    implicit = base not in NO_DECOMP and torch._C._dispatch_has_kernel_for_dispatch_key(
        schema.name + (f".{schema.overload_name}" if schema.overload_name else ""),
        "CompositeImplicitAutograd",
    )
    if func in CPU_IMPLS:
        kind = K_IMPL
    elif ns != "aten":
        kind = library_op_kind(func, view)
    elif base in DEVICE_KERNELS:
        kind = K_DEVICE
    elif base in INTERNAL or is_native(func) or (view and not implicit):
        kind = K_RUN
    elif base not in NO_DECOMP and func.has_kernel_for_dispatch_key(_CEA):
        # The real dispatcher runs a CompositeExplicitAutograd kernel on the device when the
        # backend has no kernel of its own: check its pieces op by op. (Structured
        # CompositeExplicitAutogradNonFunctional wrappers only reach the same op's out= form.)
        kind = K_DECOMP
    elif implicit:
        # A CompositeImplicitAutograd op called below autograd (from another op's kernel, such as
        # SDPA's math path calling softmax.int, or any op under torch.inference_mode(), which
        # leaves the autograd keys out): a backend without a kernel of its own runs the
        # decomposition, as the real dispatcher does, never a CPU fallback of the whole op. So
        # does a view such as to.dtype_layout: run on the payload, x.cpu() stayed on the device.
        kind = K_IMPLICIT
    else:
        kind = K_FALLBACK
    resync = has_out or base in RESTRIDE
    share = view or base in SHARES
    exempt = base in DEVICE_EXEMPT
    matmul = matmul_operands(base)
    numerics = (
        ns == "aten" and not view and base not in NO_FP64_ROUND,
        base in INT_ARITH,
        matmul,
        base,
        # The device's own kernel covers dtypes the CPU one lacks (CUDA's, by OpInfo): only
        # for ops the device runs; a CPU fallback fails on them as the real one would.
        dtype_gaps().get(overload_name(func)) if kind == K_RUN else None,
    )
    to_cpu = base == "_to_copy"
    # Positional arguments typed plain Tensor: a wrapped number (the 0-dim tensor C++ makes of a
    # Python scalar) reaches Python as a number there (see _rewrap_numbers).
    tensor_slots = tuple(
        i for i, a in enumerate(args_info) if not a.kwarg_only and str(a.type) == "Tensor"
    )
    plan = (
        kind,
        tuple(ret_alias),
        resync,
        share,
        exempt,
        numerics,
        to_cpu,
        base,
        overload_name(func),
        tensor_slots,
    )
    _PLANS[func] = plan
    return plan


def reset_plans() -> None:
    """Forget cached per-op decisions (after the profile or a policy changes)."""
    _PLANS.clear()
    if NATIVE_CORE is not None:
        NATIVE_CORE.configure(CPU_FALLBACK, NARROW_64BIT, MATMUL_PASSES)
        NATIVE_CORE.reset_plans()


# ---------------------------------------------------------------------------------------------
# Dispatch


def not_implemented_error(overload: str) -> RuntimeError:
    """The error for an op outside the coverage when CPU fallback is off."""
    if DEVICE_TYPE == "tpu":
        # TorchTPU's exact text (torchtpu.md §3).
        return RuntimeError(
            f"operator '{overload}' is not implemented for TPU. Please file a feature request"
        )
    return RuntimeError(
        f"operator '{overload}' is not implemented for emulated {DEVICE_TYPE} and CPU fallback is "
        "disabled (neuron_workbench.emulator.configure(cpu_fallback=True) re-enables it)"
    )


def _device_error(other: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{DEVICE} and {other.device}!"
    )


def _unwrap_list(seq: Any, exempt: bool) -> Any:
    out = []
    for x in seq:
        if type(x) is _Emu:
            out.append(x.elem)
        elif isinstance(x, _Emu):
            out.append(x.elem)
        else:
            if not exempt and isinstance(x, torch.Tensor) and x.dim() > 0:
                raise _device_error(x)
            out.append(x)
    return type(seq)(out) if type(seq) is tuple else out


def _dispatch(func: Any, plan: tuple, args: Any, kwargs: dict) -> Any:
    kind, ret_alias, resync, share, exempt, numerics, to_cpu, base, overload, tensor_slots = plan

    if kind == K_DEVICE:
        # A kernel registered for the device itself (a library's PrivateUse1 kernel): it gets
        # the device tensors, and the ops it calls come back here one by one.
        return func._op_dk(_PU1, *args, **kwargs)
    if kind == K_IMPLICIT:
        if sparse_layout_of(base, kwargs) is None and not any(
            isinstance(a, torch.Tensor) and a.layout is not _STRIDED for a in args
        ):
            return func._op_dk(_CIA, *args, **kwargs)
        kind = K_FALLBACK  # sparse layouts: the real backend's sparse handling (an error here)
    if kind == K_DECOMP:
        _events.begin_tentative()
        try:
            out = func._op_dk(_CEA, *args, **kwargs)
        except GrowthError:
            # The composite grows an empty(0) out= tensor, which a Python backend cannot do:
            # run the whole op on CPU instead, from now on.
            _events.end_tentative(False)
            plan = (K_FALLBACK, *plan[1:])
            _PLANS[func] = plan
            kind = K_FALLBACK
        except BaseException:
            _events.end_tentative(True)
            raise
        else:
            _events.end_tentative(True)
            return out

    # unwrap (no pytree: ATen args are at most lists of tensors)
    cargs = []
    first = None
    for a in args:
        t = type(a)
        if t is _Emu:
            if first is None:
                first = a
            cargs.append(a.elem)
        elif t is list or t is tuple:
            cargs.append(_unwrap_list(a, exempt))
        elif isinstance(a, torch.Tensor):
            if isinstance(a, _Emu):
                if first is None:
                    first = a
                cargs.append(a.elem)
            else:
                if not exempt and a.dim() > 0:
                    raise _device_error(a)
                cargs.append(a)
        else:
            cargs.append(a)
    ckw = kwargs
    if kwargs:
        refused = memory_format_error(DEVICE_TYPE, overload, kwargs)
        if refused is not None:
            raise refused
        ckw = {}
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                if isinstance(v, _Emu):
                    v = v.elem
                elif not exempt and v.dim() > 0:
                    raise _device_error(v)
            elif k == "device":
                if v is not None and torch.device(v).type == DEVICE_TYPE:
                    v = torch.device("cpu")
            elif type(v) is list or type(v) is tuple:
                v = _unwrap_list(v, exempt)
            ckw[k] = v

    if kind == K_FALLBACK and not CPU_FALLBACK:
        layout = sparse_layout_of(base, ckw)
        if layout is not None:
            # The real backend routes these to its sparse handling, not the op fallback.
            raise layout_error(layout, overload)
        raise not_implemented_error(overload)

    # numerics policy
    fp64_ok, int_arith, matmul, _, gaps = numerics
    post = None
    wrapped = rounded = None
    if NARROW_64BIT and (fp64_ok or int_arith):
        post, wrapped, rounded = narrow_inputs(
            cargs, ckw, fp64_ok, int_arith, ret_alias, unmarked_writes(overload, cargs)
        )

    t0 = _perf()
    fn = CPU_IMPLS[func] if kind == K_IMPL else func
    for i in tensor_slots:
        if i < len(cargs) and type(cargs[i]) in _NUMBERS:
            fn = _rewrap_numbers(func, fn, cargs, tensor_slots)
            break
    try:
        if matmul is not None and MATMUL_PASSES:
            out = matmul_passes(fn, base, matmul, cargs, ckw, MATMUL_PASSES)
        elif gaps is not None:
            out = run_widened(fn, gaps, cargs, ckw)
        else:
            out = fn(*cargs, **ckw)
    finally:
        # Recorded even when the CPU kernel refused the inputs: the event explains the error.
        if kind == K_FALLBACK:
            _record_fallback(overload, args, _perf() - t0)

    if post is not None:
        narrow_outputs(out, post, wrapped, rounded)

    if to_cpu:
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type != DEVICE_TYPE:
            return out

    # wrap, keeping identity for in-place and out= results
    try:
        if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
            alias = ret_alias[0] if ret_alias else None
            if alias is not None:
                orig = args[alias[1]] if alias[0] == "a" else kwargs[alias[1]]
                if resync and type(orig) is _Emu:
                    _resync(orig)
                return orig
            if share and first is not None:
                return _wrap(out, first.__dict__["_acct"])
            return _wrap(out, None)
        if type(out) is tuple or type(out) is list:
            res = []
            acct = first.__dict__["_acct"] if share and first is not None else None
            for i, o in enumerate(out):
                alias = ret_alias[i] if i < len(ret_alias) else None
                if alias is not None:
                    orig = args[alias[1]] if alias[0] == "a" else kwargs[alias[1]]
                    if resync and type(orig) is _Emu:
                        _resync(orig)
                    res.append(orig)
                elif isinstance(o, torch.Tensor):
                    res.append(_wrap(o, acct))
                elif type(o) is list:
                    res.append([_wrap(x, acct) if isinstance(x, torch.Tensor) else x for x in o])
                else:
                    res.append(o)
            return tuple(res) if type(out) is tuple else res
    except _LayoutError as exc:
        raise layout_error(exc.layout, overload) from None
    if out is None and ret_alias:
        # ops like _foreach_add_ return nothing but mutate
        return None
    return out


_NUMBERS = (int, float, bool, complex)


def _record_fallback(overload: str, args: Any, seconds: float) -> None:
    warning = None
    if DEVICE_TYPE == "tpu" and TPU_WARN_EVERY_CALL:
        # TorchTPU logs this on every call (ABSL_LOG(WARNING)) when fallback is enabled.
        warning = f"W operator '{overload}' is not implemented for TPU. Falling back to CPU\n"
    _events.record_event(overload.partition(".")[0], overload, args, seconds, warning)


def _rewrap_numbers(func: Any, fn: Any, cargs: list, tensor_slots: tuple) -> Any:
    """The callable that accepts a Python number where ``func`` wants a Tensor.

    A composite that runs on the device (e.g. ``copysign.Scalar``) calls the Tensor overload with
    a wrapped number; Python receives it as a number, and most overloads refuse a number for a
    Tensor argument. The overload packet resolves it the way C++ meant it (the ``.Scalar``
    overload wraps the number with the same type-promotion rules). Without such an overload, a
    0-dim tensor stands in (promotion can differ for mixed categories).
    """
    if fn is not func:
        return fn
    packet = getattr(getattr(torch.ops, func.namespace), func._schema.name.split("::", 1)[1])

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return packet(*args, **kwargs)
        except RuntimeError:
            args = list(args)
            for i in tensor_slots:
                if i < len(args) and type(args[i]) in _NUMBERS:
                    args[i] = torch.tensor(args[i])
            return func(*args, **kwargs)

    return call


def _resync(w: EmulatedTensor) -> None:
    """Make the wrapper's sizes/strides follow its payload after an op that restrided it."""
    e = w.elem
    if w.shape == e.shape and w.stride() == e.stride() and w.storage_offset() == e.storage_offset():
        return
    with torch._C._ExcludeDispatchKeyGuard(_PY_KEY), torch.no_grad():
        try:
            torch.ops.aten.as_strided_.default(w, e.size(), e.stride(), e.storage_offset())
        except RuntimeError as exc:
            # Put the payload back to the wrapper's geometry so the tensor stays consistent.
            e.as_strided_(w.size(), w.stride(), w.storage_offset())
            raise GrowthError(
                f"emulated {DEVICE_TYPE}: cannot grow a tensor in place (resize_, set_ or out= "
                f"to a larger size: {tuple(w.shape)} -> {tuple(e.shape)}); a Python backend "
                "cannot resize device storage. Allocate a new tensor of the final size instead."
            ) from exc


# ---- numerics counters ---------------------------------------------------------------------


def rule_ops() -> dict[str, int]:
    """Ops each numeric rule touched since the last :func:`reset_rule_ops` (both cores)."""
    counts = dict(RULE_OPS)
    if NATIVE_CORE is not None:
        fp64, int64, int64_wrapped, fp64_rounded = NATIVE_CORE.rule_counts()
        counts["fp64"] += fp64
        counts["int64"] += int64
        counts["int64-wrapped"] += int64_wrapped
        counts["fp64-rounded"] += fp64_rounded
    return counts


def reset_rule_ops() -> None:
    """Zero the rule counters."""
    for key in RULE_OPS:
        RULE_OPS[key] = 0
    if NATIVE_CORE is not None:
        NATIVE_CORE.reset_rule_counts()

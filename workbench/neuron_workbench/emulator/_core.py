"""The emulator's shared policy tables, and its pure-Python core.

The tables (coverage, the device-exempt, 64-bit and matmul op sets, refusal texts, the bf16 matmul
passes) serve both cores; the native core (``emulator/native``, the default where it can be built)
reads them through ``_native_core``. The rest of this module is the pure-Python core, used where
no C++ compiler is available: an :class:`EmulatedTensor` is a wrapper subclass whose device is
``neuron:0`` (or ``tpu:0``) and whose data is a CPU tensor in ``.elem``. ``__torch_dispatch__``
runs every ATen op on the CPU payloads, after the device check and the profile's numerics
policy, and decides per op (once, then cached) whether it is native, a CPU fallback (recorded, or
an error on tpu), or a composite to be decomposed into other ops the way the real dispatcher
would. Design: ``shared/notes/emulator.md``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet

from neuron_workbench.emulator import events as _events

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
# Ops each numeric rule touched (evidence for hints): matmul-like ops computed with bf16 passes,
# and (Python core only; the native core counts its own in C++) ops with float64 / int64 inputs
# computed narrower. One increment per op.
RULE_OPS = {"tpu-matmul": 0, "fp64": 0, "int64": 0}

_PY_KEY = DispatchKeySet(DispatchKey.Python)
_CEA = DispatchKey.CompositeExplicitAutograd
_CEANF = DispatchKey.CompositeExplicitAutogradNonFunctional
_CIA = DispatchKey.CompositeImplicitAutograd
_PU1 = DispatchKey.PrivateUse1
_perf = time.perf_counter


def configure_device(device_type: str) -> None:
    """Set the device the wrappers report (called once at install)."""
    global DEVICE_TYPE, DEVICE
    DEVICE_TYPE = device_type
    DEVICE = torch.device(device_type, 0)


class GrowthError(NotImplementedError):
    """An in-place op needed to grow a tensor's storage: impossible for a Python backend."""


# ---------------------------------------------------------------------------------------------
# Memory accounting: one _Alloc per payload storage, shared by every wrapper viewing it; freed when
# the last wrapper goes away (refcounting, so immediate in CPython).

_mem_lock = threading.RLock()


class _Mem:
    current = 0
    peak = 0
    allocated_total = 0
    freed_total = 0
    num_allocs = 0
    num_frees = 0
    num_ooms = 0
    capacity: int | None = None

    def reset_peak(self) -> None:
        """Set the peak to the current allocation."""
        with _mem_lock:
            self.peak = self.current

    def reset_accumulated(self) -> None:
        """Zero the allocated/freed totals and counters."""
        with _mem_lock:
            self.allocated_total = self.freed_total = self.num_allocs = self.num_frees = 0
            self.num_ooms = 0


MEM = _Mem()


class _Alloc:
    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        with _mem_lock:
            cap = MEM.capacity
            if cap is not None and MEM.current + nbytes > cap:
                MEM.num_ooms += 1
                self.nbytes = 0
                raise torch.OutOfMemoryError(
                    f"emulated {DEVICE_TYPE} out of memory: tried to allocate {nbytes} bytes "
                    f"({MEM.current} bytes allocated, capacity {cap} bytes set by "
                    f"emulate(capacity_bytes=...))"
                )
            self.nbytes = nbytes
            MEM.current += nbytes
            MEM.allocated_total += nbytes
            MEM.num_allocs += 1
            if MEM.current > MEM.peak:
                MEM.peak = MEM.current

    def __del__(self) -> None:
        n = self.nbytes
        if n:
            with _mem_lock:
                MEM.current -= n
                MEM.freed_total += n
                MEM.num_frees += 1

    def __deepcopy__(self, memo: dict) -> _Alloc:  # never duplicate an accounting record
        return self

    def __reduce__(self) -> Any:
        raise TypeError("emulator memory record is not picklable")


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
        return _dispatch(func, plan, args, kwargs or {})


_make_wrapper = torch.Tensor._make_wrapper_subclass
_set_conj = torch._C._set_conj
_STRIDED = torch.strided
_set_neg = torch._C._set_neg
_Emu = EmulatedTensor


class _LayoutError(Exception):
    def __init__(self, layout: Any) -> None:
        self.layout = layout


# Vendor text for non-strided layouts (shared/notes/torchtpu.md §3; shared/coverage/).
_LAYOUT_BEHAVIOUR = {
    "tpu": "sparse operators are not supported on TPU yet (TorchTPU's sparse-op fallback)",
    "neuron": "TorchNeuron's registered coverage has no op for sparse tensors (its kernels are "
    "registered for dense PrivateUse1 tensors only)",
}


def layout_error(layout: Any, overload: str | None) -> NotImplementedError:
    """The one-line error for a sparse (or other non-strided) tensor on the emulated device."""
    op = f" by {overload}" if overload else ""
    behaviour = _LAYOUT_BEHAVIOUR.get(DEVICE_TYPE, "the real backend supports strided tensors")
    return NotImplementedError(
        f"emulated {DEVICE_TYPE}: a {layout} tensor cannot be created on {DEVICE}{op}: {behaviour}. "
        "Keep it on CPU, or call .to_dense() before moving it to the device."
    )


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


def _wrap(elem: torch.Tensor, acct: _Alloc | None, requires_grad: bool = False) -> EmulatedTensor:
    if elem.layout is not _STRIDED:
        raise _LayoutError(elem.layout)
    if acct is None:
        acct = _Alloc(elem.untyped_storage().nbytes() if elem.layout == torch.strided else 0)
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
    return _wrap(elem, _Alloc(elem.nbytes))


# ---------------------------------------------------------------------------------------------
# Per-op plans

K_RUN, K_FALLBACK, K_DECOMP, K_IMPL, K_IMPLICIT, K_DEVICE = 0, 1, 2, 3, 4, 5

_PLANS: dict[Any, tuple] = {}
CPU_IMPLS: dict[Any, Any] = {}  # op -> python impl on CPU payloads (ops without a CPU kernel)

# Ops that must never be reported or decomposed: host/device plumbing the real backends register.
_INTERNAL = frozenset(
    {
        "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "_local_scalar_dense",
        "empty", "empty_strided", "set_", "resize_", "lift_fresh", "lift_fresh_copy",
        "_has_compatible_shallow_copy_type", "is_pinned", "record_stream", "_unsafe_view",
        "detach", "alias", "_reshape_alias", "view", "as_strided", "clone",
    }
)  # fmt: skip
# Composites the emulator does not decompose: they allocate empty(0) and grow it through out=.
_NO_DECOMP = frozenset({"arange", "eye", "linspace", "logspace", "range"})
# Mixing devices is allowed for these (as on CUDA): copies and indexing with CPU indices.
_DEVICE_EXEMPT = frozenset(
    {
        "copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "index", "index_put",
        "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put", "set_",
        "_has_compatible_shallow_copy_type",
    }
)  # fmt: skip
# Ops that can change a mutated tensor's sizes/strides (besides every out= op).
_RESTRIDE = frozenset(
    {
        "resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_", "squeeze_",
        "unsqueeze_", "swapdims_", "swapaxes_", "_resize_output_",
    }
)  # fmt: skip
# Shares storage with its input although the schema does not mark it as a view.
_SHARES = frozenset({"_unsafe_view", "_reshape_alias", "lift_fresh"})
# Numerics: integer arithmetic that wraps like int32 on neuron (indexing ops keep int64).
_INT_ARITH = frozenset(
    {
        "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "neg", "neg_", "sum", "cumsum",
        "cumsum_", "prod", "cumprod", "mm", "bmm", "addmm", "dot", "mv", "pow", "pow_",
        "floor_divide", "floor_divide_", "remainder", "remainder_", "fmod", "fmod_", "abs",
        "abs_", "square", "__lshift__", "bitwise_left_shift", "addcmul", "addcmul_", "matmul",
        "div", "div_",
    }
)  # fmt: skip
# Not subject to the float64 rounding: data movement, views, comparisons of stored values.
_NO_FP64_ROUND = _INTERNAL | frozenset(
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


#: PyTorch's own namespaces outside ``aten``: ``prims`` ops appear in the graphs decompositions make
#: for ``torch.compile`` (batch norm's ``prims::var``), which the backends' compilers lower; they
#: are not a library's ops, and they ran on the device before library ops were told apart.
_TORCH_PRIMITIVES = frozenset({"prims"})


def _library_op_kind(func: Any, view: bool) -> int:
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
    name = _overload_name(func)
    if has(name, "PrivateUse1"):
        return K_DEVICE
    if has(name, "CompositeExplicitAutograd"):
        return K_DECOMP
    if has(name, "CompositeImplicitAutograd"):
        return K_IMPLICIT
    return K_FALLBACK


def _overload_name(func: Any) -> str:
    s = func._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


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
    if func in CPU_IMPLS:
        kind = K_IMPL
    elif ns != "aten":
        kind = _library_op_kind(func, view)
    elif view or base in _INTERNAL or is_native(func):
        kind = K_RUN
    elif base not in _NO_DECOMP and func.has_kernel_for_dispatch_key(_CEA):
        # The real dispatcher runs a CompositeExplicitAutograd kernel on the device when the
        # backend has no kernel of its own: check its pieces op by op. (Structured
        # CompositeExplicitAutogradNonFunctional wrappers only reach the same op's out= form.)
        kind = K_DECOMP
    elif base not in _NO_DECOMP and torch._C._dispatch_has_kernel_for_dispatch_key(
        schema.name + (f".{schema.overload_name}" if schema.overload_name else ""),
        "CompositeImplicitAutograd",
    ):
        # A CompositeImplicitAutograd op called below autograd (from another op's kernel, such as
        # SDPA's math path calling softmax.int): a backend without a kernel of its own runs the
        # decomposition, as the real dispatcher does, never a CPU fallback of the whole op.
        kind = K_IMPLICIT
    else:
        kind = K_FALLBACK
    resync = has_out or base in _RESTRIDE
    share = view or base in _SHARES
    exempt = base in _DEVICE_EXEMPT
    matmul = matmul_operands(base)
    numerics = (
        ns == "aten" and not view and base not in _NO_FP64_ROUND,
        base in _INT_ARITH,
        matmul,
        base,
        # The device's own kernel covers dtypes the CPU one lacks (CUDA's, by OpInfo): only
        # for ops the device runs; a CPU fallback fails on them as the real one would.
        dtype_gaps().get(_overload_name(func)) if kind == K_RUN else None,
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
        _overload_name(func),
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
    if NARROW_64BIT and (fp64_ok or int_arith):
        post = _narrow_inputs(cargs, ckw, fp64_ok, int_arith, ret_alias)

    t0 = _perf()
    fn = CPU_IMPLS[func] if kind == K_IMPL else func
    for i in tensor_slots:
        if i < len(cargs) and type(cargs[i]) in _NUMBERS:
            fn = _rewrap_numbers(func, fn, cargs, tensor_slots)
            break
    try:
        if matmul is not None and MATMUL_PASSES:
            out = _matmul_passes(fn, base, matmul, cargs, ckw)
        elif gaps is not None:
            out = run_widened(fn, gaps, cargs, ckw)
        else:
            out = fn(*cargs, **ckw)
    finally:
        # Recorded even when the CPU kernel refused the inputs: the event explains the error.
        if kind == K_FALLBACK:
            _record_fallback(overload, args, _perf() - t0)

    if post is not None:
        _narrow_outputs(out, post)

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
        if w._version:  # mutated by the kernel (rrelu_with_noise's noise)
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


def _wrap_int(v: int) -> int:
    return ((v - _I32_MIN) % 2**32) + _I32_MIN


def rule_ops() -> dict[str, int]:
    """Ops each numeric rule touched since the last :func:`reset_rule_ops` (both cores)."""
    counts = dict(RULE_OPS)
    if NATIVE_CORE is not None:
        fp64, int64 = NATIVE_CORE.rule_counts()
        counts["fp64"] += fp64
        counts["int64"] += int64
    return counts


def reset_rule_ops() -> None:
    """Zero the rule counters."""
    for key in RULE_OPS:
        RULE_OPS[key] = 0
    if NATIVE_CORE is not None:
        NATIVE_CORE.reset_rule_counts()


def _narrow_inputs(cargs: list, ckw: dict, fp64_ok: bool, int_arith: bool, ret_alias: tuple) -> Any:
    """Round float64 inputs through float32 / wrap int64 inputs through int32; report outputs to fix."""
    found = None
    saw_fp64 = saw_int64 = False
    mutated = {a[1] for a in ret_alias if a is not None}
    for i, a in enumerate(cargs):
        if type(a) is torch.Tensor:
            dt = a.dtype
            if dt is _F64 and fp64_ok:
                found = _F32
                saw_fp64 = True
                if i in mutated:
                    a.copy_(a.to(_F32))
                else:
                    cargs[i] = a.to(_F32).to(_F64)
            elif dt is _I64 and int_arith:
                found = _I32
                saw_int64 = True
                if i in mutated:
                    a.copy_(a.to(_I32))
                else:
                    cargs[i] = a.to(_I32).to(_I64)
        elif int_arith and type(a) is int and not (_I32_MIN <= a < 2**31):
            cargs[i] = _wrap_int(a)
    if saw_fp64:
        RULE_OPS["fp64"] += 1
    if saw_int64:
        RULE_OPS["int64"] += 1
    return found


def _narrow_outputs(out: Any, target: Any) -> None:
    if isinstance(out, torch.Tensor):
        src = _F64 if target is _F32 else _I64
        if out.dtype is src:
            out.copy_(out.to(target))
    elif isinstance(out, (tuple, list)):
        for o in out:
            _narrow_outputs(o, target)


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


def _matmul_passes(func: Any, base: str, pos: tuple, cargs: list, ckw: dict) -> Any:
    """Run a matmul-like op as bf16 multiplies with fp32 accumulation (1, 3 or 6 passes)."""
    ops = [cargs[p] for p in pos]
    if not all(isinstance(o, torch.Tensor) and o.dtype is _F32 for o in ops):
        return func(*cargs, **ckw)
    RULE_OPS["tpu-matmul"] += 1
    n = MATMUL_PASSES
    if base.startswith("_scaled_dot_product"):
        n = 1  # attention: inputs rounded once (documented approximation for HIGH/HIGHEST)
    if base == "convolution_backward":
        return _conv_backward_passes(func, cargs, ckw, n)
    nterms = {1: 1, 3: 2, 6: 3}[n]
    if base.startswith("_scaled_dot_product"):
        args = list(cargs)
        for p in pos:
            args[p] = cargs[p].to(_BF16).to(_F32)
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

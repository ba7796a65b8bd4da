"""The Python half of the native core (``emulator/native``): per-op plans, events, refusals.

The compiled backend asks Python once per op for its plan, made from the same tables as the
Python core (``_policy``): whether the profile runs it (silently), falls back to CPU (an event, or
TorchTPU's error when fallback is off), or has a Python implementation (SDPA's overrideable op;
matmuls while bf16 passes are on). Everything else, the hot path included, stays in C++.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from typing import Any

import torch

from neuron_workbench.emulator import _core, _policy
from neuron_workbench.emulator import events as _events

KIND_RUN, KIND_FALLBACK, KIND_PYTHON = 0, 1, 2
FLAG_EXEMPT, FLAG_FP64, FLAG_INT_ARITH, FLAG_MATMUL = 1, 2, 4, 8
# Bits 8 and up: the dtypes (bit = c10::ScalarType) the CPU kernel lacks; the core sends a call
# with an input of one of them to Python (run_python), which computes it wider.
GAP_SHIFT = 8
_SCALAR_TYPE = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
    torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15,
}  # fmt: skip

_LAYOUTS = {
    "Sparse": torch.sparse_coo,
    "SparseCsr": torch.sparse_csr,
    "SparseCsc": torch.sparse_csc,
    "SparseBsr": torch.sparse_bsr,
    "SparseBsc": torch.sparse_bsc,
    "Mkldnn": torch._mkldnn,  # type: ignore[attr-defined]
    "Jagged": torch.jagged,
}

_funcs: dict[str, Any] = {}


def _resolve(overload: str) -> Any:
    func = _funcs.get(overload)
    if func is None:
        ns, _, rest = overload.partition("::")
        name, _, ov = rest.partition(".")
        func = getattr(getattr(getattr(torch.ops, ns), name), ov or "default")
        _funcs[overload] = func
    return func


# The Python core's plan kinds, as the native core's: covered (silent), Python implementation,
# everything else a CPU fallback (composites reach the device's kernel only when registered whole).
_KINDS = {_core.K_RUN: KIND_RUN, _core.K_DEVICE: KIND_RUN, _core.K_IMPL: KIND_PYTHON}


def classify(overload: str) -> tuple[int, int]:
    """``(kind, flags)`` of an op reaching the device's boxed kernel (cached by the caller).

    Derived from the Python core's plan for the op, so both cores follow one set of rules.
    """
    plan = _core._make_plan(_resolve(overload))
    kind, exempt, (fp64_ok, int_arith, matmul, _base, gaps) = plan[0], plan[4], plan[5]
    flags = (
        (FLAG_EXEMPT if exempt else 0)
        | (FLAG_FP64 if fp64_ok else 0)
        | (FLAG_INT_ARITH if int_arith else 0)
        | (FLAG_MATMUL if matmul is not None else 0)
    )
    for dtype in gaps or ():
        flags |= 1 << (GAP_SHIFT + _SCALAR_TYPE[dtype])
    return _KINDS.get(kind, KIND_FALLBACK), flags


def on_fallback(overload: str, args: list, seconds: float) -> None:
    """Record one CPU-fallback call (``args`` are the device arguments, in schema order)."""
    schema = _resolve(overload)._schema
    # The event shows the op's inputs: positional arguments, as the Python core's events do.
    args = [v for a, v in zip(schema.arguments, args) if not a.kwarg_only]
    warning = None
    if _core.DEVICE_TYPE == "tpu" and _core.TPU_WARN_EVERY_CALL:
        # TorchTPU logs this on every call (ABSL_LOG(WARNING)) when fallback is enabled.
        warning = f"W operator '{overload}' is not implemented for TPU. Falling back to CPU\n"
    _events.record_event(schema.name, overload, args, seconds, warning)


def run_python(overload: str, args: list) -> Any:
    """Run an op with a Python implementation on CPU arguments (schema order)."""
    func = _resolve(overload)
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for a, v in zip(func._schema.arguments, args):
        if a.kwarg_only:
            keywords[a.name] = v
        else:
            positional.append(v)
    fn = _core.CPU_IMPLS.get(func, func)
    base = func._schema.name.split("::", 1)[1]
    pos = _policy.matmul_operands(base)
    if pos is None or not _core.MATMUL_PASSES:
        gaps = _policy.dtype_gaps().get(overload)
        if gaps is not None:  # sent here for a dtype the CPU kernel lacks
            return _policy.run_widened(fn, gaps, positional, keywords)
        return fn(*positional, **keywords)
    outs = [
        a.name
        for a in func._schema.arguments
        if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
    ]
    if not outs:
        return _policy.matmul_passes(fn, base, pos, positional, keywords, _core.MATMUL_PASSES)
    # A structured matmul reaches the device as its out= form (mm.out): the passes accumulate
    # into a fresh result, which then goes to the caller's out tensor.
    functional = getattr(torch.ops.aten, base).default
    rest = {k: v for k, v in keywords.items() if k not in outs}
    result = _policy.matmul_passes(functional, base, pos, positional, rest, _core.MATMUL_PASSES)
    out = keywords[outs[0]]
    if out.shape != result.shape:
        out.resize_(result.shape)
    out.copy_(result)
    return out


def refusal(overload: str, layout_name: str | None) -> tuple[str, str]:
    """``(exception type name, message)`` for an op the device does not run."""
    base = overload.partition("::")[2].partition(".")[0]
    layout = _LAYOUTS.get(layout_name) if layout_name else _core.sparse_layout_of(base, {})
    if layout is not None:
        return "NotImplementedError", str(_core.layout_error(layout, overload))
    return "RuntimeError", str(_core.not_implemented_error(overload))


class NativeMemory:
    """``_core.MEM``'s interface over the native allocator's counters."""

    def __init__(self, module: Any) -> None:
        self._m = module

    def _get(self, key: str) -> int:
        return int(self._m.memory_stats()[key])

    current = property(lambda self: self._get("current"))
    allocated_total = property(lambda self: self._get("allocated_total"))
    freed_total = property(lambda self: self._get("freed_total"))
    num_allocs = property(lambda self: self._get("num_allocs"))
    num_frees = property(lambda self: self._get("num_frees"))
    num_ooms = property(lambda self: self._get("num_ooms"))

    peak = property(lambda self: self._get("peak"))

    @property
    def capacity(self) -> int | None:
        cap = self._get("capacity")
        return None if cap < 0 else cap

    @capacity.setter
    def capacity(self, value: int | None) -> None:
        self._m.set_capacity(-1 if value is None else int(value))

    def reset_peak(self) -> None:
        """Set the peak to the current allocation."""
        self._m.reset_peak()

    def reset_accumulated(self) -> None:
        """Zero the allocated/freed totals and counters."""
        self._m.reset_accumulated()


_lock = threading.Lock()
# The buffer the core writes op names into, as a ctypes view: it keeps the caller's object alive
# and exported (an mmap cannot be closed, a bytearray not resized) while the core writes to it.
_last_op_view: Any = None
# The op classes' own ``__call__`` while recording wraps them (empty when not recording).
_OP_CALLS: dict[type, Any] = {}
# Namespaces whose ops do not enter their names: aten's the device's kernels record (prims break
# into aten ops), and the profiler's record_function markers (every optimizer step makes some) are
# no ops of the cell's.
_NOT_ENTERED = frozenset({"aten", "prims", "profiler"})
# Per op name: whether a wrapped call enters it (a lookup per call, no string work).
_ENTERS: dict[str, bool] = {}


def record_last_op(module: Any, slot: object | None) -> None:
    """Point the core's last-op recording at ``slot`` (a writable buffer), or stop it (None)."""
    global _last_op_view
    with _lock:
        if slot is None:
            module.set_last_op_slot(0, 0)
            _last_op_view = None
            _unwrap_op_calls()
            return
        with memoryview(slot) as view:  # type: ignore[arg-type]
            nbytes = view.nbytes
        if nbytes < 2:
            raise ValueError("record_last_op: the buffer must hold at least two bytes")
        # TypeError for a read-only buffer (bytes, a read-only mmap)
        array = (ctypes.c_char * nbytes).from_buffer(slot)  # type: ignore[arg-type]
        _wrap_op_calls(module)  # first: a failure leaves recording off as a whole
        module.set_last_op_slot(ctypes.addressof(array), nbytes)
        _last_op_view = array  # the previous buffer is released only after the switch


def _wrap_op_calls(module: Any) -> None:
    """Have ops registered outside aten (custom ops), called from Python, enter their names.

    Their kernels are not the device's (a custom op's Python body, a library's own kernel), so the
    core cannot see them run; the ops they run on the device nest inside their names.
    """
    if _OP_CALLS:
        return
    ops = torch._ops
    classes = [
        (ops.OpOverload, lambda op: op._name),
        (ops.OpOverloadPacket, lambda op: op._qualified_op_name),
    ]
    torchbind = getattr(ops, "TorchBindOpOverload", None)
    if torchbind is not None and "__call__" in torchbind.__dict__:  # its own __call__
        classes.append((torchbind, lambda op: op._name))
    wrapped = {
        cls: _entering(cls.__dict__["__call__"], name_of, module.enter_op, module.exit_op)
        for cls, name_of in classes
    }
    for cls, call in wrapped.items():
        _OP_CALLS[cls] = call.__wrapped__
        cls.__call__ = call  # type: ignore[method-assign]


def _entering(original: Any, name_of: Any, enter: Any, exit_: Any) -> Any:
    def __call__(self: Any, /, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - replaces __call__
        name = name_of(self)
        enters = _ENTERS.get(name)
        if enters is None:
            enters = _ENTERS[name] = name.partition("::")[0] not in _NOT_ENTERED
        if not enters:
            return original(self, *args, **kwargs)
        entered = False
        try:
            entered = enter(name)
            return original(self, *args, **kwargs)
        finally:
            if entered:
                exit_()

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


def _unwrap_op_calls() -> None:
    for cls, original in _OP_CALLS.items():
        cls.__call__ = original  # type: ignore[method-assign]
    _OP_CALLS.clear()


def whole_ops() -> list[str]:
    """Overloads the profile runs natively that have a composite kernel: the device runs them whole.

    The real backend registers its covered ops itself, so the dispatcher never decomposes them
    (``silu_backward``'s math decomposition, ``add.Tensor``'s structured wrapper calling
    ``add.out``). Ops outside the coverage get no registration, as on the real backend: their
    composite kernels run on the device, and a structured op reaches the fallback as its ``out=``
    form (``aten::i0.out``), which is the name TorchTPU's fallback reports.
    """
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = []
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::") or has(qualified, "PrivateUse1"):
            continue
        name = qualified[len("aten::") :]
        base = name.partition(".")[0]
        if base not in _core.NATIVE and not (base.endswith("_") and base[:-1] in _core.NATIVE):
            continue
        composite = (
            has(qualified, "CompositeExplicitAutograd")
            or has(qualified, "CompositeExplicitAutogradNonFunctional")
            or (has(qualified, "CompositeImplicitAutograd") and has(qualified, "CPU"))
        )
        if not composite:
            continue
        try:
            func = _resolve(qualified)
        except (AttributeError, RuntimeError):
            continue
        if base in _core.NATIVE or _core.is_native(func):
            names.append(name)
    return names


def install(module: Any, device_type: str) -> bool:
    """Register the native backend and hand it its Python callbacks (once per process).

    Returns False, registering nothing, when another PrivateUse1 backend owns the process.
    """
    with _lock:
        module.set_callbacks(classify, on_fallback, run_python, refusal)
        if not module.register_kernels(device_type):
            return False
        module.refuse_memory_formats(_policy.MEMORY_FORMAT_REFUSAL.get(device_type, ""))
        module.register_whole(whole_ops())
        atexit.register(module.release_callbacks)
        _core.NATIVE_CORE = module
        _core.MEM = NativeMemory(module)
        _core.reset_plans()
    return True

"""``torch.compile`` on the emulated device: the ``neuron`` and ``tpu`` Dynamo backends.

Both real SDKs compile through Dynamo and AOTAutograd, then lower the graph to StableHLO for their
own compiler; neither has Inductor (``shared/notes/torchneuron.md`` §5, ``torchtpu.md`` §2,
``updates-2026-12.md``). The emulated backends keep the Dynamo + AOTAutograd half and execute each
graph op by op on the emulated device, with what the notes document:

- selection: TorchTPU patches ``torch.compile`` so that, with no ``backend=``, graphs with device
  inputs go to ``"tpu"`` (others to Inductor on the CPU); TorchNeuron auto-selects ``"neuron"`` on
  a Neuron device. Both are done here by patching ``torch.compile`` in the emulated process;
- ``dynamic=True`` is rejected (TorchTPU's exact text; TorchNeuron's text is not known, ours says
  so) and ``dynamic`` defaults to False: a new input shape compiles again;
- neuron: a ``mode`` other than ``"default"`` warns and is ignored (text not known, ours says so);
- tpu: ``backend="inductor"`` with device inputs is refused as TorchTPU refuses it;
- an op a graph holds that the device cannot compile: tpu raises TorchTPU's missing-op error
  (Dynamo wraps it as ``BackendCompilerFailed: backend='tpu' raised: RuntimeError: ...``); neuron
  raises unless ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0`` (2.33's default is 1), which runs the
  graph eagerly instead, where each such op falls back to the CPU as in eager mode.

Which ops a graph may hold is not published for either compiler. By default an op compiles when the
device runs it natively in eager mode or when it is a core ATen op (what the StableHLO lowering
takes; *inference*); ``NEURON_WORKBENCH_COMPILE_COVERAGE=eager`` restricts it to the eager
coverage list. The emulator's own Python is never traced: its package is on Dynamo's skip list.

Every graph compiled here is appended to :data:`GRAPHS` (plain dicts: backend, ops, ops that could
not be compiled, compile seconds) and every warning to :data:`WARNINGS`, for the run's compile
record (``trace/compile.py``).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
import warnings
from typing import Any

import torch

from neuron_workbench.emulator import _core
from neuron_workbench.emulator import events as _events

__all__ = [
    "COVERAGE_ENV",
    "FALLBACK_EXECUTION_ENV",
    "GRAPHS",
    "WARNINGS",
    "DeviceBackend",
    "install",
    "prepare_dynamo",
]

#: TorchNeuron's switch for a graph that fails to compile (torch.compile only, §6.4): "1" (2.33's
#: default) raises, "0" runs the graph eagerly.
FALLBACK_EXECUTION_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"
#: Which ops a graph may hold: ``lowering`` (default: the eager coverage plus core ATen) or
#: ``eager`` (the eager coverage list only). The real compilers' lists are not published.
COVERAGE_ENV = "NEURON_WORKBENCH_COMPILE_COVERAGE"

#: Graphs compiled by the emulated backend in this process, oldest first (plain dicts).
GRAPHS: list[dict[str, Any]] = []
#: Warnings the emulated ``torch.compile`` gave in this process, oldest first.
WARNINGS: list[str] = []

_original_compile: Any = None
_dynamo_ready = False


def _dynamic_error(device_type: str) -> NotImplementedError:
    if device_type == "tpu":
        # TorchTPU 0.2.0's text (torch_tpu/_internal/compile/_backend.py; updates-2026-12.md).
        return NotImplementedError("TPU backend does not support torch.compile(..., dynamic=True)")
    return NotImplementedError(
        "neuron backend does not support torch.compile(..., dynamic=True): TorchNeuron compiles "
        "static shapes only (emulated; TorchNeuron's own wording is not known)"
    )


def _inductor_on_tpu_error() -> RuntimeError:
    # The notes give this message in part ("…on TPU is experimental…Pass backend='tpu'…").
    return RuntimeError(
        "torch.compile(backend='inductor') on TPU is experimental. Pass backend='tpu', or "
        "options={'tpu_backend': 'pallas'} (emulated: TorchTPU's full text is not known, and the "
        "Pallas backend is not emulated)"
    )


def _mode_warning(mode: str) -> str:
    return (
        f"torch.compile(mode={mode!r}) is not supported by the neuron backend; mode='default' is "
        "used (emulated; TorchNeuron's own wording is not known)"
    )


def _op_name(target: Any) -> str:
    schema = target._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def uncompiled_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The ops in ``gm`` the device's compiler would not take (overload names, sorted, unique)."""
    eager_only = os.environ.get(COVERAGE_ENV, "lowering").strip().lower() == "eager"
    missing = set()
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        plan = _core._PLANS.get(target) or _core._make_plan(target)
        if plan[0] in (_core.K_RUN, _core.K_IMPL):
            continue  # native, a view, or an op the emulator implements for the device
        if not eager_only and torch.Tag.core in target.tags:
            continue
        missing.add(_op_name(target))
    return sorted(missing)


def _ops_in(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    )


class DeviceBackend:
    """The emulated ``neuron`` / ``tpu`` Dynamo backend for one ``torch.compile`` call.

    Parameters
    ----------
    device_type : str
        ``"neuron"`` or ``"tpu"``.
    dynamic : bool or None
        The ``dynamic`` the user gave; True is rejected when a graph compiles.
    auto : bool
        Chosen by the patched ``torch.compile`` (no ``backend=``): graphs without device inputs go
        to Inductor on the CPU, as the SDKs' selectors send them.
    inductor : bool
        ``backend="inductor"`` given explicitly: refused on tpu inputs, as TorchTPU refuses it.
    """

    def __init__(
        self, device_type: str, dynamic: bool | None, *, auto: bool = False, inductor: bool = False
    ) -> None:
        self.device_type = device_type
        self.dynamic = dynamic
        self.auto = auto
        self.inductor = inductor
        self.__name__ = "inductor" if inductor else device_type

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        """Compile one Dynamo graph (AOTAutograd, then each graph op by op on the device)."""
        on_device = _on_device(gm, example_inputs, self.device_type)
        if (self.auto or self.inductor) and not on_device:
            from torch._inductor.compile_fx import compile_fx

            stand_in = torch.cuda
            torch.cuda = _real_cuda_module(stand_in)
            try:
                return compile_fx(gm, example_inputs, **kwargs)
            finally:
                torch.cuda = stand_in
        if self.inductor:
            raise _inductor_on_tpu_error()
        if self.dynamic:
            raise _dynamic_error(self.device_type)
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        where = _where(gm)
        from torch._guards import CompileContext

        compile_id = str(CompileContext.current_compile_id() or "")

        def graph_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> Any:
            start = time.perf_counter()
            missing = uncompiled_ops(graph)
            record = {
                "backend": self.device_type,
                "compile_id": compile_id,
                "function": where[0],
                "file": where[1],
                "line": where[2],
                "ops": _ops_in(graph),
                "fallback_ops": missing,
                "eager": False,
                "inputs": [list(t.shape) if isinstance(t, torch.Tensor) else None for t in inputs],
            }
            if missing:
                if self.device_type == "tpu":
                    # TorchTPU's missing-op error (torchtpu.md §3); Dynamo wraps it.
                    raise RuntimeError(
                        f"operator '{missing[0]}' is not implemented for TPU. Please file a "
                        "feature request"
                    )
                if os.environ.get(FALLBACK_EXECUTION_ENV, "1").strip() not in ("0", "false"):
                    raise RuntimeError(
                        f"neuron could not compile a graph holding {', '.join(missing)} "
                        f"({FALLBACK_EXECUTION_ENV}=1, TorchNeuron 2.33's default; set it to 0 to "
                        "run such graphs eagerly) (emulated; TorchNeuron's own wording is not known)"
                    )
                record["eager"] = True  # each of those ops falls back to the CPU, as in eager
            record["compile_s"] = time.perf_counter() - start
            GRAPHS.append(record)
            if record["eager"]:
                return make_boxed_func(graph.forward)  # op by op, as eager mode runs it
            return _compiled_runner(graph, _base_names(graph))

        compiler = aot_autograd(
            fw_compiler=graph_compiler,
            bw_compiler=graph_compiler,
            decompositions=_decompositions(),
        )
        return compiler(gm, example_inputs)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_OWN_DIRS = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))


def _on_device(gm: torch.fx.GraphModule, example_inputs: list[Any], device_type: str) -> bool:
    """Whether a graph touches the device: an input on it, or a value made on it inside."""
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and value.device.type == device_type:
            return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.device.type == device_type:
            return True
    return False


_running = threading.local()


def _compiled_here(op: str) -> bool:
    ops = getattr(_running, "ops", None)
    return ops is not None and op in ops


def _base_names(gm: torch.fx.GraphModule) -> frozenset[str]:
    return frozenset(
        n.target._schema.name
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    )


def _compiled_runner(graph: torch.fx.GraphModule, ops: frozenset[str]) -> Any:
    """Run a compiled graph (boxed): its ops, which the compiler took, are not CPU fallbacks."""
    _events.COMPILED_HERE = _compiled_here

    def run(args: list[Any]) -> Any:
        outer = getattr(_running, "ops", None)
        _running.ops = ops
        try:
            return graph.forward(*args)
        finally:
            _running.ops = outer

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _where(gm: torch.fx.GraphModule) -> tuple[str, str, int]:
    """``(function, file, line)`` of the user code a Dynamo graph came from.

    Its first op's innermost frame outside torch and the workbench.
    """
    for node in gm.graph.nodes:
        stack = node.meta.get("stack_trace")
        if not stack:
            continue
        frames = [m for m in _FRAME.finditer(stack) if not m["file"].startswith(_OWN_DIRS)]
        if frames:
            last = frames[-1]
            return last["function"], last["file"], int(last["line"])
    return "", "", 0


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict[Any, Any]:
    """Core ATen decompositions: the form both SDKs lower to StableHLO (*inference*)."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    # Ops outside the core set that PyTorch can decompose (training batch norm's functional form)
    # are lowered through their pieces as well.
    for op, fn in decomposition_table.items():
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.core not in op.tags:
            if not op._schema.name.startswith("aten::lift"):  # constants stay constants
                table.setdefault(op, fn)
    # Ops the device runs natively stay whole, as the real backends register them.
    for op in list(table):
        if isinstance(op, torch._ops.OpOverload) and _core.is_native(op):
            del table[op]
    return table


def prepare_dynamo() -> None:
    """Register the device's backend with Dynamo and keep Dynamo out of the emulator's Python.

    Called at the first ``torch.compile``: Dynamo is imported only by programs that compile.
    """
    global _dynamo_ready
    if _dynamo_ready:
        return
    import torch._dynamo
    from torch._dynamo import trace_rules

    # Frames of the emulator (the native core's per-op callbacks, its Python kernels) are skipped:
    # Dynamo neither compiles nor inlines them.
    # Every emulator file but the factory wrappers (_pinned), which stand for torch's own factories
    # inside compiled code and are traced as such.
    package = os.path.dirname(os.path.abspath(__file__))
    for root, _dirs, files in os.walk(package):
        for name in files:
            if name.endswith(".py") and name != "_pinned.py":
                trace_rules.SKIP_DIRS.append(os.path.join(root, name))
    trace_rules._recompile_re()
    _factories_known(trace_rules)
    device_type = _core.DEVICE_TYPE
    try:
        torch._dynamo.register_backend(compiler_fn=_named_backend(device_type), name=device_type)
    except Exception:  # registered already (a second install in this process)
        pass
    _dynamo_ready = True


def _factories_known(trace_rules: Any) -> None:
    """Dynamo treats the emulator's factory wrappers (``pin_memory=``) as torch functions.

    Both the wrappers and the builtins they wrap, whichever of the two Dynamo found at its import.
    """
    from torch._dynamo.variables import TorchInGraphFunctionVariable

    from neuron_workbench.emulator import _pinned

    rules = trace_rules.get_torch_obj_rule_map()
    wrappers = [getattr(torch, name, None) for name in _pinned.FACTORIES]
    methods = [getattr(torch.Tensor, name, None) for name in _pinned.TENSOR_FACTORIES]
    for wrapper in wrappers + methods:
        inner = getattr(wrapper, "__wrapped__", None)
        if inner is None:
            continue
        # Tensor.new_*: the wrapped method descriptors go into the graph as they are.
        rule = rules.pop(wrapper, None) or rules.get(inner)
        if rule is None and wrapper in methods:
            rule = TorchInGraphFunctionVariable
        if rule is not None:
            # Dynamo traces the wrapper's Python and takes the torch function it calls.
            rules.setdefault(inner, rule)


def _named_backend(device_type: str) -> Any:
    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        return DeviceBackend(device_type, None)(gm, example_inputs, **kwargs)

    backend.__name__ = device_type
    return backend


@functools.cache
def _real_cuda_module(cuda: Any) -> Any:
    """``torch.cuda`` as the process has it, for Inductor compiling a CPU graph.

    During a ``%%neuron`` run ``torch.cuda`` is a stand-in answering for the emulated device (the
    run keeps the real module as its ``_real``); Inductor's CPU code path reads it too and then
    asked the stand-in for a GPU's properties ("'DeviceProperties' object has no attribute
    'gcnArchName'"). On the vendor's machine it sees the real module, without CUDA.
    """
    return getattr(cuda, "_real", cuda)


def _backend_for(device_type: str, dynamic: bool, *, auto: bool, inductor: bool) -> DeviceBackend:
    # One backend object per setting: code compiled by an earlier torch.compile call with the same
    # settings is reused, as with a named backend (a new object would fail Dynamo's backend guard).
    return DeviceBackend(device_type, dynamic, auto=auto, inductor=inductor)


def _compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile`` in an emulated process (see the module docstring)."""
    prepare_dynamo()
    device_type = _core.DEVICE_TYPE
    given = kwargs.get("backend", None)
    dynamic = kwargs.get("dynamic", None)
    mode = kwargs.get("mode", None)
    ours = given is None or given == device_type
    if ours or (given == "inductor" and device_type == "tpu"):
        if device_type == "neuron" and mode not in (None, "default"):
            message = _mode_warning(str(mode))
            WARNINGS.append(message)
            warnings.warn(message, UserWarning, stacklevel=2)
            kwargs.pop("mode", None)
        options = kwargs.get("options") or {}
        if given == "inductor" and options.get("tpu_backend") == "pallas":
            raise _inductor_on_tpu_error()
        kwargs["backend"] = _backend_for(
            device_type, bool(dynamic), auto=given is None, inductor=given == "inductor"
        )
        # Static shapes: each new input shape compiles again. dynamic=True reaches the backend,
        # which rejects it when a graph compiles.
        kwargs["dynamic"] = bool(dynamic)
        kwargs.pop("options", None)  # "partially supported" (neuron); none is emulated
    if model is None:
        return _original_compile(**kwargs)
    return _original_compile(model, **kwargs)


def install() -> None:
    """Patch ``torch.compile`` in this (emulated) process, once."""
    global _original_compile
    if _original_compile is not None:
        return
    _original_compile = torch.compile
    functools.update_wrapper(_compile, _original_compile)
    torch.compile = _compile  # type: ignore[assignment]

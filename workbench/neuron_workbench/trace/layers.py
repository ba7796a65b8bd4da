"""The layer recorder: per-module output statistics of a run.

``--layers`` records every ``nn.Module`` call's inputs and output as a few statistics (shape,
dtype, norm, extremes, NaN/Inf counts and a fixed sample of elements), not as tensors, so memory
stays bounded however large the model is. Comparing two runs' records (where a divergence is
*born*) is :mod:`neuron_workbench.compare.layer_divergence`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import re
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

#: Elements sampled per tensor (evenly spaced over the flattened tensor, the same in both runs).
SAMPLE_SIZE = 32

#: Key of the mark a recorder leaves in the autograd node of each module output it saw.
_NODE_MARK = "neuron_workbench.layer"
#: Autograd nodes visited, per input, looking for the module calls it was computed from.
_PRODUCER_SEARCH_NODES = 64


@dataclass
class TensorSummary:
    """Statistics of one tensor (see the module docstring)."""

    shape: list[int]
    dtype: str
    numel: int
    norm: float
    min: float
    max: float
    nan: int
    inf: int
    sample: list[float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite numbers as strings)."""
        return {
            "shape": self.shape,
            "dtype": self.dtype,
            "numel": self.numel,
            "norm": json_float(self.norm),
            "min": json_float(self.min),
            "max": json_float(self.max),
            "nan": self.nan,
            "inf": self.inf,
            "sample": [json_float(v) for v in self.sample],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSummary:
        """Inverse of :meth:`to_dict`."""
        return cls(
            list(data["shape"]),
            str(data["dtype"]),
            int(data["numel"]),
            float(data["norm"]),
            float(data["min"]),
            float(data["max"]),
            int(data["nan"]),
            int(data["inf"]),
            [float(v) for v in data["sample"]],
        )


def json_float(value: float) -> float | str:
    """``value``, or its string form (``"nan"``, ``"inf"``) when not finite (JSON has neither)."""
    return value if math.isfinite(value) else str(value)


def _host(t: torch.Tensor) -> torch.Tensor:
    # The statistics must neither create fallback events nor show up in the op profile: the
    # emulator's Python core keeps its numbers in a CPU payload (``elem``), read directly; other
    # PrivateUse1 devices (neuron, tpu: real, or the emulator's native core) are copied to the host
    # first, since their coverage may lack the reductions (aminmax falls back on neuron).
    payload = getattr(t, "elem", None)
    if isinstance(payload, torch.Tensor):
        return payload
    if t.device.type not in ("cpu", "cuda", "meta"):
        return t.to("cpu")
    return t


def summarize(t: torch.Tensor) -> TensorSummary:
    """Summarize a tensor without keeping it (three small reductions and a strided sample).

    The reductions run with torch-function and dispatch modes switched off, so the CUDA remapping
    does not intercept them and an op profiler of the same run does not count them.
    """
    with torch._C.DisableTorchFunction():
        if torch._C._len_torch_dispatch_stack():  # an op profiler is recording this run
            with _disable_current_modes():
                return _summarize(t)
        return _summarize(t)


def _summarize(t: torch.Tensor) -> TensorSummary:
    data = _host(t.detach())
    flat = data.reshape(-1)
    n = flat.numel()
    dtype = str(data.dtype).removeprefix("torch.")
    if n == 0:
        return TensorSummary(list(data.shape), dtype, 0, 0.0, 0.0, 0.0, 0, 0, [])
    if flat.is_complex():
        flat = flat.abs()
    elif not flat.is_floating_point():
        flat = flat.to(torch.float64)  # integers and booleans: exact below 2**53
    norm = float(torch.linalg.vector_norm(flat))
    if math.isfinite(norm):
        nan = inf = 0
        low, high = torch.aminmax(flat)
        vmin, vmax = float(low), float(high)
    else:  # NaN/Inf present (or float32 overflow): the slower, exact route
        wide = flat.to(torch.float64)
        finite = torch.isfinite(wide)
        nan = int(torch.isnan(wide).sum())
        inf = int((~finite).sum()) - nan
        norm = float(torch.where(finite, wide, 0).norm())
        vmin, vmax = float(wide.min()), float(wide.max())
    step = max(n // SAMPLE_SIZE, 1)
    sample = flat[::step][:SAMPLE_SIZE].tolist()
    return TensorSummary(list(data.shape), dtype, n, norm, vmin, vmax, nan, inf, sample)


@dataclass
class LayerCall:
    """One call of one module during a run."""

    module: str
    call: int
    module_type: str
    parent: int | None
    inputs: list[TensorSummary] = field(default_factory=list)
    output: TensorSummary | None = None
    full_output: torch.Tensor | None = field(default=None, repr=False)
    #: Summary of the gradient with respect to the output, filled in during backward.
    grad_output: TensorSummary | None = None
    #: (module, call) of the calls whose outputs this call's tensor inputs were computed from,
    #: directly or through functional ops (``tanh(fc(x))``, a residual ``x + attn(x)``); None: an
    #: input from outside any recorded call.
    producers: list[tuple[str, int] | None] = field(default_factory=list)

    def key(self) -> tuple[str, int]:
        """How calls align between runs: qualified module name and call index."""
        return (self.module, self.call)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the optional full tensor).

        The gradient summary and the producers go with it: a recording compared with ``--against``
        is aligned from this form, and names where backward diverged only with them.
        """
        return {
            "module": self.module,
            "call": self.call,
            "module_type": self.module_type,
            "parent": self.parent,
            "inputs": [s.to_dict() for s in self.inputs],
            "output": self.output.to_dict() if self.output else None,
            "grad_output": self.grad_output.to_dict() if self.grad_output else None,
            "producers": [list(p) if p is not None else None for p in self.producers],
        }


@dataclass
class LayerTrace:
    """Every module call of a run, in the order the calls finished."""

    calls: list[LayerCall] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"calls": [c.to_dict() for c in self.calls]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerTrace:
        """Inverse of :meth:`to_dict`."""
        calls = []
        for c in data.get("calls", []):
            call = LayerCall(c["module"], int(c["call"]), c.get("module_type", ""), c.get("parent"))
            call.inputs = [TensorSummary.from_dict(s) for s in c.get("inputs", [])]
            call.output = TensorSummary.from_dict(c["output"]) if c.get("output") else None
            grad = c.get("grad_output")
            call.grad_output = TensorSummary.from_dict(grad) if grad else None
            call.producers = [tuple(p) if p else None for p in c.get("producers", [])]
            calls.append(call)
        return cls(calls)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = _first_tensor(item)
            if found is not None:
                return found
    return (
        getattr(value, "last_hidden_state", None) if hasattr(value, "last_hidden_state") else None
    )


class LayerRecorder:
    """Global module hooks that fill a :class:`LayerTrace` (see :func:`layer_recorder`)."""

    def __init__(self, full: tuple[str, ...] = (), gradients: bool = True) -> None:
        self.trace = LayerTrace()
        self.full = full
        self.gradients = gradients
        self._stack: list[tuple[torch.nn.Module, str, LayerCall]] = []
        self._names: dict[tuple[int, int], str] = {}
        self._roots: dict[int, dict[int, str]] = {}
        self._made_by: dict[int, tuple[Any, tuple[str, int]]] = {}
        self._counts: dict[str, int] = {}
        # A module's input is usually the previous module's output: summarize each tensor once.
        self._summaries: dict[int, tuple[Any, int, TensorSummary]] = {}
        # Tells this recorder's marks in autograd nodes from another run's in the same process.
        self._token = object()

    def _summary(self, t: torch.Tensor) -> TensorSummary:
        # Keyed by identity and in-place version: ReLU(inplace=True) returns its input, changed.
        # A tensor made under torch.inference_mode() has no version counter (reading it raises),
        # and may still be changed in place there: summarized each time.
        if t.is_inference():
            return summarize(t)
        cached = self._summaries.get(id(t))
        if cached is not None and cached[0]() is t and cached[1] == t._version:
            return cached[2]
        summary = summarize(t)
        try:
            self._summaries[id(t)] = (weakref.ref(t), t._version, summary)
        except TypeError:
            pass
        return summary

    def _producers(self, t: torch.Tensor) -> list[tuple[str, int] | None]:
        """The calls ``t`` was computed from: the one that returned it, else those upstream in autograd.

        Between two modules there are usually functional ops (an activation, a residual add, a
        reshape): the autograd graph still leads from ``t`` to the nodes of the module outputs it
        was computed from, which :meth:`hook` marked. Without a graph (no grad), only a tensor a
        call returned as it is has a producer.
        """
        made = self._made_by.get(id(t))
        if made is not None and made[0]() is t:
            return [made[1]]
        node = t.grad_fn if t.requires_grad else None
        found: list[tuple[str, int] | None] = []
        # The nodes stay referenced while walking, so their ids are not reused.
        pending, seen = [node] if node is not None else [], []
        while pending and len(seen) < _PRODUCER_SEARCH_NODES:
            node = pending.pop(0)
            if any(node is other for other in seen):
                continue
            seen.append(node)
            mark = node.metadata.get(_NODE_MARK)
            if mark is not None and mark[0] is self._token:
                if mark[1] not in found:
                    found.append(mark[1])
                continue
            pending.extend(n for n, _ in node.next_functions if n is not None)
        return found or [None]

    def _watch_gradient(self, out: torch.Tensor, record: LayerCall) -> None:
        """Summarize the gradient w.r.t. this output when backward reaches it (never alters it)."""

        def on_gradient(grad: torch.Tensor) -> None:
            record.grad_output = summarize(grad)

        # Outputs of no-grad modules have no gradient to watch (register_hook would refuse them).
        if out.requires_grad:
            out.register_hook(on_gradient)

    def _name_of(self, module: torch.nn.Module) -> str:
        if not self._stack:
            # A root call: name every submodule once, as named_modules() does (features.3).
            root_id = id(module)
            if root_id not in self._roots:
                self._roots[root_id] = {id(m): n for n, m in module.named_modules() if n}
            return type(module).__name__
        root_names = self._roots[id(self._stack[0][0])]
        name = root_names.get(id(module))
        if name is not None:
            return name
        parent, parent_name, _ = self._stack[-1]  # not registered under the root: name by parent
        key = (id(parent), id(module))
        if key not in self._names:
            found = next((n for n, m in parent.named_modules() if m is module and n), None)
            local = found if found is not None else f"<{type(module).__name__}>"
            self._names[key] = local if len(self._stack) == 1 else f"{parent_name}.{local}"
        return self._names[key]

    def pre_hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """Push the module and summarize its tensor inputs."""
        if torch.compiler.is_compiling():
            # TorchDynamo inlines global hooks into the graphs it traces: summaries there would
            # break every graph, and the recorder's stack, which holds the module being traced,
            # fails Dynamo's own checks (both runs raised). A compiled module is recorded as one
            # call, by its eager wrapper's hooks.
            return
        name = self._name_of(module)
        call = self._counts.get(name, 0)
        self._counts[name] = call + 1
        # Parents finish after their children: hold the parent record's id until finalize().
        parent = id(self._stack[-1][2]) if self._stack else None
        record = LayerCall(name, call, type(module).__name__, parent)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        record.inputs = [self._summary(a) for a in tensors]
        record.producers = [p for a in tensors for p in self._producers(a)]
        self._stack.append((module, name, record))

    def hook(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Pop the module and summarize its output."""
        if torch.compiler.is_compiling():
            return  # see pre_hook
        if not self._stack or self._stack[-1][0] is not module:
            return  # a hook installed mid-call; ignore the unmatched end
        _, name, record = self._stack.pop()
        out = _first_tensor(output)
        if out is not None:
            record.output = self._summary(out)
            with contextlib.suppress(TypeError):
                self._made_by[id(out)] = (weakref.ref(out), record.key())
            if out.grad_fn is not None and self.gradients:
                # Marks the output's autograd node for the calls whose inputs come from it through
                # functional ops (_producers): the node lives as long as the graph does.
                out.grad_fn.metadata[_NODE_MARK] = (self._token, record.key())
            if self.gradients and out.requires_grad and torch.is_grad_enabled():
                self._watch_gradient(out, record)
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.full):
                record.full_output = _host(out.detach()).clone().cpu()
        self.trace.calls.append(record)

    def finalize(self) -> None:
        """Turn parent record ids into indices of ``trace.calls``."""
        index = {id(c): i for i, c in enumerate(self.trace.calls)}
        for call in self.trace.calls:
            call.parent = index.get(call.parent) if call.parent is not None else None


#: torch's warning at each call of a ``torch.compile(module)`` while global module hooks are set.
_GLOBAL_HOOKS_WARNING = re.compile(r"Using `torch\.compile\(module\)` when there are global hooks")


@contextlib.contextmanager
def layer_recorder_for(
    full: tuple[str, ...] = (), gradients: bool = True
) -> Iterator[LayerRecorder]:
    """Record every module call in the body (global forward hooks, removed on exit).

    With ``gradients``, each output that requires grad also gets a tensor hook that summarizes
    its gradient when a backward pass reaches it.
    """
    recorder = LayerRecorder(full, gradients)
    from torch.nn.modules import module as nn_module

    # torch warns at each call of a compiled module while a global module hook is set: these
    # hooks are the workbench's, not the cell's (a hook of the notebook's own keeps the warning).
    # The filter goes first and leaves the others as the cell sets them.
    quiet = None
    if not nn_module._has_any_global_hook():
        quiet = ("ignore", _GLOBAL_HOOKS_WARNING, UserWarning, None, 0)
        warnings.filters.insert(0, quiet)
    pre = nn_module.register_module_forward_pre_hook(recorder.pre_hook)
    post = nn_module.register_module_forward_hook(recorder.hook)
    try:
        yield recorder
    finally:
        pre.remove()
        post.remove()
        if quiet is not None:
            with contextlib.suppress(ValueError):  # the cell emptied the filters
                warnings.filters.remove(quiet)
        recorder.finalize()


def layer_instrument(full: tuple[str, ...] = (), gradients: bool = True) -> Any:
    """An executor instrument (``RunSpec.instruments``) recording module calls into a trace."""

    def instrument(backend: Any) -> contextlib.AbstractContextManager[LayerRecorder]:
        return layer_recorder_for(full, gradients)

    return instrument

"""Dynamo never compiles the workbench's own functions as if they were the cell's code.

Under ``torch.compile``, Dynamo compiles each Python frame that starts while a compiled function
runs, unless the frame's file is one it skips (torch's own). The workbench's functions that torch
calls back during a run (the remap's ``__torch_function__`` for every torch call, the backward
entry it wraps) are such frames. A module compiled in place (``model.compile()``), whose own
``_call_impl`` Dynamo skips, then had the remap's handler compiled once per argument count, graphs
of one op each named ``__torch_function__``, until Dynamo's recompile limit, where a plain run
compiles nothing but the user's code.

Their frames are marked skipped, as torch's are: Dynamo still compiles the user's frames they call.

Dynamo also traces every torch function mode on the stack when a compiled frame starts, inlining
its ``__torch_function__`` into each torch call of the user's code. For the run's remap that made a
compiled cell another program than the plain one: ``loss.backward()`` went through the mode into
``Tensor.backward``'s Python and broke the graph in ``torch/_tensor.py``, ``loss.item()`` broke in
the workbench's scalar record (a graph break more where ``print`` followed), and torch's graph-break
warnings listed the workbench's frames as user code. A mode whose class says
``hidden_from_dynamo`` (:func:`hide_modes_from_dynamo`) is left out of what Dynamo traces: it stays
on the stack, so the Python a compiled frame runs between its graphs (the call at a graph break)
goes through it as in eager code, and its guard on the stack holds; what it does to calls inside
compiled graphs, Dynamo asks of it as it builds each graph node (``mode.graph_call``: a ``"cuda"``
device becomes the run's) and each ``Tensor.is_cuda`` it folds (``mode.graph_is_cuda``).
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from typing import Any

_PACKAGE = "neuron_workbench"
_marked: set[str] = set()
_modules_seen = [0]  # how many modules the process had at the last look: a run looks each time


def keep_dynamo_out_of_the_workbench() -> None:
    """Mark the frames of every loaded workbench module skipped by Dynamo (once per module).

    Also hides the run's modes from Dynamo's tracing (:func:`hide_modes_from_dynamo`). Does
    nothing until the process has imported Dynamo, or where this torch has no per-code frame
    strategies.
    """
    if "torch._dynamo" not in sys.modules:
        return
    hide_modes_from_dynamo()
    if len(sys.modules) == _modules_seen[0]:
        return
    _modules_seen[0] = len(sys.modules)
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:  # an older torch: its frames are compiled as before
        return
    strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT)
    for name, module in list(sys.modules.items()):
        if name in _marked or not (name == _PACKAGE or name.startswith(_PACKAGE + ".")):
            continue
        _marked.add(name)
        for code in _codes_of(module):
            set_code_exec_strategy(code, strategy)


def drop_code_compiled_for_the_dead() -> int:
    """Empty Dynamo's cache for each code object holding code compiled for objects since freed.

    Each run works on copies of the notebook's objects, and Dynamo guards some by identity (the
    optimizer a compiled train step calls: ``___check_obj_id(G['opt'], ...)``), so each
    ``%%neuron`` cell compiles such a frame again for its own copies. When a copy is freed, Dynamo
    invalidates the entry compiled for it but keeps it in the code's cache, where it still counts
    towards ``torch._dynamo.config.recompile_limit``: from the ninth cell Dynamo ran the frame
    eagerly ("Dynamo recompile limit exceeded") where a plain notebook compiles once. Called as a
    run starts: a cache holding such an entry is emptied (with its frame's compile count), and the
    run compiles the frame afresh. A live entry beside a freed one goes too (Dynamo cannot drop one
    entry alone): a plain cell compiles it again when it next runs.

    Returns
    -------
    int
        How many code objects' caches were emptied (none until the process has imported Dynamo).
    """
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo import convert_frame
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list, reset_code
        from torch._dynamo.guards import DeletedGuardManagerWrapper
    except ImportError:  # another torch: its caches are left as they are
        return 0
    emptied = 0
    try:
        for weak_code in list(getattr(convert_frame.input_codes, "seen", [])):
            code = weak_code()
            if code is None:
                continue
            entries = _debug_get_cache_entry_list(code)
            if any(isinstance(e.guard_manager, DeletedGuardManagerWrapper) for e in entries):
                reset_code(code)
                emptied += 1
    except (AttributeError, TypeError, RuntimeError):
        # Dynamo's private cache API differs in another torch: tidying must never stop a run
        pass
    return emptied


def _codes_of(module: types.ModuleType) -> list[types.CodeType]:
    """The code objects a module defines: its functions, methods and what is nested in them."""
    found: dict[int, types.CodeType] = {}

    def add_code(code: types.CodeType) -> None:
        if id(code) in found:
            return
        found[id(code)] = code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add_code(const)

    def add(value: Any, depth: int) -> None:
        function = getattr(value, "__func__", value)  # a classmethod or staticmethod
        function = getattr(function, "__wrapped__", function)  # a contextmanager's generator
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType):
            if code.co_filename == module_file:
                add_code(code)
        elif isinstance(value, property):
            for accessor in (value.fget, value.fset, value.fdel):
                if accessor is not None:
                    add(accessor, depth)
        elif isinstance(value, type) and depth < 3 and value.__module__ == module.__name__:
            for member in vars(value).values():
                add(member, depth + 1)

    module_file = getattr(module, "__file__", None)
    if module_file is None:
        return []
    for value in list(vars(module).values()):
        add(value, 0)
    return list(found.values())


#: The attribute of Dynamo's symbolic mode state that holds the traced frame's :class:`_Hidden`.
_HIDDEN = "_workbench_hidden_mode"
_hidden_installed = [False]


@dataclass
class _Hidden:
    """A hidden mode of the frame Dynamo traces: where the frame finds it, whether it is guarded."""

    mode: Any
    source: Any  # Dynamo's source of the mode: its index on the stack
    guarded: bool = False


def _is_hidden(mode: Any) -> bool:
    return getattr(type(mode), "hidden_from_dynamo", False) is True


def hide_modes_from_dynamo() -> None:
    """Make Dynamo trace compiled frames as if ``hidden_from_dynamo`` modes were not on the stack.

    Once per process, after Dynamo is imported; only Dynamo's tracing changes (what a compiled
    frame costs when it runs does not). Such a mode provides ``graph_call(kind, target, args,
    kwargs)`` (the graph node Dynamo is to build instead, or None for the call as it is),
    ``graph_is_cuda(device)`` (``Tensor.is_cuda`` in a graph, or None for torch's answer) and
    ``target`` (what its graph nodes depend on: a frame whose graph it changed is guarded on it).
    Where this torch's Dynamo lacks the hooks used here, the modes are traced as before.
    """
    if _hidden_installed[0]:
        return
    _hidden_installed[0] = True
    try:
        from torch._dynamo import utils as dynamo_utils
        from torch._dynamo.output_graph import SubgraphTracer
        from torch._dynamo.source import TorchFunctionModeStackSource
        from torch._dynamo.variables.tensor import TensorVariable
        from torch._dynamo.variables.torch_function import SymbolicTorchFunctionState
        from torch.overrides import _get_current_function_mode_stack

        state_init = SymbolicTorchFunctionState.__init__
        create_proxy = SubgraphTracer.create_proxy
        is_cuda = TensorVariable.method_attr_is_cuda
        set_stack = dynamo_utils.set_torch_function_mode_stack
    except (ImportError, AttributeError):  # another Dynamo: the modes are traced as before
        return

    def __init__(self: Any, py_stack: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        py_stack = list(py_stack)
        state_init(self, py_stack, *args, **kwargs)
        hidden = [index for index, mode in enumerate(py_stack) if _is_hidden(mode)]
        if not hidden or len(self.mode_stack) != len(py_stack):
            return
        kept = [var for mode, var in zip(py_stack, self.mode_stack) if not _is_hidden(mode)]
        self.mode_stack.clear()
        self.mode_stack.extend(kept)
        # the innermost hidden mode answers for the graph; its index on the stack (which it keeps:
        # only Dynamo's symbolic copy lacks it) is where a guard finds it
        innermost = hidden[-1]
        setattr(
            self, _HIDDEN, _Hidden(py_stack[innermost], TorchFunctionModeStackSource(innermost))
        )

    def create_proxy_mapped(
        self: Any, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **more: Any
    ) -> Any:
        hidden = _hidden_of(getattr(self, "output_graph", None))
        if hidden is not None and kind in ("call_function", "call_method"):
            mapped = hidden.mode.graph_call(kind, target, args, kwargs)
            if mapped is not None:
                kind, target, args, kwargs = mapped
                _guard_on_target(hidden)
        return create_proxy(self, kind, target, args, kwargs, *rest, **more)

    def method_attr_is_cuda(self: Any, tx: Any) -> Any:
        hidden = _hidden_of(getattr(tx, "output", None))
        if hidden is not None and self.device is not None:
            answer = hidden.mode.graph_is_cuda(self.device)
            if answer is not None:
                from torch._dynamo.variables import ConstantVariable

                _guard_on_target(hidden)
                return ConstantVariable.create(answer)
        return is_cuda(self, tx)

    def set_torch_function_mode_stack(stack: list[Any]) -> None:
        # A compiled frame that entered or left a mode sets the whole stack to Dynamo's symbolic
        # one when it returns, which lacks the hidden modes: they stay where they were.
        stack = list(stack)
        for index, mode in enumerate(_get_current_function_mode_stack()):
            if _is_hidden(mode) and not any(each is mode for each in stack):
                stack.insert(min(index, len(stack)), mode)
        set_stack(stack)

    SymbolicTorchFunctionState.__init__ = __init__  # type: ignore[method-assign]
    SubgraphTracer.create_proxy = create_proxy_mapped  # type: ignore[method-assign]
    TensorVariable.method_attr_is_cuda = method_attr_is_cuda  # type: ignore[method-assign]
    # the compiled code Dynamo writes looks this name up in the module each time it runs
    dynamo_utils.set_torch_function_mode_stack = set_torch_function_mode_stack


def _hidden_of(output_graph: Any) -> _Hidden | None:
    """The hidden mode of the frame ``output_graph`` is the graph of, or None."""
    state = getattr(getattr(output_graph, "root_tx", None), "symbolic_torch_function_state", None)
    return getattr(state, _HIDDEN, None)


def _guard_on_target(hidden: _Hidden) -> None:
    """Guard the traced frame on its hidden mode's ``target``: its graph holds that device.

    Dynamo guards the mode stack by its modes' types only: without this, a run on another device
    in the same process (``--executor inprocess``) reused a graph that made its tensors on the
    first run's device.
    """
    if hidden.guarded:
        return
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import AttrSource

    install_guard(AttrSource(hidden.source, "target").make_guard(GuardBuilder.EQUALS_MATCH))
    hidden.guarded = True


#: What Dynamo puts into the globals of the code it compiles: its compiled graphs, resume
#: functions, imports, and the objects its guards read (``_<id>_c<n>``).
_COMPILED_GLOBAL = re.compile(r"__compiled_fn|__resume_at|__builtins_dict__|__import_|___|_\d+_c\d")


def compiled_global(name: str) -> bool:
    """Whether ``name`` is one Dynamo put into a namespace (it must stay while its code does)."""
    return _COMPILED_GLOBAL.match(name) is not None

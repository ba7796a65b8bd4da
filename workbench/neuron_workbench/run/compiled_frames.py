"""Dynamo never compiles the workbench's own functions as if they were the cell's code.

Under ``torch.compile``, Dynamo compiles each Python frame that starts while a compiled function
runs, unless the frame's file is one it skips (torch's own). The workbench's functions that torch
calls back during a run (the remap's ``__torch_function__`` for every torch call, the backward
entry it wraps) are such frames. A module compiled in place (``model.compile()``), whose own
``_call_impl`` Dynamo skips, then had the remap's handler compiled once per argument count, graphs
of one op each named ``__torch_function__``, until Dynamo's recompile limit, where a plain run
compiles nothing but the user's code.

Their frames are marked skipped, as torch's are: Dynamo still traces into them from the user's
code it compiles (the remap inside a compiled forward), and still compiles the user's frames they
call.
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any

_PACKAGE = "neuron_workbench"
_marked: set[str] = set()
_modules_seen = [0]  # how many modules the process had at the last look: a run looks each time


def keep_dynamo_out_of_the_workbench() -> None:
    """Mark the frames of every loaded workbench module skipped by Dynamo (once per module).

    Does nothing until the process has imported Dynamo, or where this torch has no per-code
    frame strategies.
    """
    if "torch._dynamo" not in sys.modules or len(sys.modules) == _modules_seen[0]:
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


#: What Dynamo puts into the globals of the code it compiles: its compiled graphs, resume
#: functions, imports, and the objects its guards read (``_<id>_c<n>``).
_COMPILED_GLOBAL = re.compile(r"__compiled_fn|__resume_at|__builtins_dict__|__import_|___|_\d+_c\d")


def compiled_global(name: str) -> bool:
    """Whether ``name`` is one Dynamo put into a namespace (it must stay while its code does)."""
    return _COMPILED_GLOBAL.match(name) is not None

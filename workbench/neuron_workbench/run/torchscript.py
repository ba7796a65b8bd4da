"""TorchScript functions and modules between processes (the target's worker and back).

Neither a ``ScriptFunction`` (``@torch.jit.script``, ``torch.jit.trace(fn, ...)``) nor a scripted
or traced module (``torch.jit.script(model)``) can be pickled, so a notebook holding one could not
send a single ``%%neuron`` cell reading it to the target's worker.

A scripted module travels as its ``torch.jit.save`` archive, written with meta placeholders for its
parameters and buffers (its code, no copy of their data), and those tensors as the transport sends
tensors, put back into the loaded module: they stay the tensors an optimizer or another model
holds, on the device they were on. A run's copy of such a module is made the same way.
The tensors its code holds as constants (a frozen module's weights, ``torch.jit.freeze``) are
in the archive, as host copies, and the device they were on travels with it: the loaded
module's constants carry it as a tensor sent back from a device does, and a move of the module
takes them there (:func:`script_constants`).

A function travels as what rebuilds it there:

- a function of an importable module (``from lib import fused_gelu``) by its name;
- otherwise its Python function and source lines, scripted again in the receiver, accepted only
  when TorchScript prints the same code as the sender's (the same function, defaults included);
- else (a traced function, a global that changed since it was scripted, no source) its serialized
  TorchScript (``save_to_buffer``), loaded with ``torch.jit.load``: the same code, called as the
  loaded module's ``forward``, whose arguments have no defaults.

What a receiver rebuilt is kept by its serialized form, so a request does not script it again.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import sys
from typing import Any

import torch

from neuron_workbench.quiet import warnings_ignored
from neuron_workbench.run.device_origin import ORIGIN_ATTR, origin_of

SCRIPT_FUNCTION = torch.jit.ScriptFunction
#: Scripted and traced modules (``torch.jit.script(model)``, ``torch.jit.trace(model, x)``).
SCRIPT_MODULES = (
    torch.jit.RecursiveScriptModule,
    torch.jit.TopLevelTracedModule,
    torch.jit._trace.TracedModule,
)

#: Rebuilt functions by their serialized TorchScript (what the sender sends every request).
_REBUILT: dict[bytes, Any] = {}
_REBUILT_LIMIT = 256


def reduce_script_function(function: Any) -> tuple[Any, tuple[Any, ...]]:
    """The pickle reduction of a ``ScriptFunction``: ``(rebuild, arguments)``."""
    original = getattr(function, "_torchdynamo_inline", None)
    module_name = getattr(original, "__module__", None)
    name = getattr(original, "__name__", None)
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if module is not None and module_name != "__main__" and getattr(module, name, None) is function:
        return getattr, (module, name)
    code = getattr(original, "__code__", None)
    filename = code.co_filename if code is not None else None
    lines = tuple(linecache.getlines(filename)) if filename else ()
    return script_function_again, (
        original if lines else None,
        filename,
        lines,
        function.code,
        function.save_to_buffer(),
    )


def script_function_again(
    original: Any, filename: str | None, lines: tuple[str, ...], code: str, serialized: bytes
) -> Any:
    """The sender's ``ScriptFunction`` rebuilt here (see the module's docstring)."""
    rebuilt = _REBUILT.get(serialized)
    if rebuilt is None:
        with warnings_ignored():  # torch.jit's deprecation, the sender's to see, not a run's
            rebuilt = _scripted_again(original, filename, lines, code)
            if rebuilt is None:
                rebuilt = torch.jit.load(io.BytesIO(serialized)).forward
        if len(_REBUILT) >= _REBUILT_LIMIT:
            _REBUILT.clear()
        _REBUILT[serialized] = rebuilt
    return rebuilt


def _scripted_again(
    original: Any, filename: str | None, lines: tuple[str, ...], code: str
) -> Any | None:
    if original is None or not filename or not lines:
        return None
    if tuple(linecache.getlines(filename)) != lines:
        # a notebook cell's source, which only the sender's linecache holds; TorchScript reads it
        linecache.cache[filename] = (sum(map(len, lines)), None, list(lines), filename)
    with contextlib.suppress(Exception):
        again = torch.jit.script(original)
        if again.code == code:
            return again
    return None


def reduce_script_module(module: Any) -> tuple[Any, tuple[Any, ...]]:
    """The pickle reduction of a scripted module: ``(rebuild, arguments)``.

    The archive holds its code and meta placeholders for its parameters and buffers (no copy of
    their data, no device the receiver may not know); the tensors travel as the transport sends
    them, and are put back into the module here before this returns. Its constants are in the
    archive as host copies, with the device they were on (None: the host).
    """
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    constants = script_constants(module)
    origin = next(filter(None, map(origin_of, constants)), None)
    on_device = [(constant, constant.detach()) for constant in constants if not constant.is_cpu]
    archive = io.BytesIO()
    try:
        for path, tensor in tensors.items():
            _set_tensor(module, path, torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"))
        for constant, data in on_device:  # (the code runs with these very tensors: set in place)
            constant.data = data.cpu()
        torch.jit.save(module, archive)
    finally:
        for path, tensor in tensors.items():
            _set_tensor(module, path, tensor)
        for constant, data in on_device:
            constant.data = data
    return script_module_again, (archive.getvalue(), tensors, origin)


def script_constants(module: Any) -> list[torch.Tensor]:
    """The tensors the code of a scripted module (and of its submodules) holds as constants.

    A frozen module's weights are such constants (``torch.jit.freeze`` folds its parameters into
    the code), and so are the tensors a traced module made. Each is the tensor the code runs with:
    setting its ``.data`` moves it, as ``Module.to`` moves a parameter.
    """
    found: dict[int, torch.Tensor] = {}
    for each in module.modules():
        scripted = getattr(each, "_c", None)
        if scripted is None:
            continue
        for name in scripted._method_names():
            _constants_in(scripted._get_method(name).graph.nodes(), found)
    return list(found.values())


def _constants_in(nodes: Any, found: dict[int, torch.Tensor]) -> None:
    for node in nodes:
        if node.kind() == "prim::Constant" and node.hasAttribute("value"):
            if node.kindOf("value") == "t":
                # (one Python object per tensor while it lives: torch keeps it with its state)
                tensor = node.t("value")
                found.setdefault(id(tensor), tensor)
        for block in node.blocks():
            _constants_in(block.nodes(), found)


def _set_tensor(module: Any, path: str, tensor: torch.Tensor) -> None:
    *owners, name = path.split(".")
    for part in owners:  # a ScriptModule has no get_submodule
        module = getattr(module, part)
    setattr(module, name, tensor)


def script_module_again(
    archive: bytes, tensors: dict[str, torch.Tensor], origin: str | None = None
) -> Any:
    """The sender's scripted module, loaded here with the tensors that travelled put back.

    Its constants were on the device ``origin`` names (None: the host): here they are host
    tensors marked as sent back from it.
    """
    with warnings_ignored():
        module = torch.jit.load(io.BytesIO(archive))
    for path, tensor in tensors.items():
        _set_tensor(module, path, tensor)
    if origin is not None:
        for constant in script_constants(module):
            vars(constant)[ORIGIN_ATTR] = origin
    return module

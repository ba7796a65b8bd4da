"""TorchScript functions (``@torch.jit.script``, ``torch.jit.trace(fn, ...)``) between processes.

A ``ScriptFunction`` cannot be pickled, so a notebook whose model calls one (``fused_gelu``, a
scripted loss) could not send a single ``%%neuron`` cell to the target's worker. It travels as
what rebuilds it there:

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

SCRIPT_FUNCTION = torch.jit.ScriptFunction

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

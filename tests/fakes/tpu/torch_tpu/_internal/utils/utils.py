"""FAKE ``torch_tpu._internal.utils.utils``: ``OpTracer``.

The notes document only that ``OpTracer`` is a ``TorchDispatchMode`` recording every dispatched
ATen op (``shared/notes/torchtpu.md`` §4); the ``ops`` attribute here is the fake's own.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpTracer(TorchDispatchMode):
    """Records every dispatched ATen op (``ops``: overload names in call order)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

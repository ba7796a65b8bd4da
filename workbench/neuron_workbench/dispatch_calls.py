"""Calling an op from a ``TorchDispatchMode`` with the effects it has without the mode.

An op that writes into a list of tensors in place (``aten::_foreach_add_``, ``aten::_fused_adamw_``:
every foreach or fused optimizer step, which CUDA tensors and the cpu reference standing in for
them use by default) does not bump the written tensors' version counters when it is called from a
Python dispatch mode (pytorch/pytorch#191154, open for torch 2.13): the counter is bumped by the
dispatch key the mode sits below. A run finds what a cell changed in place by those counters, so
under such a mode an optimizer step would change a model's weights unseen, and the weights would
not be compared. Each mode of this package calls ops through :func:`call_op`, which bumps them.

A leaf module, so every layer's dispatch modes (the op profiler, device recorders, the host's CUDA
stand-ins, the worker's last-op record) can use it.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["UNVERSIONED_WRITERS", "bump_unchanged", "call_op", "written_through_lists"]

#: ``torch`` functions whose kernels write tensors without bumping their version counters (on
#: CPU and CUDA alike: the fused optimizer steps, GradScaler's kernels), and the positions of the
#: arguments (tensors or lists of them) their schemas mark as written. Their writes are counted
#: apart (``run.unversioned_writes``); a mode leaves their counters as the kernels do, or a graph
#: that saved a weight before a fused step would fail its backward pass where a GPU runs it.
UNVERSIONED_WRITERS: dict[str, tuple[int, ...]] = {
    "_fused_adam_": (0, 1, 2, 3, 4),
    "_fused_adamw_": (0, 1, 2, 3, 4),
    "_fused_sgd_": (0, 1, 2),
    "_fused_adagrad_": (0, 1, 2, 3),
    "_amp_foreach_non_finite_check_and_unscale_": (0, 1),
    "_amp_update_scale_": (0, 1),
}

#: Per op overload: the positions and names of the tensor lists it writes in place (empty: none).
_WRITTEN_LISTS: dict[Any, tuple[tuple[int, str], ...]] = {}


def _written_lists(func: Any) -> tuple[tuple[int, str], ...]:
    written = _WRITTEN_LISTS.get(func)
    if written is None:
        try:
            schema = func._schema
            arguments = schema.arguments
            if schema.name.split("::", 1)[-1] in UNVERSIONED_WRITERS:
                arguments = ()  # its kernel bumps none: neither does a mode
        except AttributeError:  # not an ATen op overload
            arguments = ()
        written = tuple(
            (index, argument.name)
            for index, argument in enumerate(arguments)
            if argument.alias_info is not None
            and argument.alias_info.is_write
            and isinstance(argument.type, torch.ListType)
        )
        _WRITTEN_LISTS[func] = written
    return written


def _tensors(value: Any) -> list[torch.Tensor]:
    if not isinstance(value, list | tuple):
        return []
    return [t for t in value if isinstance(t, torch.Tensor) and not t.is_inference()]


def written_through_lists(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[torch.Tensor, int]]:
    """The tensors ``func`` writes through a tensor list, with their versions now (often none)."""
    written = _written_lists(func)
    if not written:
        return []
    return [
        (tensor, tensor._version)
        for index, name in written
        for tensor in _tensors(args[index] if index < len(args) else kwargs.get(name))
    ]


def bump_unchanged(written: list[tuple[torch.Tensor, int]]) -> None:
    """Bump the version of each tensor of :func:`written_through_lists` that the op left as it was.

    Only those, so an op that does bump them (where PyTorch fixed it) is not counted twice.
    """
    stale = [tensor for tensor, version in written if tensor._version == version]
    if stale:
        torch.autograd.graph.increment_version(stale)


def call_op(func: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
    """``func(*args, **kwargs)``, bumping the version of every tensor it wrote through a list."""
    kwargs = kwargs or {}
    written = written_through_lists(func, args, kwargs)
    out = func(*args, **kwargs)
    if written:
        bump_unchanged(written)
    return out

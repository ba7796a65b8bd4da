"""Turn a cell's outputs into leaves with readable paths (``out['logits'][0]``, ``model.fc.weight``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

_MAX_DEPTH = 16


def iter_leaves(outputs: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, leaf)`` for every comparable value under each named output, in order."""
    for name, value in outputs.items():
        yield from _walk(name, value, 0, set())


def _walk(path: str, value: Any, depth: int, seen: set[int]) -> Iterator[tuple[str, Any]]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if isinstance(value, torch.nn.Module):
        if id(value) in seen:
            return
        seen.add(id(value))
        for name, param in value.named_parameters():
            yield f"{path}.{name}", param
            if param.grad is not None:
                yield f"{path}.{name}.grad", param.grad
        for name, buffer in value.named_buffers():
            yield f"{path}.{name}", buffer
        return
    if isinstance(value, torch.optim.Optimizer):
        params = [p for group in value.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            for key, item in value.state.get(param, {}).items():
                yield from _walk(f"{path}.state[{index}][{key!r}]", item, depth + 1, seen)
        return
    if _is_numpy_array(value):
        yield path, value
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _walk(f"{path}.{field.name}", getattr(value, field.name), depth + 1, seen)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(f"{path}[{key!r}]", item, depth + 1, seen)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(f"{path}[{index}]", item, depth + 1, seen)
        return
    if isinstance(value, bool | int | float | complex | str | bytes) or value is None:
        yield path, value
        return
    # Anything else (a DataLoader, a function, a user object) is not a numeric output.


def _is_numpy_array(value: Any) -> bool:
    # NumPy arrays and scalars, without importing NumPy.
    return type(value).__module__ == "numpy"

"""What a plain cell's moves to the CPU mean for the next ``%%neuron`` cell.

With the cpu backend standing in for cuda, what a ``%%neuron`` cell put on "cuda" is a CPU object
in the notebook, remembered as on the device (:class:`~neuron_workbench.run.namespace.ResidentObjects`
and tensor marks), so the next ``%%neuron`` cell puts it on each run's device again. A plain cell
in between cannot tell the kernel that the user moved it back: ``model.cpu()`` on a CPU module
changes nothing, so the next cell put the model on the target's device while the cell's inputs were
on the CPU, and the target failed with a device mismatch that the CUDA notebook never meets.

The plain cell's source says it instead. After a plain cell, for each name it moves to the CPU:

- a module, or any object moved in place (``model.cpu()``, ``model.to("cpu")``,
  ``model = model.to(device)`` with ``device`` naming the cpu): no longer on the device;
- a tensor rebinding its own name (``x = x.cpu()``): the name now holds a CPU tensor;
- a tensor bound to another name (``y = x.cpu()``): on a GPU ``y`` is a CPU copy and ``x`` stays on
  the device, while here both names hold one object. ``y`` becomes a CPU copy of it, as on a GPU.

``x.cpu()`` alone leaves a tensor where it is, as on a GPU. Moves the source does not show (a loop
over a list of models, ``getattr``) are not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, MutableMapping
from typing import Any

import torch

from neuron_workbench.run.namespace import (
    ORIGIN_ATTR,
    ResidentObjects,
    on_accelerator,
    tensors_in,
)


def forget_moves_to_host(
    source: str, namespace: MutableMapping[str, Any], resident: ResidentObjects
) -> list[str]:
    """Apply what the plain cell ``source`` moved to the CPU (see the module); return the names.

    Parameters
    ----------
    source : str
        The plain cell as Python (IPython's transforms applied), after it ran.
    namespace : mutable mapping
        The notebook's globals after the cell.
    resident : ResidentObjects
        What earlier ``%%neuron`` cells left on the device.
    """
    if ".cpu(" not in source and ".to(" not in source:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    moved = []
    for target, receiver in _moves_to_host(tree, namespace):
        if receiver not in namespace:
            continue
        value = namespace[receiver]
        if not _on_device(value, resident):
            continue
        if isinstance(value, torch.Tensor):
            if target is None:
                continue  # x.cpu() alone: a copy on a GPU, x stays where it was
            if target != receiver:
                if namespace.get(target) is value:
                    namespace[target] = _host_copy(value)
                    moved.append(target)
                continue
        elif target is not None and target != receiver and namespace.get(target) is not value:
            continue  # `y = obj.to("cpu")` gave something new: obj itself did not move
        _forget(value, resident)
        moved.append(receiver)
    return moved


def _moves_to_host(tree: ast.AST, namespace: MutableMapping[str, Any]) -> Iterator[tuple[Any, str]]:
    """``(assigned name or None, receiver name)`` of each ``<name>.cpu()`` / ``.to(<cpu>)`` call."""
    assigned: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = node.targets[0]
            if isinstance(name, ast.Name):
                assigned[id(node.value)] = name.id
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
        ):
            continue
        method = node.func.attr
        if method == "cpu" or (method == "to" and _names_cpu(node, namespace)):
            yield assigned.get(id(node)), node.func.value.id


def _names_cpu(call: ast.Call, namespace: MutableMapping[str, Any]) -> bool:
    """Whether a ``.to(...)`` call's device argument names the cpu."""
    candidates = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "device")]
    return any(_is_cpu(_device_of(arg, namespace)) for arg in candidates)


def _device_of(node: ast.expr, namespace: MutableMapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "device"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return node.args[0].value  # torch.device("cpu")
    return None


def _is_cpu(device: Any) -> bool:
    if type(device) is str:
        return device == "cpu" or device.startswith("cpu:")
    return type(device) is torch.device and device.type == "cpu"


def _on_device(value: Any, resident: ResidentObjects) -> bool:
    return value in resident or any(on_accelerator(t) for t in tensors_in(value))


def _forget(value: Any, resident: ResidentObjects) -> None:
    resident.discard(value)
    for tensor in tensors_in(value):
        vars(tensor).pop(ORIGIN_ATTR, None)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """What ``tensor.cpu()`` gives on a GPU: a copy, linked to it by autograd as a copy is."""
    copied = tensor.clone()
    vars(copied).pop(ORIGIN_ATTR, None)
    return copied

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
- a tensor bound by the move (``x = x.cpu()``, ``y = x.cpu().float()``): on a GPU the name holds a
  CPU copy and every other holder of the tensor still has it on the device, while here the call
  gave the same object back. The name gets a CPU copy of it, as on a GPU.

Statements run at the cell's top level count (branches and loops included), in order: a later move
back to the device (``model.to(device)`` with the device a ``%%neuron`` cell made for cuda,
``.cuda()``) undoes an earlier move to the CPU. Function and class bodies the cell only defines do
not. ``x.cpu()`` alone leaves a tensor where it is, as on a GPU. Moves the source does not show by
name (a loop over a list of models, ``trainer.model.cpu()``) are not seen, and a reference to the
tensor taken in the same cell (``d = {"y": y}``) keeps the object the call returned.
"""

from __future__ import annotations

import ast
from collections.abc import MutableMapping
from typing import Any

import torch

from neuron_workbench.run.namespace import (
    ORIGIN_ATTR,
    ResidentObjects,
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
    finder = _Moves(namespace, resident)
    finder.visit(tree)
    moved = []
    for receiver, (where, target) in finder.last.items():
        if receiver not in namespace:
            continue
        value = namespace[receiver]
        if not resident.on_device(value):
            continue
        if isinstance(value, torch.Tensor):
            # a copy on a GPU: each name a move bound gets one, the tensor stays where it is
            for bound in finder.bound.get(receiver, ()):
                if namespace.get(bound) is value:
                    # what .cpu() gives on a GPU: a copy (no device mark), linked by autograd
                    namespace[bound] = value.clone()
                    moved.append(bound)
            continue
        if where != "cpu":
            continue
        if target is not None and target != receiver and namespace.get(target) is not value:
            continue  # `y = obj.to("cpu")` gave something new: obj itself did not move
        _forget(value, resident)
        moved.append(receiver)
    return moved


class _Moves(ast.NodeVisitor):
    """The last move of each name at the cell's top level: ``{name: ("cpu"|"device", bound)}``."""

    def __init__(self, namespace: MutableMapping[str, Any], resident: ResidentObjects) -> None:
        self.namespace = namespace
        self.resident = resident
        self.last: dict[str, tuple[str, str | None]] = {}
        #: the names each name's moves to the CPU bound (``y = x.cpu()``)
        self.bound: dict[str, list[str]] = {}
        self._bound: dict[int, str] = {}  # an assigned call: the name it binds
        self._inner: set[int] = set()  # calls inside a chain already read with its outer call

    def visit_FunctionDef(self, node: ast.AST) -> None:  # noqa: N802 - ast.NodeVisitor's names
        return None  # only defined here: it may never run

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef  # noqa: N815

    def visit_Assign(self, node: ast.Assign) -> None:  # noqa: N802
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self._bound[id(node.value)] = node.targets[0].id
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        if id(node) not in self._inner:
            links = []  # (method, call), from the name outwards
            link: ast.expr = node
            while isinstance(link, ast.Call) and isinstance(link.func, ast.Attribute):
                links.append((link.func.attr, link))
                self._inner.add(id(link))
                link = link.func.value
            if isinstance(link, ast.Name):
                where = None
                for method, call in reversed(links):
                    where = self._where(method, call) or where
                if where is not None:
                    target = self._bound.get(id(node))
                    self.last[link.id] = (where, target)
                    if where == "cpu" and target is not None:
                        self.bound.setdefault(link.id, []).append(target)
        self.generic_visit(node)

    def _where(self, method: str, call: ast.Call) -> str | None:
        if method == "cpu":
            return "cpu"
        if method == "cuda":
            return "device"
        if method != "to":
            return None
        arguments = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "device")]
        for argument in arguments:
            where = _device_named(_device_of(argument, self.namespace), self.resident)
            if where is not None:
                return where
        return None


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


def _device_named(device: Any, resident: ResidentObjects) -> str | None:
    """``"cpu"``, ``"device"`` (cuda, as the cell means it) or None for a ``.to`` argument."""
    if type(device) is str:
        if device == "cpu" or device.startswith("cpu:"):
            return "cpu"
        return "device" if device.startswith("cuda") else None
    if type(device) is torch.device:
        if device.type == "cuda" or device in resident:
            return "device"  # a device a %%neuron cell made for cuda (the cpu stand-in here)
        return "cpu" if device.type == "cpu" else None
    return None


def _forget(value: Any, resident: ResidentObjects) -> None:
    resident.discard(value)
    for tensor in tensors_in(value):
        vars(tensor).pop(ORIGIN_ATTR, None)

"""What a plain cell's moves between the CPU and the device mean for the next ``%%neuron`` cell.

With the cpu backend standing in for cuda, what a ``%%neuron`` cell put on "cuda" is a CPU object
in the notebook, remembered as on the device (:class:`~neuron_workbench.run.namespace.ResidentObjects`
and tensor marks), so the next ``%%neuron`` cell puts it on each run's device again. A plain cell
in between runs on that stand-in, where a move changes nothing: ``model.cpu()`` on a CPU module
gives no sign that the user moved it back, and ``nn.Linear(4, 2).to(device)`` none that it went to
the device. Either way the next cell's target met a device mismatch that the CUDA notebook never
meets.

The plain cell's source says it instead. After a plain cell, for each name it moves to the CPU:

- a module, or any object moved in place (``model.cpu()``, ``model.to("cpu")``,
  ``model = model.to(device)`` with ``device`` naming the cpu): no longer on the device;
- a tensor bound by the move (``x = x.cpu()``, ``y = x.cpu().float()``): on a GPU the name holds a
  CPU copy and every other holder of the tensor still has it on the device, while here the call
  gave the same object back. The name gets a CPU copy of it, as on a GPU.

And for each name it puts on the device (``device`` being one a ``%%neuron`` cell made for cuda,
which the notebook holds as the stand-in):

- a module moved there in place (``model.to(device)``);
- a name bound to what a move there gives (``fresh = nn.Linear(4, 2).to(device)``,
  ``x = x.to(device)``), to what a call given ``device=`` makes (``x = torch.randn(3,
  device=device)``, ``trainer = Trainer(model, device)``: given the device, by keyword or as a
  name), or to a deep copy of something on the device (``ema = copy.deepcopy(model)``);
  a container built of such values (``batch = {k: v.to(device) for k, v in batch.items()}``,
  ``x, y = x.to(device), y.to(device)``) is on the device too. A tensor the move gave back as it
  was, which another name also holds, is replaced by a copy under the bound name, as a GPU's move
  copies: the other names keep the CPU one.

Statements run at the cell's top level count (branches and loops included), in order: a later move
back to the device (``model.to(device)`` with the device a ``%%neuron`` cell made for cuda,
``.cuda()``) undoes an earlier move to the CPU, and a later binding of a name replaces what an
earlier one put on the device. Function and class bodies the cell only defines do not. ``x.cpu()``
and ``x.to(device)`` alone leave a tensor where it is, as on a GPU. Moves the source does not show
by name (a loop over a list of models, ``trainer.model.cpu()``) are not seen, and a reference to the
tensor taken in the same cell (``d = {"y": y}``) keeps the object the call returned.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import MutableMapping
from typing import Any

import torch

from neuron_workbench.run.namespace import (
    ORIGIN_ATTR,
    ResidentObjects,
    attributes_are_state,
    tensors_in,
)

#: Text a cell must contain to move anything this module follows (or a device's name).
_MOVE_WORDS = (".cpu(", ".to(", ".cuda(", "device=", "map_location=", "deepcopy(")


def follow_plain_cell_moves(
    source: str, namespace: MutableMapping[str, Any], resident: ResidentObjects
) -> list[str]:
    """Apply what the plain cell ``source`` moved (see the module); return the names it moved.

    Parameters
    ----------
    source : str
        The plain cell as Python (IPython's transforms applied), after it ran.
    namespace : mutable mapping
        The notebook's globals after the cell.
    resident : ResidentObjects
        What is on the device: earlier ``%%neuron`` cells' objects, and those this adds.

    Returns
    -------
    list of str
        The names moved to the CPU, then those put on the device, each in source order.
    """
    if not any(word in source for word in _MOVE_WORDS) and not any(
        name in source
        for name, value in namespace.items()
        if type(value) is torch.device and value in resident  # Trainer(model, dev)
    ):
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    finder = _Moves(namespace, resident)
    finder.visit(tree)
    return _forget_moves_to_host(finder, namespace, resident) + _remember_moves_to_device(
        finder, namespace, resident
    )


def _forget_moves_to_host(
    finder: _Moves, namespace: MutableMapping[str, Any], resident: ResidentObjects
) -> list[str]:
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


def _remember_moves_to_device(
    finder: _Moves, namespace: MutableMapping[str, Any], resident: ResidentObjects
) -> list[str]:
    placed = []
    # `model.to(device)`: a module moves in place; then the names bound to what is on the device
    receivers = [
        receiver
        for receiver, (where, target) in finder.last.items()
        if where == "device" and target is None and receiver not in finder.placed
    ]
    for name in receivers + list(finder.placed):
        if name not in namespace:
            continue
        value = namespace[name]
        how = finder.placed.get(name)
        if how is None and not isinstance(value, torch.nn.Module):
            continue  # `x.to(device)` alone gives a copy on a GPU: x stays where it is
        if resident.on_device(value) or next(iter(tensors_in(value)), None) is None:
            continue  # already there, or nothing to put there (a device, a module with no state)
        if how == "moved":
            # the stand-in's move gave the tensors back as they were; on a GPU they are copies
            value = namespace[name] = _device_copies(value)
        resident.add(value)
        _mark_attribute_tensors(value)
        placed.append(name)
    return placed


class _Moves(ast.NodeVisitor):
    """What the cell's top level moves.

    ``last``: the last move of each name, ``{name: ("cpu"|"device", bound)}``; ``bound``: the names
    each name's moves to the CPU bound (``y = x.cpu()``); ``placed``: the names whose last binding
    put its value on the device, in source order, and how (see :meth:`_placement`).
    """

    def __init__(self, namespace: MutableMapping[str, Any], resident: ResidentObjects) -> None:
        self.namespace = namespace
        self.resident = resident
        self.last: dict[str, tuple[str, str | None]] = {}
        self.bound: dict[str, list[str]] = {}
        self.placed: dict[str, str] = {}
        self._bound: dict[int, str] = {}  # an assigned call: the name it binds
        self._inner: set[int] = set()  # calls inside a chain already read with its outer call

    def visit_FunctionDef(self, node: ast.AST) -> None:  # noqa: N802 - ast.NodeVisitor's names
        return None  # only defined here: it may never run

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef  # noqa: N815

    def visit_Assign(self, node: ast.Assign) -> None:  # noqa: N802
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self._bound[id(node.value)] = node.targets[0].id
        self.generic_visit(node)  # first: binding a name forgets where its old value was
        for target in node.targets:
            self._bind(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # noqa: N802
        self.generic_visit(node)
        if node.value is not None:
            self._bind(node.target, node.value)

    def visit_Name(self, node: ast.Name) -> None:  # noqa: N802
        if isinstance(node.ctx, ast.Store | ast.Del):  # bound again (a loop, `with`, `del`)
            self.placed.pop(node.id, None)

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        """Note whether ``target = value`` puts what each name is bound to on the device."""
        if isinstance(target, ast.Name):
            placement = self._placement(value)
            if placement is not None:
                self.placed[target.id] = placement
        elif isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
            if len(value.elts) == len(target.elts):  # x, y = x.to(device), y.to(device)
                for item, item_value in zip(target.elts, value.elts, strict=True):
                    self._bind(item, item_value)

    def _placement(self, node: ast.expr) -> str | None:
        """Whether the expression ``node``'s value is on the device (as the cell means it), and how.

        ``"moved"``: a move there gave it (on the stand-in, its tensors are the ones it was given);
        ``"made"``: made there (a factory given the device, a deep copy); None: not on the device.
        """
        if isinstance(node, ast.ListComp | ast.SetComp):
            return self._placement(node.elt)
        if isinstance(node, ast.DictComp):
            return self._placement(node.value)
        if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
            items = node.values if isinstance(node, ast.Dict) else node.elts
            kinds = {self._placement(item) for item in items}
            return "moved" if "moved" in kinds else "made" if "made" in kinds else None
        calls = []  # the calls of a chain, outermost first: torch.randn(3, device=d).float()
        link: ast.expr = node
        while isinstance(link, ast.Call | ast.Attribute | ast.Subscript):
            if isinstance(link, ast.Call):
                calls.append(link)
            link = link.func if isinstance(link, ast.Call) else link.value
        for call in calls:  # the outermost call that says where wins
            placement = self._made_on(call)
            if placement is not None:
                where, kind = placement
                return kind if where == "device" else None
        return None

    def _made_on(self, call: ast.Call) -> tuple[str, str] | None:
        """Where ``call``'s value is (``"cpu"``, ``"device"``) and how it got there, if it says."""
        func = call.func
        method = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if method in ("cpu", "cuda", "to"):
            where = self._where(method, call)
            return None if where is None else (where, "moved")
        if method == "deepcopy" and call.args:
            root = call.args[0]
            while isinstance(root, ast.Call | ast.Attribute | ast.Subscript):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in self.namespace:
                if self.resident.on_device(self.namespace[root.id]):
                    return "device", "made"
            return None
        for keyword in call.keywords:  # torch.zeros(3, device=d), torch.load(f, map_location=d)
            if keyword.arg in ("device", "map_location"):
                where = _device_named(_device_of(keyword.value, self.namespace), self.resident)
                return None if where is None else (where, "made")
        for argument in call.args:  # Trainer(model, device): made for the device it was given
            if isinstance(argument, ast.Name):
                value = self.namespace.get(argument.id)
                if type(value) is torch.device and value in self.resident:
                    return "device", "made"
        return None

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


def _mark_attribute_tensors(value: Any, depth: int = 0) -> None:
    """Mark the tensors a notebook object (``Trainer(model, device)``) holds as on the device.

    The next run moves what such an object holds by the object (modules, containers), except its
    own tensors, which move by their marks (a counter a class keeps on the host stays there); one
    made for the device is taken to have made them there.
    """
    if depth > 8 or not attributes_are_state(value):
        return
    for item in list(getattr(value, "__dict__", {}).values()):
        if isinstance(item, torch.Tensor):
            with contextlib.suppress(AttributeError, TypeError):
                vars(item)[ORIGIN_ATTR] = "cuda"
        elif item is not value:
            _mark_attribute_tensors(item, depth + 1)


def _device_copies(value: Any) -> Any:
    """``value`` with the tensors in it (one level deep) copied, as a move to a GPU copies them.

    A module moves in place and keeps its tensors; a tuple is rebuilt, a list or dict changed in
    place (the cell's expression built it). The copies stay linked to their sources by autograd.
    """
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, torch.nn.Module):
        return value
    if type(value) is tuple:
        return tuple(item.clone() if isinstance(item, torch.Tensor) else item for item in value)
    if isinstance(value, list | dict):
        keys = range(len(value)) if isinstance(value, list) else list(value)
        for key in keys:
            if isinstance(value[key], torch.Tensor):
                value[key] = value[key].clone()
    return value


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

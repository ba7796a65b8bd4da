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
which the notebook holds as the stand-in), in code that surely ran (the top level and ``with``
blocks; not an ``if``, ``while``, ``try`` or loop body, nor what ``a or b`` and ``x if c else y``
may skip):

- a module moved there (``model.to(device)``, ``fresh = nn.Linear(4, 2).to(device)``): a module
  moves in place, whatever name the call's value is bound to, and its submodules with it (a name
  bound to one, ``backbone`` after ``model = nn.Sequential(backbone, head).to(device)``);
- what PyTorch makes given the device (``torch.randn(3, device=device)``, ``nn.Linear(4, 2,
  device=device)``, ``torch.load(f, map_location=device)``) or has just made and moves there
  (``torch.zeros(3).to(device)``); not what a function of the notebook's makes, which may be
  anything;
- a deep copy of something on the device (``ema = copy.deepcopy(model)``, or PyTorch's
  ``ema = AveragedModel(model)``, which deep-copies it);
- a tensor the notebook had, moved there (``x = x.to(device)``), or a list, tuple or dict of such
  tensors (``batch = {k: v.to(device) for k, v in batch.items()}``), when nothing but the new name
  holds it. On a GPU the move gives the name a device copy and every other holder (another name, a
  dataset, IPython's output history of a cell that showed it) keeps the CPU tensor; the stand-in's
  move gave the tensor back, which cannot be on the device for one holder only, so
  ``y = x.to(device)`` leaves ``y`` where ``x`` is. So does a PyTorch call that may give its input
  back (``torch.as_tensor(x, device=device)``).

And a tensor the cell *computes* from what is on the device (``x2 = x * 2``, ``preds =
logits.argmax(-1)``, ``z = torch.cat([x, y])``, ``noise = torch.randn_like(x)``, ``out = model(x)``,
``a, b = x.chunk(2)``, or a list, tuple or dict of such tensors: ``pair = (x * 2, y + 1)``,
``[x[i] * 2 for i in range(4)]``, or a ``TensorDataset`` of them, and the batch
``next(iter(loader))`` of a ``DataLoader`` over one; one appended or stored under a constant key
into a list or dict, :func:`_mark_items`), in code that surely ran: on a GPU it is on
cuda, where its inputs are. A list or dict the cell makes empty (``preds = []``) and then only
fills with such tensors, in a loop too (``for b in batches: preds.append(model(b))``, ``outs[i] =
model(b)``), holds nothing else: all its items are on the device, where nothing else in the cell
names it (a function or lambda the cell defines, another name, ``exec``: :meth:`_Moves.sole_user`).
In a loop, a name the loop binds, or moves (``model.cpu()``), is not known anywhere in its body
(the next pass reads what the last one left). Only
what PyTorch computes is followed: operators, a tensor's methods, PyTorch's functions and a module's
call. A factory not given a device (``torch.zeros(x.shape)``) makes it on the CPU, and so does what
goes through ``.cpu()``, ``.numpy()``, ``.item()`` or ``.tolist()``; a function of the notebook's
may return anything, and an expression reading what the source cannot place (an item of a list,
an object's attribute other than a module's) places nothing. A name the cell binds again
(``x = x * 2``) is read as it was before the cell (:func:`places_before`).

Statements count in order: a later move back to the device undoes an earlier move to the CPU and
the other way round (a move to the CPU counts in branches and loops too, as it did before moves to
the device were followed), and a later binding of a name replaces what an earlier one put on the device.
Function and class bodies the cell only defines, and the loop variables of comprehensions, do not
count. ``x.cpu()`` and ``x.to(device)`` alone leave a tensor where it is, as on a GPU. Moves the
source does not show by name (a loop over a list of models, ``trainer.model.cpu()``, a function
that moves what it is given) are not seen, and a reference to the tensor taken in the same cell
(``d = {"y": y}``) keeps the object the call returned.
"""

from __future__ import annotations

import ast
import builtins
import collections
import sys
import types
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from neuron_workbench.run.namespace import (
    ORIGIN_ATTR,
    ResidentObjects,
    mark_on_accelerator,
    on_accelerator,
    tensors_in,
)

#: PyTorch's functions whose value is always a new tensor (or, ``load``, new tensors).
_NEW_TENSORS = frozenset(
    {
        *("arange", "empty", "empty_like", "empty_strided", "eye", "full", "full_like", "linspace"),
        *("load", "logspace", "normal", "ones", "ones_like", "rand", "rand_like", "randint"),
        *("randint_like", "randn", "randn_like", "randperm", "tensor", "zeros", "zeros_like"),
    }
)

#: Methods that move a tensor or module (in place, for a module).
_MOVES = frozenset({"cpu", "cuda", "to", "type", "to_empty"})

#: Builtins that run or reach code the cell's source does not show.
_OPAQUE = ("exec", "eval", "globals", "locals", "vars", "setattr")

#: Text a cell must contain to move anything this module follows.
_MOVE_WORDS = (
    *(".cpu(", ".to(", ".cuda(", "device=", "map_location=", "deepcopy("),
    "AveragedModel(",
)


def _copies_a_module(kind: Any) -> bool:
    """Whether calling ``kind`` gives a deep copy of the module it is given, where it was.

    ``torch.optim.swa_utils.AveragedModel(model)`` (an EMA or SWA model) deep-copies ``model``.
    """
    from torch.optim.swa_utils import AveragedModel

    return isinstance(kind, type) and issubclass(kind, AveragedModel)


def follow_plain_cell_moves(
    source: str,
    namespace: MutableMapping[str, Any],
    resident: ResidentObjects,
    before: Mapping[str, str | None] | None = None,
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
    before : mapping, optional
        Where the values of the names the cell binds were before it ran (:func:`places_before`):
        what it computes from them (``x = x * 2``) is read as computed from those. Without it,
        what the cell computes is followed only from names it does not bind.

    Returns
    -------
    list of str
        The names moved to the CPU, then those put on the device.
    """
    if not any(word in source for word in _MOVE_WORDS) and not _may_compute(source):
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    finder = _Moves(namespace, resident, before)
    finder.visit(tree)
    moved = _forget_moves_to_host(finder, namespace, resident)
    return moved + _remember_moves_to_device(finder, namespace, resident) + _mark_items(finder)


def places_before(
    source: str, namespace: Mapping[str, Any], resident: ResidentObjects
) -> dict[str, str | None]:
    """Where the values of the names the plain cell ``source`` binds are, before it runs.

    For :func:`follow_plain_cell_moves`, which reads the cell after it ran, when the name holds
    what the cell bound: ``x = x * 2`` computes from the ``x`` before it, on the device or not.
    Each place is ``"device"``, ``"cpu"`` (a tensor or module elsewhere), ``"scalar"`` (a Python
    number, string or None) or None (not known).
    """
    if not _may_compute(source):
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    return {
        name: _place_of(namespace[name], resident) for name in _bound_in(tree) if name in namespace
    }


def _bound_in(tree: ast.AST) -> set[str]:
    """The names ``tree`` binds anywhere (assignments, loops, ``with``, ``del``, ``import``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def _may_compute(source: str) -> bool:
    """Whether ``source`` may bind a name to a computed value (a cheap look at its text)."""
    return "=" in source


_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _place_of(value: Any, resident: ResidentObjects) -> str | None:
    """Where ``value`` is, as :func:`places_before` says it (no walk through containers)."""
    if isinstance(value, torch.Tensor | torch.nn.Module):
        return "device" if resident.on_device(value) else "cpu"
    if isinstance(value, _SCALARS) or isinstance(value, torch.dtype):
        return "scalar"
    # a container or object the registry holds (a batch dict a %%neuron cell bound); any other
    # one is not looked through (a dataset of thousands of tensors): not known
    return "device" if value in resident else None


#: A tensor's methods whose value is on the CPU (or no tensor), wherever the tensor is.
_TO_HOST_METHODS = frozenset({"cpu", "numpy", "item", "tolist"})
#: A tensor's attributes that are no tensor (a shape, a dtype, a device).
_NO_TENSOR_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "is_leaf"}
)


def _computes(node: ast.expr) -> bool:
    """Whether ``node`` computes a value, rather than naming or holding one (``y = x``, ``[x]``)."""
    return isinstance(node, ast.BinOp | ast.UnaryOp | ast.Call | ast.Subscript | ast.Attribute)


def _combined(places: list[str | None]) -> str | None:
    """The place of a value computed from values at ``places``: where a GPU computes it."""
    if None in places:
        return None
    if "device" in places:
        return "device"  # (with CPU tensors too: a GPU refuses that or takes a CPU scalar)
    return "cpu" if "cpu" in places else "scalar"


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
                held = namespace.get(bound)
                # (`row = x[0].cpu()`, `c = x[0].detach().cpu()`, `a = x.cpu()[0]` bound a view of
                # its memory here, with or without a _base)
                if held is value or (isinstance(held, torch.Tensor) and _same_memory(held, value)):
                    # what .cpu() gives on a GPU: a copy of what the name holds (no device mark),
                    # linked by autograd
                    namespace[bound] = held.clone()
                    moved.append(bound)
            continue
        if where != "cpu":
            continue
        if target is not None and target != receiver and namespace.get(target) is not value:
            continue  # `y = obj.to("cpu")` gave something new: obj itself did not move
        _forget(value, resident)
        moved.append(receiver)
    return moved


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` view one storage (False for tensors without one)."""
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a sparse or a wrapper subclass tensor
        return False


def _remember_moves_to_device(
    finder: _Moves, namespace: MutableMapping[str, Any], resident: ResidentObjects
) -> list[str]:
    placed = []
    # `model.to(device)`: a module moves in place, whatever the call's value is bound to
    for receiver in finder.moved_there:
        value = namespace.get(receiver)
        if isinstance(value, torch.nn.Module) and _to_place(value, resident):
            resident.add(value)
            placed.append(receiver)
    for name, (how, assignment) in finder.placed.items():
        if name not in namespace:
            continue
        value = namespace[name]
        if not _to_place(value, resident):
            continue
        if how == "moved" and not isinstance(value, torch.nn.Module):
            together = sum(
                1
                for other, (_, a) in finder.placed.items()
                if a == assignment and namespace.get(other) is value
            )
            del value  # counted: nothing here may hold it
            if not _held_only_by_the_names(namespace, name, together):
                continue  # see the module: a GPU's move copies, the stand-in's gave it back
            value = namespace[name]
        resident.add(value)
        placed.append(name)
    # DataLoader(TensorDataset(x * 2, y)): the dataset it was given, bound to no name, is there
    for name in finder.loaders_on_device:
        loader = namespace.get(name)
        dataset = getattr(loader, "dataset", None)
        if isinstance(loader, torch.utils.data.DataLoader) and _to_place(dataset, resident):
            resident.add(dataset)
            for tensor in tensors_in(dataset):  # (moved with the loader that holds them)
                mark_on_accelerator(tensor)
    # a module moves its submodules with it: names bound to them (`backbone` after
    # `model = nn.Sequential(backbone, head).to(device)`) are on the device too
    inside = {
        id(sub)
        for name in placed
        if isinstance(namespace.get(name), torch.nn.Module)
        for sub in namespace[name].modules()
    }
    if inside:
        for name, value in namespace.items():
            if (
                isinstance(value, torch.nn.Module)
                and id(value) in inside
                and name not in placed
                and _to_place(value, resident)
            ):
                resident.add(value)
                placed.append(name)
    return placed


def _mark_items(finder: _Moves) -> list[str]:
    """Mark the tensors the cell computed on the device into a notebook list or dict.

    ``outs.append(x * 2)``, ``results["a"] = model(x)``: on a GPU the container holds a cuda
    tensor; the mark puts that tensor (and nothing else the container holds) on the device for
    the next ``%%neuron`` cell, as a worker's mark does (:func:`on_accelerator`).
    """
    namespace = finder.namespace
    computed: dict[str, list[Any]] = {}
    for name, appended in finder.appended.items():
        held = namespace.get(name)
        if name in finder.spoilt or not appended or type(held) is not list:
            continue
        if not all(there for there, _ in appended):
            continue
        if name in finder.fresh and finder.sole_user(name):
            computed[name] = list(held)  # preds = [] and only appends since, in loops too: all
        elif not any(repeated for _, repeated in appended) and len(held) >= len(appended):
            computed[name] = held[len(held) - len(appended) :]
    for name, stored in finder.stored.items():
        held = namespace.get(name)
        constant = [there for (each, _), there in finder.keyed.items() if each == name]
        if name in finder.spoilt or not finder.sole_user(name) or type(held) is not dict:
            continue
        if all(stored) and all(constant):
            computed[name] = list(held.values())  # outs = {} and only stores since: all of it
    for (name, key), there in finder.keyed.items():
        held = namespace.get(name)
        if name in finder.spoilt or not there or type(held) is not dict or key not in held:
            continue
        computed.setdefault(name, []).append(held[key])
    marked = []
    for name, items in computed.items():
        # Only a container then all on the device: the next cell moves a container holding a
        # tensor marked there as a whole, where a GPU keeps its CPU tensors on the CPU.
        fresh = {id(t) for t in items}
        if not all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in items) or not all(
            id(t) in fresh or on_accelerator(t) for t in tensors_in(namespace[name])
        ):
            continue
        for tensor in items:
            mark_on_accelerator(tensor)
        marked.append(name)
    return marked


def _to_place(value: Any, resident: ResidentObjects) -> bool:
    """Whether ``value`` is not on the device yet and has something to put there.

    (A device object, or a module with no parameters or buffers, has nothing.)
    """
    return not resident.on_device(value) and next(iter(tensors_in(value)), None) is not None


def _held_only_by_the_names(namespace: MutableMapping[str, Any], name: str, names: int) -> bool:
    """Whether nothing but ``names`` notebook names holds ``namespace[name]`` (a move's value).

    A tensor, or a list, tuple or dict of tensors nothing else holds. On a GPU a move gives a
    device copy and every other holder (another name, a dataset, IPython's output history)
    keeps the CPU tensor; on the stand-in the move gave that tensor back, which cannot be on the
    device for this name only. Any other object is not followed.
    """
    # Each count is compared with a probe's, held as the value is and asked the same way: the
    # references a call adds itself are the interpreter's business.
    probe = {"probe": object()}
    if _references(namespace[name]) - names != _references(probe["probe"]) - 1:
        return False
    value = namespace[name]
    if isinstance(value, torch.Tensor):
        return True
    if type(value) not in (list, tuple, dict):
        return False
    keys = list(value) if type(value) is dict else range(len(value))
    return all(
        isinstance(value[key], torch.Tensor)
        and _references(value[key]) == _references(probe["probe"])
        for key in keys
        if not isinstance(value[key], bool | int | float | str | bytes | type(None))
    )


def _references(value: Any) -> int:
    return sys.getrefcount(value)


class _Moves(ast.NodeVisitor):
    """What the cell moves, statement by statement.

    ``last``: the last move of each name as a receiver, ``{name: ("cpu"|"device", bound)}``;
    ``bound``: the names each name's moves to the CPU bound (``y = x.cpu()``); ``placed``: the
    names whose last binding put its value on the device, ``{name: (how, assignment)}`` (see
    :meth:`_placement`; the assignment's id groups ``a = b = x.to(device)``); ``moved_there``:
    the names moved to the device in place (``model.to(device)``).
    """

    def __init__(
        self,
        namespace: MutableMapping[str, Any],
        resident: ResidentObjects,
        before: Mapping[str, str | None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.resident = resident
        #: where the values of the names the cell binds were before it (see places_before)
        self.before = before
        #: an assignment's value: where a GPU computed it (read before its targets are bound)
        self._computed: dict[int, str | None] = {}
        self.last: dict[str, tuple[str, str | None]] = {}
        self.bound: dict[str, list[str]] = {}
        self.placed: dict[str, tuple[str, int]] = {}
        #: the modules the cell moved to the device in place, in code that surely ran
        self.moved_there: dict[str, None] = {}
        #: where each name's value is as the cell has run so far ("cpu", "device")
        self.where_now: dict[str, str] = {}
        self._bound: dict[int, str] = {}  # an assigned call: the name it binds
        self._inner: set[int] = set()  # calls inside a chain already read with its outer call
        self._conditional = 0  # in code that may not have run (an if, a loop, `a or b`)
        self._local: list[set[str]] = []  # the loop variables of the comprehensions around
        #: the names the cell binds anywhere, and those bound once, by a top-level `name = ...`
        self.bindings: set[str] = set()
        self.bound_once: set[str] = set()
        #: loaders the cell built over a dataset it built on the device
        self.loaders_on_device: set[str] = set()
        #: per list name, whether each `name.append(value)` appended a value computed there, and
        #: whether it may have run any number of times (in a loop, a branch)
        self.appended: dict[str, list[tuple[bool, bool]]] = {}
        #: the names bound in code that surely ran to a new empty list or dict (`preds = []`)
        self.fresh: set[str] = set()
        #: per such dict, whether each `name[key] = value` stored a value computed there
        self.stored: dict[str, list[bool]] = {}
        #: how often each name appears in the cell (functions and lambdas it defines included),
        #: and how many of those uses of a new container the visit read: binding it empty,
        #: appending or storing into it, handing it to print, len or PyTorch. A use it did not
        #: read (`def collect(t): preds.append(t.cpu())`, `d = {"p": preds}`) may put anything
        #: there: such a container is not followed (see _mark_items)
        self.uses: collections.Counter[str] = collections.Counter()
        self.accounted: collections.Counter[str] = collections.Counter()
        #: whether the cell runs code the source does not show (exec, eval, globals())
        self.opaque = False
        #: per `name[constant] = value`, whether its last such statement stored one computed there
        self.keyed: dict[tuple[str, Any], bool] = {}
        #: containers changed otherwise (pop, extend, del, a computed key, given to a function)
        self.spoilt: set[str] = set()

    def visit_Module(self, node: ast.Module) -> None:  # noqa: N802
        stores = [
            n.id
            for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del)
        ]
        self.bindings = _bound_in(node)
        if self.before is None:  # where what the cell binds was is not known: nothing from it
            self.before = dict.fromkeys(self.bindings)
        top = [
            s.targets[0].id
            for s in node.body
            if isinstance(s, ast.Assign)
            and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name)
        ]
        self.bound_once = {name for name in top if stores.count(name) == 1}
        self.uses.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        self.opaque = any(self.uses[name] for name in _OPAQUE) or any(
            isinstance(n, ast.Global | ast.Nonlocal) for n in ast.walk(node)
        )
        self._spoil(node)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.AST) -> None:  # noqa: N802 - ast.NodeVisitor's names
        return None  # only defined here: it may never run

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef  # noqa: N815

    def _visit_conditionally(self, *nodes: ast.AST) -> None:
        self._conditional += 1
        try:
            for node in nodes:
                self.visit(node)
        finally:
            self._conditional -= 1

    def _visit_branches(self, node: ast.AST) -> None:
        self._visit_conditionally(*ast.iter_child_nodes(node))

    visit_If = visit_Try = visit_TryStar = visit_Match = _visit_branches  # noqa: N815

    def _visit_loop(self, node: ast.AST) -> None:
        # the body may run no time, or many: a pass reads what the pass before bound
        # (`h = h.cpu()` after `preds.append(h * 2)`), so a name the loop binds is not known in it
        moved = {  # model.cpu() in the body: the next pass calls a model that is elsewhere
            inner.func.value.id
            for inner in ast.walk(node)
            if isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr in _MOVES
            and isinstance(inner.func.value, ast.Name)
        }
        for name in _bound_in(node) | moved:
            if not self._is_local(name):
                self.where_now[name] = "unknown"
        self._visit_branches(node)

    visit_For = visit_AsyncFor = visit_While = _visit_loop  # noqa: N815

    def visit_BoolOp(self, node: ast.BoolOp) -> None:  # noqa: N802
        self.visit(node.values[0])  # `flag and (x := x.to(device))`: the rest may not run
        self._visit_conditionally(*node.values[1:])

    def visit_IfExp(self, node: ast.IfExp) -> None:  # noqa: N802
        self.visit(node.test)
        self._visit_conditionally(node.body, node.orelse)

    def _visit_comprehension(self, node: ast.AST) -> None:
        # The first iterable runs in the cell; the rest may run no time, and its loop variables
        # are its own (a move of one is no move of the cell's name).
        generators = node.generators  # type: ignore[attr-defined]
        self.visit(generators[0].iter)
        self._local.append(
            {n.id for g in generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        )
        try:
            parts = [g.iter for g in generators[1:]] + [c for g in generators for c in g.ifs]
            if isinstance(node, ast.DictComp):
                parts += [node.key, node.value]
            else:
                parts.append(node.elt)  # type: ignore[attr-defined]
            self._visit_conditionally(*parts)
        finally:
            self._local.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension  # noqa: N815

    def sole_user(self, name: str) -> bool:
        """Whether the visit read every use the cell makes of ``name`` (see :attr:`uses`)."""
        return not self.opaque and self.uses[name] == self.accounted[name]

    def _is_local(self, name: str) -> bool:
        return any(name in names for names in self._local)

    def visit_Assign(self, node: ast.Assign) -> None:  # noqa: N802
        # where its value is computed, as the names it reads are before this statement binds any
        self._computed[id(node.value)] = self._computed_place(node.value)
        self._note_items(node.value)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self._bound[id(node.value)] = node.targets[0].id
            # `a = x.cpu()[0]`: the move binds the name too, through the part taken of its result
            value = node.value
            while isinstance(value, ast.Subscript):
                value = value.value
            self._bound.setdefault(id(value), node.targets[0].id)
        dataset = self._loaders_dataset(node.value)
        if dataset is not None:
            self._note_items(dataset)
        self.generic_visit(node)  # first: binding a name forgets where its old value was
        for target in node.targets:
            self._bind(target, node.value, id(node))
            if isinstance(target, ast.Subscript):
                self._note_item_store(target, node.value)
        if not self._conditional and len(node.targets) == 1:
            # preds = [], outs = {}, preds = list(), all_preds, all_labels = [], []: the cell's own
            target, value = node.targets[0], node.value
            pairs = [(target, value)]
            if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
                if len(target.elts) == len(value.elts):
                    pairs = list(zip(target.elts, value.elts, strict=True))
            for name, made in pairs:
                if isinstance(name, ast.Name) and not self._is_local(name.id) and self._empty(made):
                    self.fresh.add(name.id)
                    self.accounted[name.id] += 1
        if dataset is not None and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            # DataLoader(TensorDataset(x, y)): a dataset the cell builds there, bound to no name
            if self._placement(dataset) == "made" and not self._conditional:
                self.loaders_on_device.add(node.targets[0].id)

    def _empty(self, value: ast.expr) -> bool:
        """Whether ``value`` makes a new empty list or dict (``[]``, ``{}``, ``list()``)."""
        if isinstance(value, ast.List):
            return not value.elts
        if isinstance(value, ast.Dict):
            return not value.keys
        if not isinstance(value, ast.Call) or value.args or value.keywords:
            return False
        func = value.func  # list(), dict(): the builtins, unless the notebook named others so
        return isinstance(func, ast.Name) and self.namespace.get(
            func.id, getattr(builtins, func.id, None)
        ) in (list, dict)

    def _loaders_dataset(self, value: ast.expr) -> ast.expr | None:
        """The dataset argument of ``value`` if it is a ``DataLoader(...)`` call, else None."""
        from torch.utils.data import DataLoader

        if not isinstance(value, ast.Call) or self._resolved(value.func) is not DataLoader:
            return None
        if value.args and not isinstance(value.args[0], ast.Starred):
            return value.args[0]
        return next((k.value for k in value.keywords if k.arg == "dataset"), None)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # noqa: N802
        if node.value is not None:
            self._computed[id(node.value)] = self._computed_place(node.value)
            self._note_items(node.value)
        self.generic_visit(node)
        if node.value is not None:
            self._bind(node.target, node.value, id(node))

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:  # noqa: N802
        self.generic_visit(node)
        self._bind(node.target, node.value, id(node))

    def visit_Expr(self, node: ast.Expr) -> None:  # noqa: N802
        call = node.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "append"
            and isinstance(call.func.value, ast.Name)
            and not self._is_local(call.func.value.id)
            and len(call.args) == 1
            and not call.keywords
        ):
            # outs.append(x * 2): a tensor computed where x is, held by the list alone
            item = call.args[0]
            there = self._computed_place(item) == "device" and _computes(item)
            self.appended.setdefault(call.func.value.id, []).append((there, self._conditional > 0))
            self.accounted[call.func.value.id] += 1
        self.generic_visit(node)

    def _note_item_store(self, target: ast.Subscript, value: ast.expr) -> None:
        """Note ``name[key] = value``: a constant key's last store, or a spoilt container."""
        if not isinstance(target.value, ast.Name) or self._is_local(target.value.id):
            return
        name = target.value.id
        constant = isinstance(target.slice, ast.Constant)
        if name in self.fresh:
            self.accounted[name] += 1
        if not constant and name in self.fresh and type(self.namespace.get(name)) is dict:
            # outs[i] = model(b) into the cell's own new dict: whatever the key, an item of it
            there = self._computed.get(id(value)) == "device" and _computes(value)
            self.stored.setdefault(name, []).append(there)
        elif constant and type(self.namespace.get(name)) is dict:
            there = self._computed.get(id(value)) == "device" and _computes(value)
            self.keyed[(name, target.slice.value)] = there and not self._conditional
        else:
            self.spoilt.add(name)  # outs[0] = ..., table[k] = ...: which item is not known

    def _spoil(self, node: ast.AST) -> None:
        """Note the containers ``node`` may change other than by appending or constant keys."""
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call):
                func = inner.func
                if (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.attr != "append"
                ):
                    self.spoilt.add(func.value.id)  # extend, insert, pop, update, clear, sort ...
                harmless = (
                    isinstance(func, ast.Name) and func.id in ("print", "len")
                ) or _pytorchs(self._resolved(func))  # torch.cat(outs) reads it
                for argument in [*inner.args, *(k.value for k in inner.keywords)]:
                    if isinstance(argument, ast.Name) and not harmless:
                        self.spoilt.add(argument.id)  # a function given it may change it
                    elif isinstance(argument, ast.Name):
                        self.accounted[argument.id] += 1  # torch.cat(outs), len(outs): a read
            elif isinstance(inner, ast.Subscript) and isinstance(inner.ctx, ast.Del):
                if isinstance(inner.value, ast.Name):
                    self.spoilt.add(inner.value.id)
            elif isinstance(inner, ast.AugAssign) and isinstance(inner.target, ast.Name):
                self.spoilt.add(inner.target.id)
            elif isinstance(inner, ast.Assign | ast.AnnAssign | ast.NamedExpr) and isinstance(
                inner.value, ast.Name
            ):
                self.spoilt.add(inner.value.id)  # other = outs: filled under another name too

    def visit_AugAssign(self, node: ast.AugAssign) -> None:  # noqa: N802
        self.visit(node.value)
        # `x += 1` changes a tensor in place, still where it was; `t += (y,)` makes a new tuple
        target = node.target
        if isinstance(target, ast.Name) and not isinstance(
            self.namespace.get(target.id), torch.Tensor
        ):
            self.visit(target)

    def visit_Name(self, node: ast.Name) -> None:  # noqa: N802
        # bound again (a loop, `with`, `del`): where its value is is not known from here
        if isinstance(node.ctx, ast.Store | ast.Del) and not self._is_local(node.id):
            # a new container (outs = []): what was appended to the old one is not in it
            self.appended.pop(node.id, None)
            self.keyed = {k: v for k, v in self.keyed.items() if k[0] != node.id}
            self.fresh.discard(node.id)
            self.stored.pop(node.id, None)
            if self._conditional:
                self.spoilt.add(node.id)
            self.placed.pop(node.id, None)
            self.moved_there.pop(node.id, None)
            self.where_now[node.id] = "unknown"

    def _bind(self, target: ast.expr, value: ast.expr, assignment: int) -> None:
        """Note whether ``target = value`` puts what each name is bound to on the device."""
        if isinstance(target, ast.Name):
            how = self._placement(value)
            if how is None and self._computed.get(id(value)) == "device" and _computes(value):
                how = "made"  # x2 = x * 2: computed where x is, a new tensor
            if how is not None and not self._conditional:
                self.placed[target.id] = (how, assignment)
                self.where_now[target.id] = "device"
            elif how is not None:
                self.where_now[target.id] = "unknown"
            elif self._computed.get(id(value)) == "cpu" and not self._conditional:
                self.where_now[target.id] = "cpu"  # computed on the CPU: read so by what follows
        elif isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
            if len(value.elts) == len(target.elts):  # x, y = x.to(device), y.to(device)
                for item, item_value in zip(target.elts, value.elts, strict=True):
                    self._computed.setdefault(id(item_value), self._computed_place(item_value))
                    self._bind(item, item_value, id(item_value))
        elif isinstance(target, ast.Tuple | ast.List) and not self._conditional:
            if self._computed.get(id(value)) == "device" and _computes(value):  # a, b = x.chunk(2)
                for item in target.elts:
                    if isinstance(item, ast.Name):
                        self.placed[item.id] = ("made", assignment)
                        self.where_now[item.id] = "device"

    def _name_place(self, name: str) -> str | None:
        """Where the value of ``name`` is at this point of the cell (see :func:`_place_of`)."""
        if self._is_local(name):
            return None
        where = self.where_now.get(name)
        if where is not None:
            if where == "device" and self.placed.get(name, ("made",))[0] == "moved":
                return None  # x = x.to(device) may leave x where it was (see the module)
            return where if where in ("device", "cpu") else None
        if self.before is not None and name in self.before:
            return self.before[name]  # bound by the cell later on: as it was before it
        if name not in self.namespace:
            return None
        return _place_of(self.namespace[name], self.resident)

    def _computed_place(self, node: ast.expr) -> str | None:
        """Where a GPU computes the value of ``node``: ``"device"``, ``"cpu"``, ``"scalar"``, None.

        None: not known (a function of the notebook's, an item of a container, an object).
        """
        if isinstance(node, ast.Constant):
            return "scalar"
        if isinstance(node, ast.Name):
            return self._name_place(node.id)
        if isinstance(node, ast.UnaryOp):
            return self._computed_place(node.operand)
        if isinstance(node, ast.BinOp):
            return _combined([self._computed_place(node.left), self._computed_place(node.right)])
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            return _combined([self._computed_place(each) for each in operands])
        if isinstance(node, ast.Subscript):
            where = self._computed_place(node.value)
            return where if where in ("device", "cpu") else None
        if isinstance(node, ast.Attribute):
            if isinstance(self._resolved(node.value), types.ModuleType):
                return "scalar"  # torch.float16, math.pi
            if node.attr in _NO_TENSOR_ATTRIBUTES:
                return "scalar"
            owner = self._computed_place(node.value)  # model.fc.weight, x.T
            return owner if owner in ("device", "cpu") else None
        if isinstance(node, ast.List | ast.Tuple):
            return _combined([self._computed_place(each) for each in node.elts])
        if isinstance(node, ast.Call):
            return self._call_place(node)
        return None

    def _first_batch_place(self, call: ast.Call) -> str | None:
        """Where ``next(iter(loader))`` is: ``"device"`` for a loader over a dataset there.

        A ``DataLoader`` with no worker processes, torch's own collate and no pinning, over a
        ``TensorDataset`` of tensors on the device, stacks their rows where they are: on cuda on
        a GPU. Any other loader or dataset (a ``__getitem__`` of the notebook's) is not known.
        """
        from torch.utils.data import DataLoader, TensorDataset, default_collate

        inner = call.args[0] if len(call.args) == 1 and not call.keywords else None
        if not (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Name)
            and inner.func.id == "iter"
            and inner.func.id not in self.namespace
            and len(inner.args) == 1
            and not inner.keywords
            and isinstance(inner.args[0], ast.Name)
        ):
            return None
        name = inner.args[0].id
        loader = self.namespace.get(name)
        # the loader the notebook holds now is the one read here: the cell binds the name nowhere,
        # or once, in a statement of its own that ran before this one
        bound_here = self.where_now.get(name) is not None
        if (
            self._is_local(name)
            or (name in self.bindings and not (bound_here and name in self.bound_once))
            or type(loader) is not DataLoader
            or loader.num_workers != 0
            or loader.pin_memory
            or loader.collate_fn is not default_collate
            or type(loader.dataset) is not TensorDataset
        ):
            return None
        # the dataset itself was put there (by a %%neuron cell, or made of tensors there by a plain
        # one, this cell too): its tensors being on the device says nothing, as on the stand-in
        # `TensorDataset(x.cpu())` holds x itself where a GPU holds a CPU copy
        dataset = loader.dataset
        placed_here = any(
            self.namespace.get(held) is dataset and how == "made"
            for held, (how, _) in self.placed.items()
        )
        placed_here = placed_here or (bound_here and name in self.loaders_on_device)
        # (a loader a %%neuron cell left holding device tensors: its dataset's)
        on_device = dataset in self.resident or loader in self.resident
        return "device" if on_device or placed_here else None

    def _arguments_place(self, call: ast.Call) -> str | None:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            return None  # f(*args, **kwargs): not read from here
        values = [*call.args, *(k.value for k in call.keywords)]
        return _combined([self._computed_place(each) for each in values])

    def _call_place(self, call: ast.Call) -> str | None:
        func = call.func
        resolved = self._resolved(func)
        # (a module of PyTorch's, nn.Linear(4, 3), is called as the notebook's are: below)
        if _pytorchs(resolved) and not isinstance(resolved, type | torch.nn.Module):
            for keyword in call.keywords:
                if keyword.arg in ("device", "map_location"):
                    value = keyword.value
                    if isinstance(value, ast.Attribute) and value.attr == "device":
                        where = self._computed_place(value.value)  # device=x.device: where x is
                        return where if where in ("device", "cpu") else None
                    placement = self._made_on(call)  # torch.zeros(3, device=d)
                    return None if placement is None else placement[0]
            name = getattr(resolved, "__name__", "")
            if name in _NEW_TENSORS and not name.endswith("_like"):
                return "cpu"  # a factory given no device: torch.zeros(x.shape)
            if name.endswith("_like") and call.args:
                return self._computed_place(call.args[0])
            return self._arguments_place(call)  # torch.cat([x, y]), F.softmax(x, dim=-1)
        if isinstance(func, ast.Name) and func.id == "next" and func.id not in self.namespace:
            return self._first_batch_place(call)
        if isinstance(func, ast.Name):
            module = self.namespace.get(func.id)
            if not isinstance(module, torch.nn.Module):
                return None  # a function or class of the notebook's: may return anything
            where = self._name_place(func.id)
            if where == "device":
                return "device"  # model(x): where its parameters are
            if next(iter(tensors_in(module)), None) is None:
                return self._arguments_place(call)  # nn.ReLU()(x): where x is
            return "cpu" if where == "cpu" else None
        if not isinstance(func, ast.Attribute):
            return None
        method = func.attr
        if method in _TO_HOST_METHODS:
            return "cpu"
        if method == "type" and (call.args or call.keywords):
            # x.type(torch.float16) stays where x is; x.type(torch.FloatTensor) (or its name) is
            # on the CPU, x.type(torch.cuda.FloatTensor) on the device: not read here
            given = call.args[0] if call.args else call.keywords[0].value
            if not isinstance(self._resolved(given), torch.dtype):
                return None
        if method in ("to", "cuda"):
            where = self._where(method, call)
            if where is not None:
                return where
            devices = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "device")]
            of = next(
                (d for d in devices if isinstance(d, ast.Attribute) and d.attr == "device"), None
            )
            if isinstance(of, ast.Attribute):  # x.to(y.device), x.to(device=y.device): where y is
                where = self._computed_place(of.value)
                return where if where in ("device", "cpu") else None
            if method == "to" and call.args and not call.keywords:
                # x.to(other): where the other tensor is; x.to(torch.float16): where x is
                other = self._computed_place(call.args[0])
                if other in ("device", "cpu"):
                    return other
        owner = self._computed_place(func.value)
        return owner if owner in ("device", "cpu") else None

    def _is_tensor_dataset(self, func: ast.expr) -> bool:
        from torch.utils.data import TensorDataset

        return self._resolved(func) is TensorDataset

    def _placement(self, node: ast.expr, items: list[ast.expr] | None = None) -> str | None:
        """Whether the expression ``node``'s value is on the device (as the cell means it), and how.

        ``"moved"``: a move there gave it (on the stand-in, the tensor it was given); ``"made"``:
        made there (PyTorch given the device, a deep copy); None: not known to be there.
        """
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp):
            item = node.value if isinstance(node, ast.DictComp) else node.elt
            return self._placement(item) or self._item_computed(item)
        if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
            # every item there (a constant holds no tensor): [x.to(device), 3], not [x.to(device), y]
            if items is None:
                items = node.values if isinstance(node, ast.Dict) else node.elts
            kinds = [
                None
                if isinstance(i, ast.Constant)
                else self._placement(i) or self._item_computed(i)
                for i in items
            ]
            placed = [
                k for i, k in zip(items, kinds, strict=True) if not isinstance(i, ast.Constant)
            ]
            if not placed or None in placed:
                return None
            return "moved" if "moved" in placed else "made"
        if isinstance(node, ast.Call) and self._is_tensor_dataset(node.func) and node.args:
            # TensorDataset(x * 2, y): a container of its arguments, as a tuple of them is
            return self._placement(ast.Tuple(elts=node.args, ctx=ast.Load()), node.args)
        calls, _ = _chain(node)
        for call in calls:  # the outermost call that says where wins
            placement = self._made_on(call)
            if placement is not None:
                where, how = placement
                return how if where == "device" else None
        return None

    def _item_computed(self, item: ast.expr) -> str | None:
        """``"made"`` if a GPU computes the container item ``item`` on the device, else None.

        ``pair = (x * 2, y + 1)``, ``d = {"a": x.sum(0), "b": y}``, ``[x[i] * 2 for i in
        range(4)]``: a container of what is computed there (or already is there) holds device
        tensors on a GPU. Read as the names were before the statement (see :meth:`visit_Assign`).
        """
        where = self._computed.get(id(item))
        if where is None:
            return None
        if _computes(item) or isinstance(item, ast.Name):
            return "made" if where == "device" else None
        return None

    def _note_items(self, node: ast.expr) -> None:
        """Read where a GPU computes each item of the container ``node`` builds, before binding.

        A comprehension's own loop variables are not the notebook's names: an item reading one
        (``[t * 2 for t in ts]``) is not known, one reading none of them is
        (``[x[i] * 2 for i in range(4)]``: ``x[i]`` is where ``x`` is).
        """
        if isinstance(node, ast.Call) and self._is_tensor_dataset(node.func):
            self._note_items(ast.Tuple(elts=node.args, ctx=ast.Load()))
        elif isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
            items = node.values if isinstance(node, ast.Dict) else node.elts
            for item in items:
                if not isinstance(item, ast.Constant):
                    self._computed[id(item)] = self._computed_place(item)
                    self._note_items(item)
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp):
            item = node.value if isinstance(node, ast.DictComp) else node.elt
            generators = node.generators
            self._local.append(
                {n.id for g in generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            )
            try:
                self._computed[id(item)] = self._computed_place(item)
            finally:
                self._local.pop()

    def _made_on(self, call: ast.Call) -> tuple[str, str] | None:
        """Where ``call``'s value is (``"cpu"``, ``"device"``) and how it got there, if it says."""
        func = call.func
        method = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if method in ("cpu", "cuda", "to"):
            where = self._where(method, call)
            if where is None:
                return None
            # what PyTorch has just made is new (torch.zeros(3).to(device), nn.Linear(4, 2).cuda())
            return where, "made" if self._made_by_pytorch(func) else "moved"
        if call.args and (method == "deepcopy" or _copies_a_module(self._resolved(func))):
            _, root = _chain(call.args[0])
            if not isinstance(root, ast.Name):
                return None
            where = self.where_now.get(root.id)  # as the cell left it so far
            if where is None and root.id in self.namespace:
                on_device = self.resident.on_device(self.namespace[root.id])
                where = "device" if on_device else None
            return ("device", "made") if where == "device" else None
        if not _pytorchs(self._resolved(func)):
            return None  # a function of the notebook's given the device may return anything
        for keyword in call.keywords:  # torch.zeros(3, device=d), torch.load(f, map_location=d)
            if keyword.arg in ("device", "map_location"):
                where = _device_named(_device_of(keyword.value, self.namespace), self.resident)
                if where is None:
                    return None
                # torch.as_tensor(x, device=d) may give x back: moved, not made
                return where, "made" if self._makes_new(func) else "moved"
        return None

    def _made_by_pytorch(self, method: ast.expr) -> bool:
        """Whether the object ``method`` (``<receiver>.to``) is called on is new from PyTorch."""
        receiver = method.value if isinstance(method, ast.Attribute) else None
        # through the chain's own calls: torch.zeros(3).float().to(device)
        while (
            isinstance(receiver, ast.Call)
            and isinstance(receiver.func, ast.Attribute)
            and isinstance(receiver.func.value, ast.Call)
        ):
            receiver = receiver.func.value
        return isinstance(receiver, ast.Call) and self._makes_new(receiver.func)

    def _makes_new(self, func: ast.expr) -> bool:
        """Whether ``func`` is PyTorch's and always gives a new object (a factory, a module class).

        Not one that may give its input back (``torch.as_tensor``, ``torch.relu_``).
        """
        value = self._resolved(func)
        if isinstance(value, type):
            return issubclass(value, torch.nn.Module)
        return _pytorchs(value) and getattr(value, "__name__", None) in _NEW_TENSORS

    def _resolved(self, node: ast.expr) -> Any:
        """What the name or module attribute ``node`` is in the notebook (None: not looked up)."""
        if isinstance(node, ast.Name):
            return self.namespace.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self._resolved(node.value)
            if isinstance(owner, types.ModuleType):  # only modules: no property runs
                return getattr(owner, node.attr, None)
        return None

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        if id(node) not in self._inner:
            links = []  # (method, call), from the name outwards
            link: ast.expr = node
            while isinstance(link, ast.Call) and isinstance(link.func, ast.Attribute):
                links.append((link.func.attr, link))
                self._inner.add(id(link))
                link = link.func.value
            if isinstance(link, ast.Name) and not self._is_local(link.id):
                where = None
                for method, call in reversed(links):
                    where = self._where(method, call) or where
                if where is not None:
                    target = self._bound.get(id(node))
                    self.last[link.id] = (where, target)
                    if where == "cpu" and target is not None:
                        self.bound.setdefault(link.id, []).append(target)
                    self._moved(link.id, where)
            elif links and isinstance(link, ast.Subscript):
                self._part_to_host(links, link, self._bound.get(id(node)))
        self.generic_visit(node)

    def _part_to_host(
        self, links: list[tuple[str, ast.Call]], part: ast.Subscript, target: str | None
    ) -> None:
        """Note ``row = x[0].cpu()``: on a GPU a CPU copy of part of ``x``, here a view of it."""
        root: ast.expr = part
        while isinstance(root, ast.Subscript):
            root = root.value
        if (
            target is None
            or not isinstance(root, ast.Name)
            or self._is_local(root.id)
            or not isinstance(self.namespace.get(root.id), torch.Tensor)
        ):
            return
        where = None
        for method, call in reversed(links):
            where = self._where(method, call) or where
        if where == "cpu":
            self.last.setdefault(root.id, ("cpu", target))
            self.bound.setdefault(root.id, []).append(target)

    def _moved(self, name: str, where: str) -> None:
        """Note a move of the name's value itself (``name.to(...)``, whatever binds the result).

        Only a module moves in place; a tensor's move gives a copy and leaves it where it is.
        """
        if not isinstance(self.namespace.get(name), torch.nn.Module):
            return
        self.where_now[name] = "unknown" if self._conditional else where
        if where == "cpu":
            self.placed.pop(name, None)
            self.moved_there.pop(name, None)
        elif not self._conditional:
            self.moved_there[name] = None

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


def _chain(node: ast.expr) -> tuple[list[ast.Call], ast.expr]:
    """The calls of the chain ``node`` is, outermost first, and what it starts from.

    ``torch.randn(3, device=d).float()``: the two calls, and the name ``torch``; ``model.fc[0]``:
    no call, and ``model``.
    """
    calls = []
    link = node
    while isinstance(link, ast.Call | ast.Attribute | ast.Subscript):
        if isinstance(link, ast.Call):
            calls.append(link)
        link = link.func if isinstance(link, ast.Call) else link.value
    return calls, link


def _pytorchs(value: Any) -> bool:
    """Whether ``value`` is PyTorch's own function or a module class (``nn.Linear``)."""
    if isinstance(value, type):
        return issubclass(value, torch.nn.Module)
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


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

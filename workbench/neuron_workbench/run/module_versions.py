"""The notebook's own modules as the kernel has them loaded, followed by its worker processes.

A worker imports a module of the notebook's project (``import helpers``, ``from models import
Net``) once, when a cell first sends something of it. After the notebook edits the file and loads
it again (``importlib.reload(helpers)``, ``%autoreload``), the kernel's reference ran the new code
and the worker's target the old, and the cell failed on a difference that was no porting problem.
With each request the kernel sends a mark of every such module as it has it loaded now
(:func:`loaded_versions`); the worker loads again the ones whose mark changed (:func:`follow`).

A setting the notebook changes on such a module (``config.LR = 0.5`` in a plain cell) is no new
load: the worker's copy kept the file's value, and a function of the module reading it computed
with another number than the reference (a false FAIL). The values to follow are those the
notebook's cells assign, read from their source (:func:`remember_assigned_attributes`): not every
value such a module holds, which would also carry what the module's own code set in the kernel (a
lazy initialisation's ``_ready = True``) into a worker that never ran that code. Each request
carries the kernel's values of those attributes, where they are plain data
(:func:`assigned_values`), and the target process sets them on its copies of the modules
(:func:`take_assigned_values`).

A module travels by name, and a target process imports that name only: a submodule of the
notebook's package that a plain cell imported (``import nwpkg.train``), where the package's
``__init__`` does not, was missing there, and the cell's ``nwpkg.train.lr()`` raised
``AttributeError``. Each request names the submodules of the notebook's own that the kernel has
loaded and the cell reads through a package it reads (:func:`reached_submodules`), and the
target process imports them before the run (:func:`import_submodules`).
"""

from __future__ import annotations

import ast
import contextlib
import enum
import importlib
import os
import re
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from neuron_workbench.run.cell import CellProgram, _code_names

#: Per module name: the module object last seen there, and whether it is the notebook's own.
_OWN: dict[str, tuple[types.ModuleType, bool]] = {}
_OWN_ROOTS: list[tuple[str, ...]] = [()]
#: The notebook's own modules at the last look at every module, and where that look was made:
#: the working folder, ``sys.path`` and how many modules were loaded.
_OWN_NOW: dict[str, types.ModuleType] = {}
_LAST_LOOK: list[tuple[str, tuple[str, ...], int] | None] = [None]
#: In a worker: each module's mark as of the last request.
_FOLLOWED: dict[str, int] = {}
#: Per module name of the notebook's own: the attributes its cells assign (in order, as keys).
_ASSIGNED: dict[str, dict[str, None]] = {}


def _roots() -> tuple[str, ...]:
    """The folders the notebook's own modules are imported from.

    The working folder and the folders on ``sys.path`` (a module under this Python's installation
    is left out by :func:`_installed`).
    """
    roots = []
    for folder in [os.getcwd(), *sys.path]:
        path = os.path.realpath(folder or os.getcwd())
        if os.path.isdir(path) and path not in roots:
            roots.append(path)
    return tuple(roots)


def _prefixes() -> tuple[str, ...]:
    """Where this Python is installed (its standard library and packages), as named and real."""
    named = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    return tuple({*named, *map(os.path.realpath, named)})


def _installed(path: str, prefixes: tuple[str, ...]) -> bool:
    parts = path.split(os.sep)
    return (
        "site-packages" in parts
        or "dist-packages" in parts
        or any(path == p or path.startswith(p + os.sep) for p in prefixes)
    )


def _is_own(
    name: str, module: types.ModuleType, roots: tuple[str, ...], prefixes: tuple[str, ...]
) -> bool:
    if name == "__main__" or name.split(".")[0] == "neuron_workbench":
        return False
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py") or not os.path.isabs(file):
        # a compiled extension, a namespace package, or torch.ops and its kin (no file of theirs)
        return False
    if _installed(file, prefixes):  # most modules: told without asking the file system
        return False
    path = os.path.realpath(file)
    return not _installed(path, prefixes) and any(path.startswith(root + os.sep) for root in roots)


def _mark(module: types.ModuleType) -> int:
    """What changes when the module is loaded again.

    Its spec (a new one each load), and its functions' and classes' identities and code
    (``%autoreload`` swaps the code of the functions it keeps).
    """
    name = module.__name__
    # a module loaded again gets a new spec (importlib.reload, autoreload's): the only change a
    # module of settings (LR = 1e-3) shows
    marks: list[object] = [id(getattr(module, "__spec__", None))]
    for key, value in list(vars(module).items()):
        if getattr(value, "__module__", None) != name:
            continue
        if isinstance(value, types.FunctionType):
            marks.append((key, id(value), id(value.__code__)))
        elif isinstance(value, type):
            codes = []
            for member in list(vars(value).values()):
                function = getattr(member, "__func__", member)  # a static or class method
                if isinstance(function, types.FunctionType):
                    codes.append(id(function.__code__))
            marks.append((key, id(value), tuple(codes)))
    return hash(tuple(marks))


def loaded_versions() -> dict[str, int]:
    """A mark of each of the notebook's own modules, as this process has it loaded now.

    Returns
    -------
    dict
        Module name → a number that changes when the module is loaded again (meaningful only
        between two calls in this process).
    """
    try:
        return _loaded_versions()
    except Exception:  # a module whose values cannot be read (a lazy proxy): none followed
        return {}


def _loaded_versions() -> dict[str, int]:
    return {name: _mark(module) for name, module in _own_modules().items()}


def _own_modules() -> dict[str, types.ModuleType]:
    """The notebook's own modules loaded now, by name."""
    # Each cell's request asks, before its run starts: with the same modules loaded as at the last
    # full look (the usual cell), only the notebook's own are looked at again (0.4 ms a cell saved
    # with transformers' 2,500 modules loaded).
    where = (os.getcwd(), tuple(sys.path), len(sys.modules))
    if where == _LAST_LOOK[0] and all(sys.modules.get(n) is m for n, m in _OWN_NOW.items()):
        return _OWN_NOW  # (one replaced, deleted and imported again: every module is looked at)
    roots = _roots()
    if _OWN_ROOTS[0] != roots:  # the working folder or sys.path changed: ask again
        _OWN.clear()
        _OWN_ROOTS[0] = roots
    own_now = {}
    prefixes = _prefixes()
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType):
            continue
        seen = _OWN.get(name)
        if seen is None or seen[0] is not module:
            seen = _OWN[name] = (module, _is_own(name, module, roots, prefixes))
        if seen[1]:
            own_now[name] = module
    _OWN_NOW.clear()
    _OWN_NOW.update(own_now)
    _LAST_LOOK[0] = where
    return _OWN_NOW


def follow(versions: dict[str, int]) -> None:
    """Load again each module whose mark in ``versions`` changed since the last call here.

    A module first seen, or not imported here yet, is left as it is: an import here reads its file
    now. One that fails to load again (the file has a syntax error the kernel has not loaded)
    stays as it was.
    """
    changed = [n for n, mark in versions.items() if n in _FOLLOWED and _FOLLOWED[n] != mark]
    _FOLLOWED.update(versions)
    # A module is in sys.modules before the modules it imports: the last first, so that one
    # importing another (`from layers import Block`) binds the other's new code.
    for name in reversed(changed):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            with contextlib.suppress(Exception):
                importlib.reload(module)


#: Text a cell must contain to assign an attribute (``.LR =``, ``.LR *=``, ``.CFG[``, ``setattr(``):
#: a cheap look before the cell is parsed.
_ASSIGNING = re.compile(r"\.\s*\w+\s*(?:\[|(?://|\*\*|<<|>>|[-+*/%@&|^])?=(?!=))|\bsetattr\(")
#: The values an assigned attribute travels with (:func:`assigned_values`), and containers of them.
_ATOMS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)
_CONTAINERS = (tuple, list, dict)
_NOT_PLAIN = object()


def remember_assigned_attributes(source: str, namespace: Mapping[str, Any]) -> list[str]:
    """Note the attributes that the cell ``source`` assigns on the notebook's own modules.

    ``config.LR = 0.5``, ``config.LR *= 2``, ``config.CFG["lr"] = 0.5`` (a change of the dict
    ``config.CFG``), ``setattr(config, "LR", 0.5)``, and ``cfg.train.lr = 0.5`` where
    ``cfg.train`` is a module, anywhere in the cell (functions it defines included): the module
    is what the name holds in ``namespace`` after the cell ran. What the cell changes through a
    method (``config.LAYERS.append(3)``) or another name is not seen.

    Parameters
    ----------
    source : str
        The cell as Python (IPython's transforms applied).
    namespace : mapping
        The notebook's globals.

    Returns
    -------
    list of str
        The attributes newly noted, as ``module.attribute``.
    """
    if not _ASSIGNING.search(source):
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    noted = []
    for owner, attribute in _assigned_in(tree):
        module = _module_named(owner, namespace)
        if module is None or attribute in _ASSIGNED.get(module.__name__, ()):
            continue
        if not _is_own(module.__name__, module, _roots(), _prefixes()):
            continue
        _ASSIGNED.setdefault(module.__name__, {})[attribute] = None
        noted.append(f"{module.__name__}.{attribute}")
    return noted


def _assigned_in(tree: ast.AST) -> list[tuple[ast.expr, str]]:
    """What ``tree`` assigns an attribute of (``a.b.c = 1``: ``a.b`` and ``"c"``), by name."""
    targets: list[ast.expr] = []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.Delete):
            targets.extend(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets.append(node.target)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) == 3
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            found.append((node.args[0], node.args[1].value))
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):  # config.A, config.B = 1, 2
            targets.extend(target.elts)
            continue
        if isinstance(target, ast.Starred):
            targets.append(target.value)
            continue
        # config.CFG["lr"] = 0.5 changes what config.CFG holds (and `del config.CFG["lr"]`); a
        # `del config.LR` leaves the kernel no value to send
        stored = target.value if isinstance(target, ast.Subscript) else target
        while isinstance(stored, ast.Subscript):
            stored = stored.value
        if isinstance(stored, ast.Attribute) and (
            stored is not target or isinstance(target.ctx, ast.Store)
        ):
            found.append((stored.value, stored.attr))
    return found


def _module_named(node: ast.expr, namespace: Mapping[str, Any]) -> types.ModuleType | None:
    """The module that ``node`` (``config``, ``cfg.train``) names in ``namespace``, if it names one.

    A module's attributes are read from its globals, never through its ``__getattr__`` (a lazy
    module would load what the cell never loaded).
    """
    if isinstance(node, ast.Name):
        value = namespace.get(node.id)
    elif isinstance(node, ast.Attribute):
        parent = _module_named(node.value, namespace)
        value = None if parent is None else vars(parent).get(node.attr)
    else:
        return None
    if not isinstance(value, types.ModuleType) or sys.modules.get(value.__name__) is not value:
        return None
    return value


def _plain_copy(value: Any, left: list[int] | None = None, depth: int = 0) -> Any:
    """``value`` copied where it is plain data, else ``_NOT_PLAIN``.

    Plain data: numbers (NumPy's scalars too), strings, bytes, None, enum members, torch dtypes
    and devices, and tuples, lists and dicts of them, up to :data:`_MOST_ITEMS` in all: a setting,
    not a dataset (``config.DATA = list(range(3_000_000))`` was copied and sent with every cell,
    half a second each). A copy: a run here that changes such a list in place (the cell's
    ``config.LAYERS.append(3)``) does not change what a target process is sent afterwards
    (``--profile`` runs the reference first).
    """
    left = [_MOST_ITEMS] if left is None else left
    left[0] -= 1
    kind = type(value)
    if kind in _ATOMS:
        return value
    if left[0] < 0 or depth >= 8:
        return _NOT_PLAIN
    if isinstance(value, enum.Enum) or _numpy_scalar(value):
        return value  # config.MODE = Mode.B, config.LR = np.float64(0.5): immutable
    if kind not in _CONTAINERS or len(value) > left[0]:
        return _NOT_PLAIN  # (a long list is not walked: not sent)
    if kind is dict:
        items = {}
        for key, item in value.items():
            key, item = _plain_copy(key, left, depth + 1), _plain_copy(item, left, depth + 1)
            if key is _NOT_PLAIN or item is _NOT_PLAIN:
                return _NOT_PLAIN
            items[key] = item
        return items
    copied = []
    for item in value:
        copied.append(_plain_copy(item, left, depth + 1))
        if copied[-1] is _NOT_PLAIN:
            return _NOT_PLAIN
    return kind(copied)


def _numpy_scalar(value: Any) -> bool:
    """Whether ``value`` is one of NumPy's scalars (``np.float64(0.5)``; not an array)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic)


#: The most numbers, strings and containers one assigned setting holds to be sent with each cell.
_MOST_ITEMS = 10_000


def assigned_values() -> dict[str, dict[str, Any]]:
    """The values the attributes that the notebook's cells assigned hold now, where plain data.

    See :func:`remember_assigned_attributes`: only those attributes, and only values of plain
    data (numbers, strings, bytes, None, torch dtypes and devices, and tuples, lists and dicts of
    them), copied. Empty, at no cost, when no cell assigned one.

    Returns
    -------
    dict
        Module name → attribute → value.
    """
    values: dict[str, dict[str, Any]] = {}
    for name, attributes in list(_ASSIGNED.items()):
        module = sys.modules.get(name)
        if not isinstance(module, types.ModuleType):
            continue
        held = vars(module)
        for attribute in attributes:
            value = _plain_copy(held.get(attribute, _NOT_PLAIN))
            if value is not _NOT_PLAIN:
                values.setdefault(name, {})[attribute] = value
    return values


def take_assigned_values(values: Mapping[str, Mapping[str, Any]] | None) -> None:
    """Set the values :func:`assigned_values` read on the modules of those names loaded here.

    A module not loaded here is left to its import, which reads its file: the values a request
    holds (the notebook's functions, the modules they read) bring in, before this, the ones its
    run can read.
    """
    for name, attributes in (values or {}).items():
        module = sys.modules.get(name)
        if not isinstance(module, types.ModuleType):
            continue
        held = vars(module)
        for attribute, value in attributes.items():
            current = held.get(attribute, _NOT_PLAIN)
            if type(current) is not type(value) or current != value:
                setattr(module, attribute, value)


def reached_submodules(program: CellProgram, values: Mapping[str, Any]) -> list[str]:
    """The submodules of the notebook's own that the kernel has loaded and a cell reaches.

    Those under a package among ``values`` (``nwpkg``, or ``nwpkg.sub`` of ``import nwpkg.sub as
    s``; a folder without ``__init__.py`` too) whose every part after the package the cell's code
    names (``nwpkg.train.lr()`` names ``train``; the code of the functions the cell defines
    included). A cell reading only installed packages (``torch``) costs a look-up each.

    Parameters
    ----------
    program : CellProgram
        The cell, compiled.
    values : mapping
        The values the cell's request sends, by name.

    Returns
    -------
    list of str
        The submodules' names, sorted (a package before its submodules).
    """
    try:
        return _reached_submodules(program, values)
    except Exception:  # a module whose values cannot be read (a lazy proxy): none imported
        return []


def _reached_submodules(program: CellProgram, values: Mapping[str, Any]) -> list[str]:
    packages = []
    for value in values.values():
        if not isinstance(value, types.ModuleType) or "__path__" not in vars(value):
            continue  # (no submodules; read from its globals, not through a lazy __getattr__)
        seen = _OWN.get(value.__name__)
        if seen and seen[0] is value and not seen[1] and vars(value).get("__file__") is not None:
            continue  # torch, numpy: known not the notebook's own (a folder without __init__.py,
            # a namespace package, is none either, though the modules in it are)
        packages.append(value)
    if not packages:
        return []
    own = _own_modules()
    codes = [program.body, *([program.last_expr] if program.last_expr is not None else [])]
    names = {name for code in codes for name in _code_names(code)}
    reached = set()
    for package in packages:
        if sys.modules.get(package.__name__) is not package:
            continue
        prefix = package.__name__ + "."
        for name in own:
            if name.startswith(prefix) and names.issuperset(name[len(prefix) :].split(".")):
                reached.add(name)
    return sorted(reached)


def import_submodules(names: Iterable[str] | None) -> None:
    """Import each of ``names`` (:func:`reached_submodules`) this process has not imported yet.

    One that fails to import here is left out: the cell's run then fails where it reads it, as
    it did before.
    """
    for name in names or ():
        if name not in sys.modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)

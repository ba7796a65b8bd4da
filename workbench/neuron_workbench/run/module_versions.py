"""The notebook's own modules as the kernel has them loaded, followed by its worker processes.

A worker imports a module of the notebook's project (``import helpers``, ``from models import
Net``) once, when a cell first sends something of it. After the notebook edits the file and loads
it again (``importlib.reload(helpers)``, ``%autoreload``), the kernel's reference ran the new code
and the worker's target the old, and the cell failed on a difference that was no porting problem.
With each request the kernel sends a mark of every such module as it has it loaded now
(:func:`loaded_versions`); the worker loads again the ones whose mark changed (:func:`follow`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types

#: Per module name: the module object last seen there, and whether it is the notebook's own.
_OWN: dict[str, tuple[types.ModuleType, bool]] = {}
_OWN_ROOTS: list[tuple[str, ...]] = [()]
#: The notebook's own modules at the last look at every module, and where that look was made:
#: the working folder, ``sys.path`` and how many modules were loaded.
_OWN_NOW: dict[str, types.ModuleType] = {}
_LAST_LOOK: list[tuple[str, tuple[str, ...], int] | None] = [None]
#: In a worker: each module's mark as of the last request.
_FOLLOWED: dict[str, int] = {}


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
    # Each cell's request asks, before its run starts: with the same modules loaded as at the last
    # full look (the usual cell), only the notebook's own are looked at again (0.4 ms a cell saved
    # with transformers' 2,500 modules loaded).
    where = (os.getcwd(), tuple(sys.path), len(sys.modules))
    if where == _LAST_LOOK[0]:
        versions = {}
        for name, module in _OWN_NOW.items():
            if sys.modules.get(name) is not module:
                break  # one was replaced (deleted and imported again): look at every module
            versions[name] = _mark(module)
        else:
            return versions
    roots = _roots()
    if _OWN_ROOTS[0] != roots:  # the working folder or sys.path changed: ask again
        _OWN.clear()
        _OWN_ROOTS[0] = roots
    versions = {}
    own_now = {}
    prefixes = _prefixes()
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType):
            continue
        seen = _OWN.get(name)
        if seen is None or seen[0] is not module:
            seen = _OWN[name] = (module, _is_own(name, module, roots, prefixes))
        if seen[1]:
            versions[name] = _mark(module)
            own_now[name] = module
    _OWN_NOW.clear()
    _OWN_NOW.update(own_now)
    _LAST_LOOK[0] = where
    return versions


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

"""Where an op was called from: the first line of user code and the running ``nn.Module``.

Shared by everything that attributes ops to source lines: the emulator's fallback events, the
backends' fallback tracking on real devices, and the op profiler. It sits below all of them (it
needs only torch), so none of them imports another for it. Also how a site reads to people
(``cell [7], line 3``, ``transformers/...py:120``): :func:`site_label`, :func:`relabel_site`.

A frame is *internal* (never a user's line) when its file is under torch or this package, is a
frozen module, ``contextlib`` or ``typing_extensions``, or was registered with
:func:`mark_internal` (e.g. a fake device SDK's own files in the tests).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "SourceSite",
    "cell_file",
    "find_site_and_module",
    "function_at",
    "is_cell_filename",
    "is_internal",
    "is_user_file",
    "library_folders",
    "mark_internal",
    "program_line",
    "relabel_site",
    "site_label",
]


@dataclass(frozen=True)
class SourceSite:
    """A line of user code: the first frame outside torch and neuron_workbench."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_internal_cache: dict[str, bool] = {}
_MODULE_CALL_CODES = frozenset(
    c
    for c in (
        getattr(torch.nn.Module, "_call_impl", None),
        getattr(torch.nn.Module, "_wrapped_call_impl", None),
    )
    if c is not None
    for c in [c.__code__]
)


def is_internal(filename: str) -> bool:
    """Whether frames of ``filename`` are library code rather than a user's line."""
    r = _internal_cache.get(filename)
    if r is None:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        r = (
            path.startswith(_TORCH_DIR)
            or path.startswith(_PKG_DIR)
            or filename.startswith("<frozen")
            or os.sep + "contextlib.py" in path
            or os.sep + "typing_extensions.py" in path
        )
        _internal_cache[filename] = r
    return r


def mark_internal(filenames: Iterable[str]) -> None:
    """Treat frames of these files as library code from now on (never a user's source line).

    Parameters
    ----------
    filenames : iterable of str
        Source file paths as they appear in code objects (``co_filename``).
    """
    for filename in filenames:
        _internal_cache[filename] = True


_names_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _module_name(root: torch.nn.Module, mod: torch.nn.Module) -> str:
    if mod is root:
        return ""
    names = _names_cache.get(root)
    if names is None or id(mod) not in names:
        names = {id(m): n for n, m in root.named_modules(remove_duplicate=False)}
        _names_cache[root] = names
    return names.get(id(mod), "")


def find_site_and_module(skip: int = 2) -> tuple[SourceSite | None, str, str]:
    """Walk the caller's stack: first user frame, and the innermost running ``nn.Module``.

    Parameters
    ----------
    skip : int
        Frames to skip, counted from this function's caller (``sys._getframe(skip)``).

    Returns
    -------
    site : SourceSite or None
        The first frame that is not internal (see :func:`is_internal`); None when every frame is.
    module : str
        Qualified name of the innermost running module under the outermost one (``""`` for the
        root module or none).
    module_type : str
        Class name of that module (``""`` for none).
    """
    f = sys._getframe(skip)
    site = None
    modules: list[torch.nn.Module] = []
    while f is not None:
        co = f.f_code
        if co in _MODULE_CALL_CODES:
            m = f.f_locals.get("self")
            if m is not None and (not modules or modules[-1] is not m):
                modules.append(m)
        elif site is None and not is_internal(co.co_filename):
            site = SourceSite(co.co_filename, f.f_lineno, co.co_name)
        f = f.f_back
    if not modules:
        return site, "", ""
    inner = modules[0]
    return site, _module_name(modules[-1], inner), type(inner).__name__


# ---- how sites read -----------------------------------------------------------------------------

_CELL_FILE = re.compile(r"^cell \[(\d+)\]$")


def cell_file(execution_count: int) -> str:
    """The ``file`` of a site inside the notebook cell that ran as ``[execution_count]``."""
    return f"cell [{int(execution_count)}]"


def program_line(script: str | None, line: int) -> str:
    """A line of the program a run ran: ``train.py, line 5`` in a script, ``cell line 5`` in a cell.

    Parameters
    ----------
    script : str or None
        The script's file name (``train.py``); None for a notebook cell, which has none.
    line : int
        The program's line.

    Returns
    -------
    str
        A script's line as Python's traceback names it; a cell's as its sites read without an
        execution count (:func:`site_label`).
    """
    return f"{script}, line {line}" if script else f"cell line {line}"


def is_cell_filename(filename: Any) -> bool:
    """Whether ``filename`` is a cell's pseudo-file (``<neuron-cell-3>``), not a script's path.

    A cell is compiled under a name in angle brackets; ``neuron-workbench run SCRIPT`` compiles
    a script under its own path (``train.py``), whose lines read as that file's, not a cell's.

    Parameters
    ----------
    filename : str
        The program's compiled filename (``CellProgram.filename``, a code object's
        ``co_filename``).

    Returns
    -------
    bool
        True for a pseudo-file: an empty name or a real path is not a cell's.
    """
    return str(filename or "").startswith("<")


def site_label(file: Any, line: Any = None) -> str:
    """How a source site reads: ``cell [7], line 3`` inside a notebook cell, else ``path:line``.

    Parameters
    ----------
    file : str or dict
        The site's file, or the whole site dict (``file``, ``line``).
    line : int, optional
        The line, when ``file`` is a string.
    """
    if isinstance(file, Mapping):
        file, line = file.get("file"), file.get("line")
    text = "" if file is None else str(file)
    where = "?" if line is None else line
    if _CELL_FILE.match(text):
        return f"{text}, line {where}"
    if text.startswith("<neuron-cell"):
        return f"cell line {where}"  # compiled outside a notebook: no execution count to show
    return f"{text}:{where}"


def function_at(site: Mapping[str, Any]) -> str:
    """``Net.forward at cell [1], line 9``: a site's function and where it is (``?``: not known)."""
    return f"{site.get('function') or '?'} at {site_label(site)}"


def relabel_site(
    site: Mapping[str, Any],
    cells: Mapping[str, int | tuple[int, int]],
    folders: Sequence[str] = (),
) -> dict[str, Any]:
    """``site`` as people recognise it: a notebook cell's file as ``cell [N]``, paths shortened.

    Parameters
    ----------
    site : dict
        ``file``, ``line``, ``function`` (other keys are kept).
    cells : mapping of str to int or (int, int)
        Compiled filename of a notebook cell → its execution count (IPython's
        ``shell.compile._filename_map`` plus the ``%%neuron`` cell's own filename), or → (count,
        lines before the compiled code: 1 for a cell magic's body, under its ``%%`` line).
    folders : sequence of str
        Folders a file path is shown relative to (the notebook's folder, the working directory,
        the import roots); the deepest one that holds the file wins, so a library inside a
        project's virtual environment reads from its import root. Paths outside all of them stay
        as they are.

    Returns
    -------
    dict
        A new site; for a cell ``file`` is ``cell [N]`` and ``cell`` is ``N``.
    """
    out = dict(site)
    file = str(site.get("file") or "")
    if not file or _CELL_FILE.match(file):
        return out
    count = cells.get(file)
    if count is not None:
        count, offset = count if isinstance(count, tuple) else (count, 0)
        out["file"], out["cell"] = cell_file(count), int(count)
        if offset and isinstance(site.get("line"), int):
            out["line"] = site["line"] + offset
        return out
    if file.startswith("<") or not os.path.isabs(file):
        return out
    best = None
    for folder in folders:
        if not folder:
            continue
        try:
            relative = os.path.relpath(file, folder)
        except ValueError:  # another drive (Windows)
            continue
        inside = relative != os.pardir and not relative.startswith(os.pardir + os.sep)
        if inside and (best is None or len(relative) < len(best)):
            best = relative
    if best is not None:
        out["file"] = best.replace(os.sep, "/")
    return out


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` holds the user's code: a cell, a script, a project's module.

    Not torch's or the workbench's (:func:`is_internal`), not the standard library's, not an
    installed package's (``site-packages``), and not code torch generates (an FX graph's
    ``<eval_with_key>``, Inductor's and Triton's caches).
    """
    if is_internal(filename):
        return False
    if filename.startswith("<"):  # a cell's pseudo-file, not generated code (<eval_with_key>.3)
        return filename.startswith(_CELL_PSEUDO_FILES)
    path = os.path.abspath(filename)
    if any(folder in path for folder in _GENERATED_FOLDERS):
        return False
    return not any(path.startswith(root + os.sep) for root in _library_roots())


#: Pseudo-files of cells: IPython's (a terminal's, a test shell's) and a %%neuron cell's own.
_CELL_PSEUDO_FILES = ("<ipython-input-", "<neuron-cell")
#: Folders of code torch.compile generates (Inductor's and Triton's caches).
_GENERATED_FOLDERS = (f"{os.sep}torchinductor_", f"{os.sep}.triton{os.sep}")


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site module lacks it
        roots.update(site.getsitepackages())
    return tuple(sorted({os.path.abspath(root) for root in roots}, key=len, reverse=True))


def library_folders() -> list[str]:
    """The import roots of this Python (site-packages, the standard library), longest first.

    A site in an installed library reads relative to its root (``transformers/models/...py:120``)
    instead of naming the machine's virtual environment.
    """
    roots = {os.path.abspath(p) for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)}
    return sorted(roots, key=len, reverse=True)

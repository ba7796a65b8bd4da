"""A script's process context for the length of a run: ``sys.argv``, its folder, ``sys.path[0]``.

``python train.py --lr=3e-4`` gives the script ``sys.argv == ["train.py", "--lr=3e-4"]``, runs it
from the shell's folder and puts the script's folder first on ``sys.path``. Both runs of a
``neuron-workbench run`` need the same, the target's in its worker process too, so this is a run
instrument (it travels with the run request) that sets them on entry and restores them on exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, NoReturn

__all__ = ["ScriptContext", "arguments_warning", "script_name"]


def script_name(record: Any) -> str | None:
    """The file name of the script a run ran (``train.py``), or None for a notebook cell's run.

    Parameters
    ----------
    record : ScriptContext, dict or None
        A run's ``script`` record (``Run.extras["script"]``): a :class:`ScriptContext`, or the dict
        a recording keeps (:meth:`ScriptContext.to_dict`); None for a run that had none.

    Returns
    -------
    str or None
        The last part of ``argv[0]``, as the report labels the script (``run sub/train.py``
        reports as ``train.py``).
    """
    argv = record.get("argv") if isinstance(record, dict) else getattr(record, "argv", None)
    if not isinstance(argv, list | tuple) or not argv or not str(argv[0]):
        return None
    return PurePath(str(argv[0])).name


def arguments_warning(recorded: Any, current: Any) -> str | None:
    """The warning when two runs of a script had different arguments, else None.

    Each side is a run's ``script`` record: a :class:`ScriptContext`, or the dict a recording
    keeps (:meth:`ScriptContext.to_dict`); a side without one (a notebook cell, an artifact of an
    older workbench) is not compared.
    """
    ours, theirs = _arguments(recorded), _arguments(current)
    if ours is None or theirs is None or ours == theirs:
        return None
    return (
        f"the recording ran the script with {_shown(ours)}, this run with {_shown(theirs)}: "
        "the outputs may differ for that reason alone"
    )


def _arguments(record: Any) -> list[str] | None:
    argv = record.get("argv") if isinstance(record, dict) else getattr(record, "argv", None)
    if not isinstance(argv, list | tuple) or not argv:
        return None
    return [str(arg) for arg in argv[1:]]


def _shown(arguments: list[str]) -> str:
    return " ".join(arguments) if arguments else "no arguments"


#: ``os._exit`` as this process found it, and the threads now running a script (pid, thread).
_REAL_EXIT = os._exit
_running: set[tuple[int, int]] = set()
_running_lock = threading.Lock()


def _script_exit(status: int) -> NoReturn:
    """``os._exit`` while a script runs: in the script's own thread, ``sys.exit(status)``.

    ``os._exit`` ends the process at once: on the reference run that was the command itself, which
    exited 0 with no report at all (CI read a pass), and on the target its worker. Ending the run
    as ``sys.exit`` does lets both be reported. A forked child (a DataLoader or multiprocessing
    worker, whose bootstrap ends with ``os._exit``) or another thread gets the real one.
    """
    if (os.getpid(), threading.get_ident()) in _running:
        sys.exit(status)
    _REAL_EXIT(status)


@contextlib.contextmanager
def _exit_as_sys_exit() -> Iterator[None]:
    key = (os.getpid(), threading.get_ident())
    with _running_lock:
        _running.add(key)
        os._exit = _script_exit
    try:
        yield
    finally:
        with _running_lock:
            _running.discard(key)
            if not _running:  # the last run here ended (two runs of one process may overlap)
                os._exit = _REAL_EXIT


@dataclass(frozen=True)
class ScriptContext:
    """Run instrument: ``argv``, working folder ``cwd`` and the script's import folder.

    Attributes
    ----------
    argv : tuple of str
        ``sys.argv`` during the run (``argv[0]`` is the script as the user named it).
    cwd : str
        The working folder during the run (absolute).
    folder : str
        The script's folder, put first on ``sys.path`` (absolute).
    """

    argv: tuple[str, ...]
    cwd: str
    folder: str

    def to_dict(self) -> dict[str, Any]:
        """What a recording keeps of it: the command line (compared with a later run's)."""
        return {"argv": list(self.argv), "cwd": self.cwd, "folder": self.folder}

    @contextlib.contextmanager
    def around_runs(self) -> Iterator[None]:
        """The script's folder last on ``sys.path`` around its runs, put back as it was after.

        What a target's worker sends back holds the script's classes by reference (``model.MLP``
        of a ``model.py`` next to it), which loading it imports here, where no reference run may
        have imported them (``--against``; ``record``). Last, not first as in the runs: the
        workbench's own imports around them (NumPy's generators import ``secrets``), here and in
        the worker (which takes this process's ``sys.path``), find their own modules, not a
        script's ``secrets.py``.
        """
        saved_path = list(sys.path)
        sys.path.append(self.folder)
        try:
            yield
        finally:
            sys.path[:] = saved_path

    @contextlib.contextmanager
    def __call__(self, backend: Any = None) -> Iterator[ScriptContext]:
        """Set the context; put back the process's own on exit (the run's record is itself)."""
        saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
        sys.argv = list(self.argv)
        sys.path.insert(0, self.folder)
        os.chdir(self.cwd)
        try:
            with _exit_as_sys_exit():
                yield self
        finally:
            os.chdir(saved_cwd)
            sys.argv[:], sys.path[:] = saved_argv, saved_path

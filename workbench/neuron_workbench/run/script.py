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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ScriptContext"]


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

    @contextlib.contextmanager
    def __call__(self, backend: Any = None) -> Iterator[None]:
        """Set the context; put back the process's own on exit."""
        saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
        sys.argv = list(self.argv)
        sys.path.insert(0, self.folder)
        os.chdir(self.cwd)
        try:
            yield
        finally:
            os.chdir(saved_cwd)
            sys.argv[:], sys.path[:] = saved_argv, saved_path

"""Test helpers: a real IPython shell with the extension loaded, whose failures raise.

This module and :mod:`neuron_workbench.magics` are the only ones that import IPython.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from IPython.core.interactiveshell import ExecutionResult, InteractiveShell


def testing_shell() -> InteractiveShell:
    """The process's ``InteractiveShell`` with a fresh namespace and ``neuron_workbench`` loaded."""
    shell = InteractiveShell.instance()
    shell.reset(new_session=False)
    shell.extension_manager.load_extension("neuron_workbench")
    return shell


def run_cell(shell: InteractiveShell, source: str, *, allow_error: bool = False) -> ExecutionResult:
    """Run ``source`` like a notebook cell; raise its error unless ``allow_error``."""
    result = shell.run_cell(source, store_history=True)
    if not allow_error:
        result.raise_error()
    return result


def user_ns_snapshot(shell: InteractiveShell) -> dict[str, Any]:
    """The user-visible names and the identity of their values (hidden IPython names left out)."""
    hidden = set(shell.user_ns_hidden)
    return {
        name: id(value)
        for name, value in shell.user_ns.items()
        if name not in hidden and not name.startswith("_")
    }


def write_notebook(path: str | Path, *cells: Any) -> Path:
    """Write a Python 3 notebook of ``cells`` to ``path``: code sources, or nbformat cells as given."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(c) if isinstance(c, str) else c for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return Path(path)

"""Re-execute the guided notebooks in place so their stored outputs are current.

nbval (``--nbval-lax``) compares the cells marked ``# NBVAL_CHECK_OUTPUT`` against these stored
outputs, so run this after changing a notebook or the verdict text:

    .venv/bin/python scripts/execute_notebooks.py [notebooks/NAME.ipynb ...]

Widget state is dropped from the metadata (it can weigh megabytes and is never compared).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path) -> None:
    """Execute one notebook in its own folder and write it back with outputs."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    with tempfile.TemporaryDirectory() as sockets:
        # A local-socket kernel: no "Kernel is running over TCP without encryption" warning. Set
        # after construction (passing km= makes nbclient leave the kernel running).
        client.km = KernelManager(
            kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "k")
        )
        client.execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"executed {path.relative_to(ROOT)}")


def main(argv: list[str]) -> int:
    """Execute the notebooks named in ``argv`` (default: every guided notebook)."""
    os.environ.pop("NEURON_WORKBENCH_EMULATE", None)
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        execute(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

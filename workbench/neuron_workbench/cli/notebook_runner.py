"""Execute a notebook headless in a real kernel and collect every ``%%neuron`` report it produced."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.report.report import REPORT_MIME

_SETUP_TAG = "neuron-workbench-setup"


@dataclass
class NotebookRun:
    """What running one notebook produced."""

    path: str
    reports: list[dict[str, Any]] = field(default_factory=list)
    cell_errors: list[dict[str, Any]] = field(default_factory=list)

    def verdict_counts(self) -> dict[str, int]:
        """Number of reports per verdict."""
        counts: dict[str, int] = {}
        for report in self.reports:
            counts[report["verdict"]] = counts.get(report["verdict"], 0) + 1
        return counts


def _setup_source(ref: str | None, target: str | None) -> str:
    lines = ["%load_ext neuron_workbench"]
    if ref:
        lines.append(f"%config NeuronMagics.ref = {ref!r}")
    if target:
        lines.append(f"%config NeuronMagics.target = {target!r}")
    return "\n".join(lines)


def run_notebook(
    path: str | Path,
    *,
    ref: str | None = None,
    target: str | None = None,
    timeout: int = 900,
    progress: Callable[[int, int], None] | None = None,
) -> NotebookRun:
    """Execute ``path`` with the extension loaded and ``ref``/``target`` as the magic's defaults.

    Cells that raise outside ``%%neuron`` do not stop the run; they are listed in ``cell_errors``.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    if not path.is_file():
        raise WorkbenchUsageError(f"no such notebook: {path}")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:
        raise WorkbenchUsageError(f"{path} is not a readable notebook: {exc}") from None
    for name in (ref, target):
        if name is not None:
            from neuron_workbench.backends import get_backend

            get_backend(name)  # unknown names are usage errors before a kernel starts
    setup = nbformat.v4.new_code_cell(_setup_source(ref, target), metadata={"tags": [_SETUP_TAG]})
    nb.cells.insert(0, setup)
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    if progress is not None:
        total = len(code_cells) - 1

        def on_cell_executed(cell: Any, cell_index: int, **_: Any) -> None:
            if cell_index in code_cells[1:]:
                progress(code_cells.index(cell_index), total)

        client.on_cell_executed = on_cell_executed
    client.execute()
    result = NotebookRun(str(path))
    for position, index in enumerate(code_cells[1:], start=1):
        cell = nb.cells[index]
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if REPORT_MIME in data:
                report = data[REPORT_MIME]
                if isinstance(report, str):
                    report = json.loads(report)
                report = dict(report)
                report["label"] = f"cell {position}"
                report["cell_index"] = position
                result.reports.append(report)
            elif output.get("output_type") == "error":
                result.cell_errors.append({
                    "cell_index": position,
                    "type": output.get("ename", ""),
                    "message": output.get("evalue", ""),
                })
    return result


def terminal_progress(done: int, total: int) -> None:
    """Show ``cell n/N`` on a terminal (nothing when stderr is not one)."""
    if sys.stderr.isatty():
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\rcell {done}/{total}{end}")
        sys.stderr.flush()

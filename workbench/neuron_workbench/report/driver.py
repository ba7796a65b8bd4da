"""Run one cell on the reference and the target backend, compare, and build the :class:`Report`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from neuron_workbench.backends import get_backend
from neuron_workbench.compare import compare_outputs
from neuron_workbench.compare.tolerances import check_pair
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError
from neuron_workbench.report.report import Report
from neuron_workbench.run import (
    CellProgram,
    ResidentObjects,
    RunSpec,
    commit,
    execute,
    mark_resident,
)
from neuron_workbench.run.executor import Captured, capture_text

KEEP_CHOICES = ("ref", "target")


@dataclass(frozen=True)
class CompareOptions:
    """Settings of one comparison (also recorded in the report)."""

    ref: str = "cpu"
    target: str = "neuron"
    rtol: float | None = None
    atol: float | None = None
    seed: int = 0
    keep: str = "ref"

    def validate(self) -> None:
        """Raise :class:`WorkbenchUsageError` for unknown backends, a lone tolerance, a bad keep."""
        get_backend(self.ref)
        get_backend(self.target)
        check_pair(self.rtol, self.atol)
        if self.keep not in KEEP_CHOICES:
            raise WorkbenchUsageError(f"--keep must be one of {', '.join(KEEP_CHOICES)}")


@dataclass
class CellComparison:
    """A report plus each run's captured output (so the caller can replay what the cell printed)."""

    report: Report
    captured: dict[str, Captured]
    last_value: Any = None


def compare_cell(
    program: CellProgram,
    namespace: MutableMapping[str, Any],
    options: CompareOptions,
    *,
    hidden: frozenset[str] = frozenset(),
    resident: ResidentObjects | None = None,
    capture: Callable[[], contextlib.AbstractContextManager[Captured]] = capture_text,
) -> CellComparison:
    """Run ``program`` on both backends and compare; commit the kept run when both succeeded.

    Raises
    ------
    BackendUnavailable
        When either backend cannot run here (before anything is executed).
    """
    options.validate()
    ref_backend = get_backend(options.ref)
    target_backend = get_backend(options.target)
    for backend in (ref_backend, target_backend):
        availability = backend.availability()
        if not availability:
            raise BackendUnavailable(availability.reason)
    resident = resident if resident is not None else ResidentObjects()
    spec = RunSpec(
        program, namespace, seed=options.seed, hidden=hidden, resident=resident, capture=capture
    )
    ref_run = execute(spec, ref_backend, run_id="ref")
    target_run = execute(spec, target_backend, run_id="target")
    comparison = None
    last_value = None
    if ref_run.ok and target_run.ok:
        comparison = compare_outputs(
            ref_run.outputs, target_run.outputs, rtol=options.rtol, atol=options.atol
        )
        kept, other = (ref_run, target_run) if options.keep == "ref" else (target_run, ref_run)
        commit(namespace, kept)
        mark_resident(resident, kept, other)
        last_value = kept.last_value
    warnings = [
        f"{name!r} could not be deep-copied, so both runs used the same object"
        for name in sorted(set(ref_run.shared_names) | set(target_run.shared_names))
    ]
    report = Report(
        ref=ref_run,
        target=target_run,
        comparison=comparison,
        cell_source=program.source,
        options=asdict(options),
        warnings=warnings,
    )
    return CellComparison(report, spec.captured, last_value)

"""The one entry point behind ``%%neuron``, ``neuron-workbench run``, ``record`` and ``compare``.

A :class:`Session` takes a cell and every option as data and returns a finished :class:`CellResult`:
the :class:`~neuron_workbench.report.report.Report` (migration findings attached, artifact written),
the strict-mode verdict, what each run printed and the cell's last value. Front ends only parse
their arguments and show or exit; the session owns the per-notebook state (objects the cell put on
its device, the target worker processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_workbench.backends import get_backend
from neuron_workbench.backends.registry import resolve_executor
from neuron_workbench.cell.pipeline import (
    RECORDED_BUDGET_NOTE,
    build_report,
    compare_cell,
)
from neuron_workbench.cell.settings import CellOptions, CompareOptions
from neuron_workbench.emulator.profiles import DEVICES
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.report.report import Report
from neuron_workbench.run import CellProgram, ResidentObjects, Run, RunSpec, compile_cell
from neuron_workbench.run.executor import Captured, Executor, InProcessExecutor, capture_text
from neuron_workbench.run.records import recorded


@dataclass
class CellResult:
    """A finished cell: one report per target, strict verdicts, what each run printed, last value."""

    #: One finished report per target, first target first, all against the same reference run.
    reports: list[Report]
    captured: dict[str, Captured]
    last_value: Any = None
    #: The one-line strict-mode failure (``strict`` and ops fell back), else None.
    strict_violation: str | None = None
    #: Where the runs were saved (``record``), else None.
    artifact: Path | None = None
    #: The one-line ``strict_graph_breaks`` failure (torch.compile broke a graph), else None.
    graph_break_violation: str | None = None

    @property
    def report(self) -> Report:
        """The first target's report."""
        return self.reports[0]


def recorded_reference(path: str | None, cell_source: str) -> tuple[Run | None, str | None]:
    """The reference run recorded in the artifact at ``path`` (``--against``), and a warning."""
    run, warning, _ = _recorded_reference(path, cell_source)
    return run, warning


def _recorded_reference(
    path: str | None, cell_source: str
) -> tuple[Run | None, str | None, str | None]:
    """:func:`recorded_reference`, and the note saying which recording the reference is."""
    if not path:
        return None, None, None
    from neuron_workbench import artifacts

    artifact = artifacts.load(path)
    run = artifact.runs.get("ref") or next(iter(artifact.runs.values()), None)
    if run is None:
        raise WorkbenchUsageError(f"{path}: the artifact holds no run")
    if "ref" not in artifact.runs and all(map(artifacts.is_target_role, artifact.runs)):
        # a target recording (`record --role target`, or `--record` with `--against`) as the
        # reference compares the target with itself: a PASS that says nothing of the port
        raise WorkbenchUsageError(
            f"{path} holds no reference run (its runs: {', '.join(sorted(artifact.runs))}): "
            "--against takes the reference's recording"
        )
    environment = artifact.environment
    made = ", ".join(
        part
        for part in (
            f"recorded {artifact.created}" if artifact.created else "",
            f"torch {environment['torch']}" if environment.get("torch") else "",
            str(environment.get("platform") or ""),
        )
        if part
    )
    note = f"the reference is the run recorded in {path}" + (f" ({made})" if made else "")
    return run, artifacts.source_mismatch_warning(artifact, cell_source), note


def migration_findings(
    cell_source: str,
    target: str,
    first_line: int = 1,
    namespace: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The scanner's findings for the cell source (the report's Migration tab).

    ``first_line`` is the line number the source's first line has where the user reads it.
    ``namespace``: the notebook's, whose imported modules and torch classes and functions the cell
    may use by their names (``nn.DataParallel`` after an earlier ``import torch.nn as nn``).
    """
    if target not in DEVICES:
        return None
    from neuron_workbench.scan import scan_cell

    imports: dict[str, str] = {}
    for name, value in (namespace or {}).items():
        if name.startswith("_"):
            continue
        if isinstance(value, types.ModuleType):
            imports[name] = value.__name__
        elif isinstance(value, type | types.FunctionType) and str(
            getattr(value, "__module__", "")
        ).startswith("torch"):
            # `from torch.nn import DataParallel` in an earlier cell: where it is defined
            imports[name] = f"{value.__module__}.{value.__qualname__}"
    report = scan_cell("\n" * (first_line - 1) + cell_source, target=target, imports=imports)
    data = report.to_dict()
    data["html"] = report.to_html()
    data["text"] = report.to_text()
    return data


def graph_break_violation(report: Report) -> str | None:
    """The one-line ``strict_graph_breaks`` failure of a report, or None."""
    from neuron_workbench.trace.compile import graph_break_violation as violation

    record = recorded(report.target.extras.get("compile"))
    breaks = list(getattr(record, "graph_breaks", None) or [])
    return violation(breaks, report.target.backend.name)


class Session:
    """Per-notebook (or per-command) state and the way every front end runs a cell."""

    def __init__(self) -> None:
        self.resident = ResidentObjects()
        self._workers: Any = None
        # cluster address -> RayActorPool (``--on``); empty until a cell names a cluster
        self._ray_pools: dict[str, Any] = {}
        # (target, cell source) pairs whose migration findings a report showed already.
        self._scanned: set[tuple[str, str]] = set()

    @property
    def workers(self) -> Any:
        """The :class:`~neuron_workbench.run.worker_process.WorkerPool` of this session."""
        if self._workers is None:
            from neuron_workbench.run.worker_process import WorkerPool

            self._workers = WorkerPool()
        return self._workers

    def launch_workers(self, targets: Sequence[str], executor: str = "auto") -> None:
        """Launch the worker processes ``targets`` will run in, without waiting for them.

        Nothing where ``executor`` (``auto`` decided for these targets) runs them in this process.
        Each worker imports torch and installs its device meanwhile (a second or two), so the
        first cell finds it ready.
        """
        from neuron_workbench.backends.registry import WORKER_TARGETS, resolve_executor

        if resolve_executor(executor, list(targets)) != "worker":
            return
        for target in targets:
            if target in WORKER_TARGETS:
                self.workers.launch(target)

    def ray_pool(self, cluster: str, options: Any = None) -> Any:
        """The :class:`~neuron_workbench.run.ray_executor.RayActorPool` for ``cluster``."""
        from neuron_workbench.run.ray_cluster import RayOptions, connected_address
        from neuron_workbench.run.ray_executor import RayActorPool

        if cluster == "ray":  # the cluster a ray://... cell connected this process to: its actors
            cluster = connected_address() or cluster
        pool = self._ray_pools.get(cluster)
        if pool is None:
            pool = self._ray_pools[cluster] = RayActorPool(cluster)
        pool.options = options if options is not None else RayOptions()
        return pool

    def actor_rows(self) -> list[Any]:
        """``%neuron_workers`` rows of the session's Ray actors (none without ``--on``)."""
        return [row for pool in self._ray_pools.values() for row in pool.rows()]

    def executor(
        self,
        name: str,
        timeout: float | None = None,
        *,
        cluster: str = "",
        cluster_options: Any = None,
    ) -> Executor:
        """The executor called ``name`` (``inprocess``, ``worker``, or ``ray`` on ``cluster``)."""
        if name == "ray":
            from neuron_workbench.run.ray_executor import RayExecutor

            return RayExecutor(self.ray_pool(cluster, cluster_options), timeout=timeout)
        if name == "worker":
            from neuron_workbench.run.worker_process import WorkerExecutor

            return WorkerExecutor(self.workers, timeout=timeout)
        return InProcessExecutor()

    def close(self) -> None:
        """End the session's worker processes and Ray actors."""
        if self._workers is not None:
            self._workers.close()
        for pool in self._ray_pools.values():
            pool.close()

    def run_cell(
        self,
        source: str,
        namespace: MutableMapping[str, Any],
        options: CellOptions,
        *,
        program: CellProgram | None = None,
        hidden: frozenset[str] = frozenset(),
        capture: Callable[..., contextlib.AbstractContextManager[Captured]] = capture_text,
        relabel: Callable[[Run], None] | None = None,
        instruments: dict[str, Any] | None = None,
        live_output: bool = False,
    ) -> CellResult:
        """Run ``source`` on the reference and the target, compare, and finish the report.

        Parameters
        ----------
        source : str
            The cell as the user wrote it (scanned, recorded, compared with ``against``).
        namespace : dict
            The notebook's (or script's) globals; the kept run's results are committed there.
        options : CellOptions
            Every setting of the cell.
        program : CellProgram, optional
            The compiled cell (front ends compile with their own transforms); compiled from
            ``source`` when omitted.
        relabel : callable, optional
            Called on every run before anything is saved (the magic names sites ``cell [N]``).
        instruments : dict, optional
            More run instruments for both runs (a script's ``sys.argv`` and folder).
        live_output : bool, optional
            ``capture`` can show a run's output as it comes (``capture(live=True)``): the kept
            run's is, where it runs in this process, as a plain cell's would be (a training
            loop's progress), and its replay (``show()``) is then nothing.

        Raises
        ------
        WorkbenchUsageError
            Bad options, an unreadable artifact, a value the worker cannot receive.
        BackendUnavailable
            When a backend cannot run here (before anything is executed).
        """
        options.validate()
        compare = options.compare
        program = program if program is not None else compile_cell(source)
        if (
            options.record
            and options.against
            and Path(options.record).resolve() == Path(options.against).resolve()
        ):  # the new artifact holds no reference run: saving it would lose the recorded one
            raise WorkbenchUsageError(
                f"--record {options.record} is the recording --against reads: this run would "
                "overwrite its reference; record into another file"
            )
        reference, warning, recording_note = _recorded_reference(options.against, source)
        if reference is not None and instruments and "script" in instruments:
            from neuron_workbench.run.script import arguments_warning

            arguments = arguments_warning(reference.extras.get("script"), instruments["script"])
            warning = "; ".join(filter(None, (warning, arguments))) or None
        if compare.seed is None and (options.record or reference is not None):
            # a recording is compared on another machine, from another notebook: its runs start
            # from a seed that machine can give its own runs too, not from this notebook's state
            compare = dataclasses.replace(compare, seed=0)
        if reference is not None:
            compare = dataclasses.replace(compare, ref=reference.backend.name, keep="target")
        instruments = dict(instruments or {})
        if options.profile:
            from neuron_workbench.trace.profile import op_profiler

            instruments["profile"] = op_profiler
        result = compare_cell(
            program,
            namespace,
            compare,
            hidden=hidden,
            resident=self.resident,
            capture=capture,
            live_output=live_output,
            instruments=instruments,
            reference=reference,
            executor=self.executor(
                options.resolved_executor,
                options.timeout,
                cluster=options.cluster,
                cluster_options=options.cluster_options,
            ),
            extra_targets=options.extra_targets,
            relabel=relabel,
            warnings=[warning] if warning else [],
            migration=(lambda target: self._migration(source, target, options, namespace))
            if options.scan
            else None,
        )
        reports = result.reports
        report = reports[0]
        if recording_note is not None:  # which recording: a CI log must say what it was held to
            for each in reports:
                each.notes.append(recording_note)
        artifact = None
        if options.record:
            from neuron_workbench import artifacts

            runs = {} if reference is not None else {"ref": report.ref}
            runs["target"] = report.target
            for extra in reports[1:]:
                runs[f"target_{extra.target.backend.name}"] = extra.target
            artifact = artifacts.save(
                options.record, runs=runs, cell_source=source, report=report.to_dict()
            )
        violation = None
        if options.strict:
            from neuron_workbench.trace.fallback import strict_message, strict_violations

            for each in reports:
                violations = strict_violations(each.target.fallbacks, list(options.allow_fallback))
                if violations and violation is None:
                    violation = strict_message(violations, each.target.backend.name)
        broken = None
        if options.strict_graph_breaks:
            broken = next(filter(None, map(graph_break_violation, reports)), None)
        return CellResult(
            reports,
            result.captured,
            result.last_value,
            strict_violation=violation,
            graph_break_violation=broken,
            artifact=Path(artifact) if artifact is not None else None,
        )

    def _migration(
        self,
        source: str,
        target: str,
        options: CellOptions,
        namespace: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """The scanner's findings for the cell on ``target``; a rerun folds the ones shown before."""
        found = migration_findings(source, target, options.source_first_line, namespace)
        if found and found.get("findings"):
            found["repeat"] = (target, source) in self._scanned
            self._scanned.add((target, source))
        return found

    def record_run(
        self,
        program: CellProgram,
        namespace: MutableMapping[str, Any],
        backend_name: str,
        *,
        seed: int = 0,
        executor: str = "auto",
        instruments: dict[str, Any] | None = None,
    ) -> Run:
        """Run ``program`` once on one backend (``neuron-workbench record``).

        Like a cell's target, an accelerator run happens in a worker under ``auto``: a process that
        already ran a backward pass cannot install an emulated device any more. ``instruments``
        are run instruments (a script's context, its observed scalars).

        Raises
        ------
        BackendUnavailable
            When the backend cannot run here.
        """
        from neuron_workbench.errors import BackendUnavailable

        backend = get_backend(backend_name)
        runner = self.executor(resolve_executor(executor, [backend.name]))
        availability = runner.availability(backend)
        if not availability:
            raise BackendUnavailable(availability.reason)
        spec = RunSpec(program, namespace, seed=seed, instruments=instruments)
        return runner.run(spec, backend, run_id="ref")


def compare_recorded(
    ref_artifact: Any,
    target_artifact: Any,
    *,
    values: Mapping[str, Any] | None = None,
    pick: Callable[[Any, str], Run],
) -> Report:
    """The :class:`Report` of two recorded runs (``neuron-workbench compare``), as for a live cell.

    The runs are judged with the options the target's recording was made with (its report's),
    with ``values`` (option-table values by API name: tolerances) over them; the report is built
    by the function that builds a live cell's, so both read the same. ``pick(artifact, role)``
    chooses each artifact's run.
    """
    from neuron_workbench.artifacts import source_mismatch_warning

    ref = pick(ref_artifact, "ref")
    target = pick(target_artifact, "target")
    recorded = dict((target_artifact.report or {}).get("options") or {})
    recorded.update(ref=ref.backend.name, target=target.backend.name)
    options = CompareOptions.from_dict(recorded, **dict(values or {}))
    from neuron_workbench.run.script import arguments_warning

    warnings = []
    mismatch = source_mismatch_warning(ref_artifact, target_artifact.cell_source)
    if mismatch:
        warnings.append(mismatch)
    arguments = arguments_warning(ref.extras.get("script"), target.extras.get("script"))
    if arguments:
        warnings.append(arguments)
    report = build_report(
        ref,
        target,
        options,
        cell_source=target_artifact.cell_source,
        schedule=[RECORDED_BUDGET_NOTE] if options.judge == "budget" else [],
        warnings=warnings,
    )
    judged = _recorded_tolerances(options, values or {})
    if judged:  # a recording's own settings decide the verdict: the report says which
        report.notes.append(f"judged with the tolerances the recording was made with: {judged}")
    return report


def _recorded_tolerances(options: CompareOptions, given: Mapping[str, Any]) -> str:
    """The recording's tolerance settings that differ from the defaults and no flag replaced."""
    default = CompareOptions(ref=options.ref, target=options.target)
    shown = []
    for name in ("preset", "rtol", "atol", "per_output"):
        value = getattr(options, name)
        if name not in given and value != getattr(default, name) and value not in (None, ()):
            shown.append(f"{name} {', '.join(map(str, value)) if name == 'per_output' else value}")
    return "; ".join(shown)

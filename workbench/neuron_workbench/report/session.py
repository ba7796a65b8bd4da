"""The one entry point behind ``%%neuron``, ``neuron-workbench run``, ``record`` and ``compare``.

A :class:`Session` takes a cell and every option as data and returns a finished :class:`CellResult`:
the :class:`~neuron_workbench.report.report.Report` (migration findings attached, artifact written),
the strict-mode verdict, what each run printed and the cell's last value. Front ends only parse
their arguments and show or exit; the session owns the per-notebook state (objects the cell put on
its device, the target worker processes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_workbench.backends import get_backend
from neuron_workbench.emulator.profiles import DEVICES
from neuron_workbench.errors import OptionError, WorkbenchUsageError
from neuron_workbench.report.driver import (
    CompareOptions,
    compare_cell,
    compare_observed_scalars,
    compare_runs,
)
from neuron_workbench.report.report import Report
from neuron_workbench.run import CellProgram, ResidentObjects, Run, RunSpec, compile_cell
from neuron_workbench.run.executor import Captured, Executor, InProcessExecutor, capture_text

#: Where a target run happens: ``auto`` (a worker for neuron/tpu targets, else this process),
#: ``inprocess`` (this process), or ``worker`` (a child process per target that owns the device).
EXECUTOR_CHOICES = ("auto", "inprocess", "worker")
#: Targets ``auto`` runs in workers: accelerators, emulated or real (one backend per process).
WORKER_TARGETS = DEVICES


def resolve_executor(name: str, targets: tuple[str, ...] | list[str]) -> str:
    """``inprocess`` or ``worker``: what ``name`` (possibly ``auto``) means for ``targets``.

    ``auto`` picks a worker for a neuron or tpu target unless this process already holds that
    device (its SDK, or the emulator, loaded at ``import torch``): then the device and the
    settings made on it in the notebook are here.
    """
    if name != "auto":
        return name
    return "worker" if any(_needs_worker(t) for t in targets) else "inprocess"


def _needs_worker(target: str) -> bool:
    if target not in WORKER_TARGETS:
        return False
    import torch

    return bool(torch._C._get_privateuse1_backend_name() != target)


@dataclass(frozen=True)
class CellOptions:
    """Everything one ``%%neuron`` cell can be asked to do, as data.

    Attributes
    ----------
    compare : CompareOptions
        Backends, tolerances, seed, layers, steps, RNG and what-if settings.
    profile : bool
        Record an op-level profile of both runs.
    strict : bool
        Fail when the target fell back to CPU (``CellResult.strict_violation``).
    allow_fallback : tuple of str
        Ops allowed to fall back under ``strict``.
    record : str or None
        Save both runs and the report to this artifact path.
    against : str or None
        Compare against the reference run recorded in this artifact instead of running one.
    scan : bool
        Attach the migration scanner's findings for the cell source.
    executor : str
        ``inprocess`` or ``worker`` (the target runs in a child process that owns its device).
    timeout : float or None
        Seconds the target run may take on the ``worker`` executor before it is ended.
    extra_targets : tuple of str
        More targets compared against the same reference run (``--target neuron,tpu``).
    source_first_line : int
        Line number the user sees for the source's first line (2 in a ``%%neuron`` cell), so
        migration findings name the lines of the editor.
    cluster : str
        Run the targets in Ray actors on this cluster (``--on``): ``ray://HOST:PORT``, or ``ray``
        for the cluster this process connected to with ``ray.init``; empty runs them here.
    cluster_options : RayOptions or None
        How actors are placed there (resources, ready timeout, runtime_env); None for defaults.
    """

    compare: CompareOptions = field(default_factory=CompareOptions)
    profile: bool = False
    strict: bool = False
    allow_fallback: tuple[str, ...] = ()
    record: str | None = None
    against: str | None = None
    scan: bool = True
    executor: str = "auto"
    timeout: float | None = None
    extra_targets: tuple[str, ...] = ()
    source_first_line: int = 1
    cluster: str = ""
    cluster_options: Any = None

    @property
    def targets(self) -> tuple[str, ...]:
        """Every target, first one first."""
        return (self.compare.target, *self.extra_targets)

    @property
    def resolved_executor(self) -> str:
        """``inprocess``, ``worker`` (``auto`` decided for these targets), or ``ray`` (``--on``)."""
        if self.cluster:
            return "ray"
        return resolve_executor(self.executor, self.targets)

    def validate(self) -> None:
        """Raise :class:`~neuron_workbench.errors.OptionError` for settings no run could honour."""
        self.compare.validate()
        if self.executor not in EXECUTOR_CHOICES:
            raise OptionError(
                "{0} must be one of {choices}", "executor", choices=", ".join(EXECUTOR_CHOICES)
            )
        self.compare.check_target_flags(self.targets)
        if self.cluster:
            # only here are the workbench's Ray modules imported (they import Ray itself only on use)
            from neuron_workbench.run.ray_cluster import parse_cluster

            if parse_cluster(self.cluster) != self.cluster:
                raise OptionError(
                    "{0} {value!r} names no Ray cluster", "cluster", value=self.cluster
                )
            if self.executor == "inprocess":
                raise OptionError(
                    "{0} runs the target in a Ray actor; {1} inprocess would run it here",
                    "cluster",
                    "executor",
                )
            if self.cluster_options is not None:
                self.cluster_options.validate()
        if self.timeout is not None and self.timeout <= 0:
            raise OptionError("{0} must be a positive number of seconds", "timeout")
        if self.timeout is not None and self.resolved_executor not in ("worker", "ray"):
            raise OptionError("{0} needs {1} worker (a worker can be ended)", "timeout", "executor")
        targets = self.targets
        for name in self.extra_targets:
            get_backend(name)
        if len(set(targets)) != len(targets):
            raise OptionError(
                "{0} names a backend twice: {names}", "target", names=",".join(targets)
            )
        accelerators = [name for name in targets if name in DEVICES]
        if len(accelerators) > 1 and self.resolved_executor not in ("worker", "ray"):
            raise OptionError(
                "{0} {names} needs {1} worker: one process holds one accelerator backend",
                "target",
                "executor",
                names=",".join(targets),
            )


@dataclass
class CellResult:
    """A finished cell: the report, the strict verdict, what each run printed, the last value."""

    report: Report
    captured: dict[str, Captured]
    last_value: Any = None
    #: The one-line strict-mode failure (``strict`` and ops fell back), else None.
    strict_violation: str | None = None
    #: Where the runs were saved (``record``), else None.
    artifact: Path | None = None
    #: Reports of the further targets (``extra_targets``), against the same reference run.
    extra_reports: list[Report] = field(default_factory=list)

    @property
    def reports(self) -> list[Report]:
        """Every report of the cell, first target first."""
        return [self.report, *self.extra_reports]


def recorded_reference(path: str | None, cell_source: str) -> tuple[Run | None, str | None]:
    """The reference run recorded in the artifact at ``path`` (``--against``), and a warning."""
    if not path:
        return None, None
    from neuron_workbench import artifacts

    artifact = artifacts.load(path)
    run = artifact.runs.get("ref") or next(iter(artifact.runs.values()), None)
    if run is None:
        raise WorkbenchUsageError(f"{path}: the artifact holds no run")
    return run, artifacts.source_mismatch_warning(artifact, cell_source)


def migration_findings(cell_source: str, target: str, first_line: int = 1) -> dict[str, Any] | None:
    """The scanner's findings for the cell source (the report's Migration tab).

    ``first_line`` is the line number the source's first line has where the user reads it.
    """
    if target not in DEVICES:
        return None
    from neuron_workbench.scan import scan_cell

    report = scan_cell("\n" * (first_line - 1) + cell_source, target=target)
    data = report.to_dict()
    data["html"] = report.to_html()
    data["text"] = report.to_text()
    return data


def prepare_target(name: str, executor: str = "auto") -> None:
    """Install an emulated in-process target early (before the first backward pass).

    When the target runs in a worker (``worker``, or ``auto`` for neuron and tpu) nothing is
    installed here: this process keeps no accelerator backend.
    """
    if resolve_executor(executor, [name.strip().lower()]) != "inprocess":
        return
    from neuron_workbench.backends import get_backend
    from neuron_workbench.errors import WorkbenchError

    try:
        backend = get_backend(name)
        if backend.availability().emulated:
            with backend.session():
                pass
    except WorkbenchError:
        pass


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
        capture: Callable[[], contextlib.AbstractContextManager[Captured]] = capture_text,
        relabel: Callable[[Run], None] | None = None,
        instruments: dict[str, Any] | None = None,
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
        reference, warning = recorded_reference(options.against, source)
        if reference is not None:
            import dataclasses

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
            instruments=instruments,
            reference=reference,
            executor=self.executor(
                options.resolved_executor,
                options.timeout,
                cluster=options.cluster,
                cluster_options=options.cluster_options,
            ),
            extra_targets=options.extra_targets,
        )
        report = result.report
        reports = [report, *result.extra_reports]
        if relabel is not None:
            for run in [report.ref, *(each.target for each in reports)]:
                relabel(run)
        if warning:
            for each in reports:
                each.warnings.append(warning)
        artifact = None
        if options.record:
            from neuron_workbench import artifacts

            runs = {} if reference is not None else {"ref": report.ref}
            runs["target"] = report.target
            for extra in result.extra_reports:
                runs[f"target_{extra.target.backend.name}"] = extra.target
            artifact = artifacts.save(
                options.record, runs=runs, cell_source=source, report=report.to_dict()
            )
        if options.scan:
            for each in reports:
                target = each.target.backend.name
                each.migration = migration_findings(source, target, options.source_first_line)
                if each.migration and each.migration.get("findings"):
                    # A rerun of the same cell folds the findings it showed the first time.
                    each.migration["repeat"] = (target, source) in self._scanned
                    self._scanned.add((target, source))
        violation = None
        if options.strict:
            from neuron_workbench.trace.fallback import strict_message, strict_violations

            for each in reports:
                violations = strict_violations(each.target.fallbacks, list(options.allow_fallback))
                if violations and violation is None:
                    violation = strict_message(violations, each.target.backend.name)
        return CellResult(
            report,
            result.captured,
            result.last_value,
            strict_violation=violation,
            artifact=Path(artifact) if artifact is not None else None,
            extra_reports=result.extra_reports,
        )

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
    rtol: float | None = None,
    atol: float | None = None,
    pick: Callable[[Any, str], Run],
) -> Report:
    """The :class:`Report` of two recorded runs (``neuron-workbench compare``), as for a live cell.

    ``pick(artifact, role)`` chooses each artifact's run.
    """
    from neuron_workbench.artifacts import source_mismatch_warning
    from neuron_workbench.compare.tolerances import TolerancePolicy

    ref = pick(ref_artifact, "ref")
    target = pick(target_artifact, "target")
    policy = TolerancePolicy(rtol=rtol, atol=atol)
    comparison, layers = compare_runs(ref, target, policy)
    warnings = []
    mismatch = source_mismatch_warning(ref_artifact, target_artifact.cell_source)
    if mismatch:
        warnings.append(mismatch)
    warnings += [
        f"{name!r} could not be deep-copied, so both runs used the same object"
        for name in sorted(set(ref.shared_names) | set(target.shared_names))
    ]
    return Report(
        ref=ref,
        target=target,
        comparison=comparison,
        cell_source=target_artifact.cell_source,
        options={
            "rtol": rtol,
            "atol": atol,
            "ref_artifact": str(ref_artifact.path),
            "target_artifact": str(target_artifact.path),
        },
        warnings=warnings,
        layers=layers,
        scalars=compare_observed_scalars(ref, target, policy),
    )

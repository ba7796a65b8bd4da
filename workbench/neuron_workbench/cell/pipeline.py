"""Run one cell on the reference and the target backend, compare, and build the :class:`Report`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.compare import Comparison, compare_outputs
from neuron_workbench.compare.budget import (
    Budget,
    OracleRuns,
    measure_budget,
    tolerance_lines,
)
from neuron_workbench.compare.flatten import FlattenedOutputs
from neuron_workbench.compare.oracle import oracle_instrument, rerun
from neuron_workbench.compare.tolerances import Tolerance, TolerancePolicy
from neuron_workbench.errors import BackendUnavailable
from neuron_workbench.report.hints import (
    Evidence,
    autocast_registration_hint,
    cpu_lacks_half_fft_hint,
    cuda_refuses_too_hint,
    float64_gradcheck_hint,
    hints_for,
    kernel_only_op_hint,
    missing_tpu_op_hint,
    not_identified,
    rounding_hint,
)
from neuron_workbench.report.report import IDLE_TARGET, Report
from neuron_workbench.run import (
    CellProgram,
    ResidentObjects,
    Run,
    RunSpec,
    commit,
    execute,
    mark_resident,
    torch_settings,
)
from neuron_workbench.run.executor import (
    LAST_EXPRESSION,
    Captured,
    Executor,
    InProcessExecutor,
    Instrument,
    capture_text,
    devices_as_the_notebook_names_them,
    notebook_default_device_suspended,
)
from neuron_workbench.run.file_writes import originals_folder, tempfile_names
from neuron_workbench.run.module_versions import assigned_values
from neuron_workbench.run.namespace import class_attributes, put_back_class_attributes
from neuron_workbench.run.random_state import restore_random_state
from neuron_workbench.run.records import COMPILED_DRAW, compiled_draws, recorded
from neuron_workbench.run.transport import answers_set_classes

if TYPE_CHECKING:
    from neuron_workbench.compare.layer_divergence import LayerComparison

#: The report's note when the target ran in its worker while the reference ran in this process.
CONCURRENT_NOTE = (
    "the reference and the target ran at the same time, so their wall times share this host's "
    "cores (with --profile they run one after the other)"
)
#: The report's note when --judge budget meets a recorded reference (the oracle reruns the cell).
RECORDED_BUDGET_NOTE = (
    "the precision budget was not measured: its float64 oracle reruns the reference, which was "
    "recorded, so outputs were judged by tolerance"
)


@dataclass
class CellReports:
    """One report per target, plus each run's captured output (to replay what the cell printed).

    ``reports`` come first target first (``--target neuron,tpu`` compares each against the same
    reference run).
    """

    reports: list[Report]
    captured: dict[str, Captured]
    last_value: Any = None
    #: The kept run set torch's default device (``torch.set_default_device`` in the cell): to what,
    #: as the cell named it; the notebook gets it once the cell is handled.
    sets_default_device: bool = False
    default_device: str | None = None

    @property
    def report(self) -> Report:
        """The first target's report."""
        return self.reports[0]


def _runs_on_their_own_default_device(
    function: Callable[..., CellReports],
) -> Callable[..., CellReports]:
    """``function`` with the notebook's default device unset meanwhile and given as ``default_device``.

    ``torch.set_default_device("cuda")`` in the notebook: each run works with its own device, and
    the kernel's own work here (answers rebuilt, comparisons) with none. One the cell itself sets
    holds for the notebook afterwards, as it would in a plain cell.
    """

    @functools.wraps(function)
    def with_default_device(*args: Any, **kwargs: Any) -> CellReports:
        with notebook_default_device_suspended() as notebook_device:
            result = function(*args, default_device=notebook_device, **kwargs)
        if result.sets_default_device:
            # a device this process cannot name (an accelerator the kernel lacks) stays unset
            with contextlib.suppress(RuntimeError):
                torch.set_default_device(result.default_device)
        return result

    return with_default_device


def _originals_dropped_after(function: Callable[..., CellReports]) -> Callable[..., CellReports]:
    """``function`` given a new folder of originals as ``originals``, removed once it returns.

    The cell's kept run keeps there the original of each file it changes, which the other runs
    (the oracle's and ``--compile-check``'s after it) read in its place; removed when it ends,
    raises or is interrupted.
    """

    @functools.wraps(function)
    def with_originals(*args: Any, **kwargs: Any) -> CellReports:
        folder = originals_folder()
        try:
            return function(*args, originals=folder, **kwargs)
        finally:
            # most cells change no file: the folder was never made (one failed lstat)
            shutil.rmtree(folder, ignore_errors=True)

    return with_originals


@_runs_on_their_own_default_device
@_originals_dropped_after
def compare_cell(
    program: CellProgram,
    namespace: MutableMapping[str, Any],
    options: CompareOptions,
    *,
    hidden: frozenset[str] = frozenset(),
    resident: ResidentObjects | None = None,
    capture: Callable[..., contextlib.AbstractContextManager[Captured]] = capture_text,
    live_output: bool = False,
    instruments: dict[str, Instrument] | None = None,
    reference: Run | None = None,
    executor: Executor | None = None,
    extra_targets: Sequence[str] = (),
    relabel: Callable[[Run], None] | None = None,
    warnings: Sequence[str] = (),
    migration: Callable[[str], dict[str, Any] | None] | None = None,
    default_device: torch.device | None = None,
    originals: str | None = None,
) -> CellReports:
    """Run ``program`` on both backends and compare; commit the kept run when both succeeded.

    Parameters
    ----------
    instruments : dict, optional
        Extra run instruments (profilers), on top of the ones the options ask for.
    reference : Run, optional
        A recorded reference run to compare against instead of executing one.
    executor : Executor, optional
        Where the target run happens (default: in this process).
    extra_targets : sequence of str
        More targets compared against the same reference run (``--target neuron,tpu``): one
        report each after the first target's; only the first target's run can be kept.
    relabel : callable, optional
        Called on every run once it ends, before any report is built (names sites ``cell [N]``).
    warnings : sequence of str
        Warnings for every report (a recorded reference of another cell's source).
    migration : callable, optional
        The migration findings of the cell for a target's name (None: no scan).
    default_device : torch.device, optional
        Filled in by the decorator: what ``torch.set_default_device`` set in the notebook, unset
        while the cell is handled (each run works with its own device; see
        :func:`~neuron_workbench.run.executor.notebook_default_device_suspended`).
    originals : str, optional
        Filled in by the decorator: the cell's folder of originals (:attr:`RunSpec.originals`).

    Raises
    ------
    BackendUnavailable
        When a backend cannot run here (before anything is executed).
    """
    options.validate()
    policy = options.policy()
    ref_backend = get_backend(options.ref)
    target_backend = options.backend(options.target)
    executor = executor if executor is not None else InProcessExecutor()
    extra_backends = [options.backend(name) for name in extra_targets]
    checks = [] if reference is not None else [ref_backend.availability()]
    checks += [executor.availability(backend) for backend in (target_backend, *extra_backends)]
    for availability in checks:
        if not availability:
            raise BackendUnavailable(availability.reason)
    from neuron_workbench.run.scalars import scalar_instrument
    from neuron_workbench.trace.compile import compile_instrument
    from neuron_workbench.trace.optimizer import optimizer_instrument

    # Gradients at every optimizer.step(): evidence for the optimizer hints, copied only on a step.
    all_instruments = {"optimizer": optimizer_instrument, **(instruments or {})}
    # What torch.compile did (graphs, graph breaks, recompiles): nothing unless the cell compiles.
    all_instruments.setdefault("compile", compile_instrument(program.filename))
    # Every scalar the program materialises from a tensor, by call site: its loss curve.
    all_instruments.setdefault("scalars", scalar_instrument(options.max_steps, program.filename))
    if options.layers:
        from neuron_workbench.run.cell import calls_backward
        from neuron_workbench.trace.layers import layer_instrument

        # Gradient hooks cost a little per module call: only when the cell runs a backward pass.
        gradients = options.steps > 1 or calls_backward(program, namespace)
        all_instruments["layers"] = layer_instrument(options.layers_full, gradients)
    resident = resident if resident is not None else ResidentObjects()
    kept_run = "target" if reference is not None or options.keep == "target" else "ref"
    spec = RunSpec(
        program,
        namespace,
        seed=options.seed,
        hidden=hidden,
        resident=resident,
        capture=capture,
        instruments=all_instruments,
        rng_on_cpu=options.rng == "cpu",
        steps=options.steps,
        ref_precision=options.ref_precision,
        # the run whose results the namespace gets is the one whose files stay on disk
        kept_run=kept_run,
        # ... and whose output the front end shows as it comes (``capture(live=True)``), when the
        # front end's capture can (the magic's) and that run is here
        live_run=kept_run if live_output and reference is None else None,
        # a kept target in another process changes its own copies of the notebook's classes,
        # which never come back: the reference's changes are the cell's here
        classes_run=(
            "ref"
            if kept_run == "target"
            and reference is None
            and not isinstance(executor, InProcessExecutor)
            else None
        ),
        default_device=default_device,
        torch_settings=torch_settings.current(),
        # ... and the settings the notebook's cells assigned on its own modules (config.LR = 0.5)
        module_values=assigned_values(),
        # what the temporary folder held before any run: the same for all of them (a run in a
        # worker starts a moment after the reference here, which may have made a folder by then)
        notebook_temp=tempfile_names(),
        # ... and what its files were: the runs not kept read them so, whatever the kept one does
        originals=originals,
    )
    # Every target runs before anything is committed: all start from the same namespace. A target in
    # a worker runs while the reference runs here, unless timings must not compete (--profile).
    targets = [(target_backend, "target"), *((b, f"target:{b.name}") for b in extra_backends)]
    together = (
        reference is None
        and "profile" not in all_instruments
        and getattr(executor, "concurrent", False)
    )
    findings: dict[str, dict[str, Any] | None] = {}
    ref_flattened = None

    def migration_for(name: str) -> dict[str, Any] | None:
        if migration is not None and name not in findings:
            findings[name] = migration(name)
        return findings.get(name)

    # the notebook's classes as before any run: a run here changes them (Counter.n += 1), and a
    # cell that commits nothing puts them back
    classes = class_attributes(namespace)
    if together:
        pending: list[Any] = []
        try:
            with _cores_shared():
                for backend, run_id in targets:
                    pending.append(
                        executor.start(  # type: ignore[attr-defined]
                            spec, backend, run_id=run_id, what_if=options.what_if_on(backend.name)
                        )
                    )
                ref_run = execute(spec, ref_backend, run_id="ref")
            # The scan needs no run: it fills the wait for the targets, which usually end later.
            for backend, _ in targets:
                migration_for(backend.name)
            # So does flattening the reference's outputs for the comparison (an output the
            # comparison adds or finds rebound by then is walked again there)
            if ref_run.ok:
                ref_flattened = FlattenedOutputs(ref_run.outputs)
            target_runs = [_checked_target(each.result()) for each in pending]
        except BaseException:  # an interrupt, an option a target refused: abandon every run
            for each in pending:
                each.cancel()
            _notebook_as_it_was(spec, classes)
            raise
    else:
        # One after the other (--profile), with the thread count of the runs made together all the
        # same: Dynamo guards it, so a model compiled in another cell compiled again on both sides
        # ("GLOBAL_STATE changed: num_threads"), inside the timings, and reductions split alike.
        shared = reference is None and getattr(executor, "concurrent", False)
        try:
            with _cores_shared() if shared else contextlib.nullcontext():
                ref_run = (
                    reference if reference is not None else execute(spec, ref_backend, run_id="ref")
                )
                # with no run here (--against), the target's is the one that changed notebook
                # classes
                with answers_set_classes() if reference is not None else contextlib.nullcontext():
                    target_runs = [
                        _run_target(
                            spec, executor, backend, run_id, options.what_if_on(backend.name)
                        )
                        for backend, run_id in targets
                    ]
        except BaseException:  # a value the target cannot receive, an interrupt
            _notebook_as_it_was(spec, classes)
            raise
    target_run = target_runs[0]
    for run in (ref_run, *target_runs):
        _note_compiled_draws(run)
        if relabel is not None:
            relabel(run)
        if together:  # a fact of the runs (recordings keep it): their wall times shared the cores
            run.facts.shared_host = True
    schedule = [RECORDED_BUDGET_NOTE] if reference is not None and options.judge == "budget" else []
    # the oracle reruns the cell from the namespace as it was: before anything is committed
    oracle = OracleRuns()
    compared = []
    # a recorded reference ran from another namespace: nothing of this one stands for it
    before = namespace if reference is None else None
    try:
        for run in target_runs:
            comparison, layers = compare_runs(
                ref_run, run, policy, unchanged=before, ref_flattened=ref_flattened
            )
            budget = None
            if reference is None:
                budget = precision_budget(
                    spec, ref_backend, ref_run, run, comparison, options.judge, oracle, layers
                )
            compared.append((run, comparison, layers, budget))
        # --compile-check: the cell once more with torch.compile off, before anything is committed
        eager = (
            _compile_check(spec, ref_backend, executor, target_backend, options, program.source)
            if options.compile_check
            else None
        )
    except BaseException:  # an interrupt during the oracle's rerun: nothing is committed
        _notebook_as_it_was(spec, classes)
        raise
    last_value = None
    sets_default_device, default_device_set = False, None
    # A cell that raised on any run, a further target's included, leaves the namespace as it was,
    # whatever order --target names the targets in
    if ref_run.ok and all(run.ok for run in target_runs):
        if reference is not None or options.keep == "target":
            kept, other = target_run, ref_run
            devices_as_the_notebook_names_them(kept, other, namespace, resident)
        else:
            kept, other = ref_run, target_run
        commit(namespace, kept)
        if kept is target_run and reference is None:
            warnings = [*warnings, *_reference_values_kept(namespace, kept, other)]
        mark_resident(resident, kept, other)
        last_value = kept.last_value
        sets_default_device, default_device_set = _default_device_set(kept, other)
    else:
        _notebook_as_it_was(spec, classes)  # nothing committed
    reports = [
        build_report(
            ref_run,
            run,
            dataclasses.replace(
                options, target=run.backend.name, what_if=options.what_if_on(run.backend.name)
            ),
            cell_source=program.source,
            comparison=(comparison, layers),
            budget=budget,
            oracle=oracle.oracle,
            schedule=schedule,
            warnings=warnings,
            compile_check=eager if index == 0 else None,
            migration=migration_for(run.backend.name),
        )
        for index, (run, comparison, layers, budget) in enumerate(compared)
    ]
    reports = [_idle_target_noted(report) for report in reports]
    return CellReports(
        reports,
        spec.captured,
        last_value,
        sets_default_device=sets_default_device,
        default_device=default_device_set,
    )


def _idle_target_noted(report: Report) -> Report:
    """Say so when the target put nothing on its device while the cell computed tensors.

    The usual cause: ``device`` chosen in a plain cell from ``torch.cuda.is_available()``, which is
    the CPU in a kernel without a GPU, so both runs computed on the CPU and the comparison shows
    nothing of the device. Judged by the target's peak device memory, where its backend knows it.
    """
    target = report.target
    memory = target.memory
    if (
        not target.ok
        or report.comparison is None
        or target.backend.device.partition(":")[0] in ("cpu", "cuda")
        or memory is None
        or memory.peak_bytes != 0
        or not any(diff.kind == "tensor" for diff in report.comparison.compared)
    ):
        return report
    warning = IDLE_TARGET.format(target=target.backend.name)
    return dataclasses.replace(report, idle_target=True, warnings=[*report.warnings, warning])


def _notebook_as_it_was(spec: RunSpec, classes: list[tuple[type, dict[str, Any]]]) -> None:
    """The notebook's random state and classes as before the cell (none of its runs is committed).

    Seeded runs too: ``--seed`` seeds each run, and the reference runs in this process, so a cell
    refused after it had run (``--profile``), or one a target raised in, left the notebook's
    generators seeded and drawn from. A class is no copy in the run here: ``Counter.n += 1``
    before the error stayed counted, where the cell's ERROR leaves the namespace as it was.
    """
    restore_random_state(spec.random_state)
    put_back_class_attributes(classes)


def _default_device_set(kept: Run, other: Run) -> tuple[bool, str | None]:
    """Whether the kept run set torch's default device, and to what, judged with the other run.

    On the host standing in for cuda, a device read off a tensor the cell put on cuda
    (``torch.set_default_device(w.device)``) is the host's cpu; the accelerator run's is its own
    device, which means cuda.
    """
    if not kept.sets_default_device:
        return False, None
    device = kept.default_device
    if other.sets_default_device and (other.default_device or "").startswith("cuda"):
        device = other.default_device
    return True, device


def build_report(
    ref: Run,
    target: Run,
    options: CompareOptions,
    *,
    cell_source: str,
    comparison: tuple[Comparison, Any] | None = None,
    budget: Budget | None = None,
    oracle: Run | None = None,
    schedule: Sequence[str] = (),
    warnings: Sequence[str] = (),
    compile_check: Any = None,
    migration: dict[str, Any] | None = None,
) -> Report:
    """The :class:`Report` of two runs, for a live cell, a further target or two recordings alike.

    Parameters
    ----------
    options : CompareOptions
        The settings the runs were made and are judged with (recorded in the report).
    comparison : tuple, optional
        ``compare_runs``'s result when the caller has it already (the precision budget needed it).
    budget : Budget, optional
        The precision budget, when its oracle could run (a live cell).
    schedule : sequence of str
        Notes on how the runs were compared (a recorded reference under the budget judge).
    warnings : sequence of str
        Warnings about the inputs (a recording of another cell's source).
    compile_check : CompileCheck, optional
        ``--compile-check``'s verdicts of the cell with torch.compile off.
    migration : dict, optional
        The migration scanner's findings for the cell source (the report's Migration tab).
    """
    policy = options.policy()
    compared, layers = comparison if comparison is not None else compare_runs(ref, target, policy)
    shared = sorted(set(ref.shared_names) | set(target.shared_names))
    notes = comparison_notes(ref, target, policy) + list(schedule) + _explained(compared)
    return Report(
        ref=ref,
        target=target,
        comparison=compared,
        cell_source=cell_source,
        options=options.to_dict(),
        warnings=[
            *warnings,
            *(
                f"{name!r} could not be deep-copied, so both runs used the same object"
                for name in shared
            ),
            *_compile_warnings(target),
            *_unreadable_scalars(ref, target),
            *_layers_full_unmatched(options.layers_full, ref),
        ],
        layers=layers,
        notes=notes,
        budget=budget,
        scalars=compare_observed_scalars(
            ref, target, policy, oracle, by_budget=options.judge == "budget", layers=layers
        ),
        compile_check=compile_check,
        migration=migration,
    )


def _unreadable_scalars(ref: Run, target: Run) -> list[str]:
    """A warning for a run whose observed scalars cannot be read (a recording's, damaged).

    They are not compared: the verdict would otherwise say nothing of the loss curves it skipped.
    """
    from neuron_workbench.compare.scalars import unreadable_trace

    found = []
    for role, run in (("reference", ref), ("target", target)):
        why = unreadable_trace(run.extras.get("scalars"))
        if why is not None:
            found.append(
                f"the {role} run's observed scalars could not be read ({why}); they are not "
                "compared"
            )
    return found


def compare_observed_scalars(
    ref: Run,
    target: Run,
    policy: TolerancePolicy | None = None,
    oracle: Run | None = None,
    *,
    by_budget: bool = False,
    layers: LayerComparison | None = None,
) -> Any:
    """The two runs' observed scalars compared (a ``ScalarComparison``), with hints where they part.

    ``oracle``: the precision budget's float64 rerun, when it ran for this cell; the first
    divergence then gets its error ratio ``R``, and ``by_budget`` (``--judge budget``) judges
    each floating value by its ``R``, as floating outputs are judged. ``layers``: what
    ``--layers`` found, which an unexplained first divergence's hint names. None when either
    run raised or neither materialised a scalar from a tensor.
    """
    if not (ref.ok and target.ok) or "scalars" not in ref.extras or "scalars" not in target.extras:
        return None
    from neuron_workbench.compare.compare import OutputDiff
    from neuron_workbench.compare.scalars import compare_scalars

    policy = with_precision_floor(policy or TolerancePolicy(), ref, target)
    oracle_scalars = None
    if by_budget and oracle is not None and oracle.ok:
        oracle_scalars = oracle.extras.get("scalars")
    scalars = compare_scalars(
        ref.extras["scalars"], target.extras["scalars"], policy, oracle_trace=oracle_scalars
    )
    if scalars is not None and scalars.first is not None:
        first = scalars.first
        site = next((s for s in scalars.sites if s.site == first.site), None)
        # judged as a failing output of the tensor's dtype: the same evidence explains it
        diff = OutputDiff(
            path=first.site,
            status="differ",
            kind="number",
            tolerance=site.tolerance if site is not None else Tolerance(0.0, 0.0),
            ref_dtype=site.dtype if site is not None else None,
            target_dtype=site.dtype if site is not None else None,
        )
        first.hints = hints_for(diff, ref, target, Evidence(ref, target, policy, layers))
        if oracle is not None and oracle.ok and "scalars" in oracle.extras:
            from neuron_workbench.compare.scalars import scalar_budget

            scalar_budget(first, diff.ref_dtype, oracle.extras["scalars"])
    return scalars


def _compile_check(
    spec: RunSpec,
    ref_backend: Any,
    executor: Executor,
    target_backend: Any,
    options: CompareOptions,
    source: str,
) -> Report:
    """The report of the cell run with ``torch.compile`` off on both sides (``--compile-check``)."""
    from neuron_workbench.run.compile_check import eager_runs

    ref, target = eager_runs(
        spec,
        ref_backend,
        lambda eager, run_id: _run_target(
            eager, executor, target_backend, run_id, options.what_if_on(target_backend.name)
        ),
    )
    return build_report(ref, target, options, cell_source=source)


def _explained(comparison: Comparison | None) -> list[str]:
    """The evidence of each output whose difference does not fail the verdict."""
    return [d.explained for d in comparison.diffs if d.explained] if comparison else []


def _note_compiled_draws(run: Run) -> None:
    """Random functions inside compiled graphs count as the run's draws, never fingerprinted.

    The compiler draws their numbers with its own generator, so two runs cannot be shown to have
    drawn the same ones.
    """
    record = recorded(run.extras.get("compile"))
    for name, count in (getattr(record, "random_ops", None) or {}).items():
        key = f"{name}{COMPILED_DRAW}"
        run.facts.random_ops[key] = run.facts.random_ops.get(key, 0) + count
        if "dropout" in name:
            run.facts.dropout_in_training += count


def _layers_full_unmatched(patterns: Sequence[str], run: Run) -> list[str]:
    """A warning for each ``--layers-full`` pattern that no module call of ``run`` matched.

    Names are known only once the cell has run, so a mistyped one (``fc1`` for ``model.fc1``, or
    the reverse) kept nothing and said nothing; the warning shows names the run had.
    """
    import fnmatch

    trace = _trace_of(run.extras["layers"]) if patterns and "layers" in run.extras else None
    if trace is None:
        return []
    names = list(dict.fromkeys(call.module for call in trace.calls))
    shown = ", ".join(repr(name) for name in names[:6]) + (", ..." if len(names) > 6 else "")
    return [
        f"--layers-full {pattern!r} matched no module call (this run's modules: {shown or 'none'})"
        for pattern in patterns
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names)
    ]


def _reference_values_kept(
    namespace: MutableMapping[str, Any], kept: Run, reference: Run
) -> list[str]:
    """Bind the reference's values of the names whose target values stayed in its process.

    ``--keep target``: a generator or a lock the cell made could not come back from the worker,
    and the name was left unbound, where a plain cell binds it. The reference's stands in, and the
    report says so.
    """
    names = [name for name in kept.left_behind if name in reference.bindings]
    if not names:
        return []
    namespace.update({name: reference.bindings[name] for name in names})
    return [
        f"--keep target: {', '.join(names)} hold{'s' if len(names) == 1 else ''} the reference's "
        f"value{'' if len(names) == 1 else 's'}: the {kept.backend.name} run's could not come back "
        "from its process"
    ]


def _compile_warnings(run: Run) -> list[str]:
    """What the target's torch.compile warned (an ignored ``mode``), once each."""
    record = recorded(run.extras.get("compile"))
    found = getattr(record, "warnings", None) or []
    return [f"{run.backend.name}: {w}" for w in dict.fromkeys(found)]


def precision_budget(
    spec: RunSpec,
    ref_backend: Any,
    ref: Run,
    target: Run,
    comparison: Comparison | None,
    judge: str,
    oracle: OracleRuns | None = None,
    layers: LayerComparison | None = None,
) -> Budget | None:
    """The precision budget of a comparison, measured lazily.

    Under ``judge="budget"`` every floating output is measured, and the oracle runs for the
    observed scalars (:func:`compare_observed_scalars`) where the cell bound no floating output;
    under ``tolerance`` only the outputs that failed their tolerance, and nothing (no oracle run)
    when none did.
    """
    if comparison is None:
        return None
    paths = None
    if judge != "budget":
        paths = [
            d.path for d in comparison.failures if d.status in ("differ", "nan-mismatch", "dtype")
        ]
        if not paths:
            return None
    in_graphs = compiled_draws(ref.facts)
    if in_graphs:
        # The oracle draws the reference's numbers again only where the mode sees them: measured
        # against other numbers (a compiled dropout's mask), R read a mask difference as rounding.
        return Budget(
            oracle_error="the reference drew random numbers inside compiled graphs "
            f"({', '.join(in_graphs)}) with the compiler's own generator, which the float64 "
            "oracle cannot draw again: outputs were judged by tolerance"
        )
    try:
        budget = measure_budget(spec, ref_backend, ref, target, paths, oracle=oracle)
        if (
            judge == "budget"
            and oracle is not None
            and oracle.oracle is None
            and _scalars_seen(ref)
        ):
            # a loop that only prints its loss binds no floating output, so measuring ran no
            # oracle: its scalars were judged by a tolerance that hides a target-only bug
            oracle.oracle = rerun(spec, ref_backend, oracle_instrument(spec))
    except Exception as exc:  # a measuring bug must not cost the user the comparison itself
        return Budget(oracle_error=f"the precision budget failed: {type(exc).__name__}: {exc}")
    budget.tolerances = tolerance_lines(comparison.failures, budget)
    if judge == "budget":
        _explain_beyond_budget(comparison, budget, ref, target, oracle, layers)
    for diff in comparison.failures:
        measured = budget.get(diff.path)
        # "cause not identified" sends the user looking for a bug the oracle ruled out (under
        # either judge: --judge budget passes such an output, yet its hint still showed)
        if measured is not None and measured.within and not_identified(diff.hints):
            diff.hints = [rounding_hint(measured.factor, measured.label)]
    return budget


def _scalars_seen(run: Run) -> bool:
    """Whether ``run`` materialised a scalar from a tensor (its observed scalars)."""
    from neuron_workbench.compare.scalars import recorded_trace

    trace = recorded_trace(run.extras.get("scalars"))
    return trace is not None and bool(trace.series)


def _explain_beyond_budget(
    comparison: Comparison,
    budget: Budget,
    ref: Run,
    target: Run,
    oracle: OracleRuns | None,
    layers: LayerComparison | None = None,
) -> None:
    """Explain or hint the outputs beyond budget.

    A weight an Adam step amplified is judged by its gradients against the oracle's; the others
    within tolerance get hints (the tolerance judge gave them none).
    """
    evidence = None
    oracle_run = oracle.oracle if oracle is not None else None
    for diff in comparison.compared:
        measured = budget.get(diff.path)
        if diff.explained or measured is None or measured.within:
            continue
        evidence = evidence or Evidence(ref, target, layers=layers)
        if oracle_run is not None and oracle_run.ok:
            diff.explained = evidence.amplification_within_budget(diff, oracle_run) or ""
        if diff.passed and not diff.explained:
            # judged as the failure the budget says it is
            diff.hints = hints_for(
                dataclasses.replace(diff, status="differ"), ref, target, evidence
            )


@contextlib.contextmanager
def _cores_shared() -> Iterator[None]:
    """Half the intra-op threads each for the reference here and the target in its worker.

    The two processes run at the same time; with all threads each, their thread pools would fight
    over the cores (a parallel region waits for its slowest thread). Both runs use the same count,
    so their reductions split alike. Runs one after the other (``--profile``) take the same count
    too: a compiled graph guards it.
    """
    threads = torch.get_num_threads()
    shared = max(1, threads // 2)
    if shared != threads:
        torch.set_num_threads(shared)
    try:
        yield
    finally:
        if torch.get_num_threads() == shared != threads:  # a count the cell set itself stays
            torch.set_num_threads(threads)


def _run_target(
    spec: RunSpec, executor: Executor, backend: Any, run_id: str, what_if: str | None
) -> Run:
    return _checked_target(executor.run(spec, backend, run_id=run_id, what_if=what_if))


def _checked_target(run: Run) -> Run:
    if not run.backend.emulated and run.fallbacks and "profile" in run.extras:
        # Real TorchNeuron reports fallback op names only; the profile adds counts and sites.
        from neuron_workbench.trace.fallback import cross_check

        run.fallbacks = cross_check(run.fallbacks, recorded(run.extras["profile"]))
    return run


def compare_runs(
    ref: Run,
    target: Run,
    policy: TolerancePolicy | None = None,
    *,
    unchanged: Mapping[str, Any] | None = None,
    ref_flattened: FlattenedOutputs | None = None,
) -> tuple[Comparison | None, LayerComparison | None]:
    """Compare two finished runs, live or recorded: outputs with hints, and layers if both have them.

    ``unchanged`` is the namespace both runs started from, before anything is committed: a name
    one run bound and the other left as it was is compared with the value it was left at.
    ``ref_flattened``: the reference's outputs flattened while the target ran (see
    :class:`~neuron_workbench.compare.flatten.FlattenedOutputs`). Returns ``(None, None)`` when
    either run raised.
    """
    if not (ref.ok and target.ok):
        return None, None
    policy = with_precision_floor(policy or TolerancePolicy(), ref, target)
    _complete_outputs(ref, target, unchanged)
    comparison = compare_outputs(
        ref.outputs,
        target.outputs,
        policy=policy,
        devices=(ref.backend.device, target.backend.device),
        temp_names=(ref.facts.temp_names, target.facts.temp_names),
        measured_texts=(ref.facts.measured_texts, target.facts.measured_texts),
        measured_values=(ref.facts.measured_values, target.facts.measured_values),
        ref_flattened=ref_flattened,
    )
    layers = None
    if "layers" in ref.extras and "layers" in target.extras:
        from neuron_workbench.compare.layer_divergence import compare_layers, full_output_diffs

        ref_trace, target_trace = (
            _trace_of(ref.extras["layers"]),
            _trace_of(target.extras["layers"]),
        )
        if ref_trace is not None and target_trace is not None:
            layers = compare_layers(ref_trace, target_trace, policy)
            layers.full_diffs = full_output_diffs(ref_trace, target_trace, policy)
    failures = comparison.failures
    if failures:  # the evidence (random-draw fingerprints, ...) is read only to explain a failure
        # with what --layers found: a hint that cannot name the cause names the module instead
        evidence = Evidence(ref, target, policy, layers)
        for diff in failures:
            diff.hints = hints_for(diff, ref, target, evidence)
            diff.explained = evidence.amplification(diff) or ""
    return comparison, layers


def _complete_outputs(ref: Run, target: Run, unchanged: Mapping[str, Any] | None = None) -> None:
    """Compare an output of one run with the other run's final value of that name.

    Moving a module to a device can read as an in-place change on one backend and not on another
    (an emulated device swaps parameter tensors; CPU and CUDA swap their ``.data``); either way the
    cell's effect is the object's final state, which every run keeps in its bindings. A run finds
    its outputs by identity, so rebinding a name to the object it held (``True``, a small int, an
    interned string) is no output: that run's value is the one in ``unchanged``.
    """
    for run, other in ((ref, target), (target, ref)):
        for name in other.outputs:
            if name in run.outputs:
                continue
            if name in run.bindings:
                run.outputs[name] = run.bindings[name]
            elif (
                unchanged is not None
                and name in unchanged
                and name != LAST_EXPRESSION  # IPython's output history, not the cell's value
                and name not in run.deleted
            ):
                run.outputs[name] = unchanged[name]


def with_precision_floor(policy: TolerancePolicy, ref: Run, target: Run) -> TolerancePolicy:
    """``policy`` with the autocast dtypes either run computed in as its precision floor."""
    names = sorted(set(ref.facts.autocast_dtypes) | set(target.facts.autocast_dtypes))
    floor = tuple(
        getattr(torch, n) for n in names if isinstance(getattr(torch, n, None), torch.dtype)
    )
    return dataclasses.replace(policy, precision_floor=floor) if floor else policy


def comparison_notes(ref: Run, target: Run, policy: TolerancePolicy | None) -> list[str]:
    """What the report says about how the runs were compared, beyond the verdict.

    The tolerance floor autocast implies, and how a reference stood in for another device (with
    what stays different from it).
    """
    notes = []
    floor = with_precision_floor(policy or TolerancePolicy(), ref, target).floor_note()
    if floor:
        notes.append(floor)
    notes.extend(f"{ref.backend.label}: {note}" for note in ref.facts.notes)
    notes.extend(f"{target.backend.label}: {note}" for note in target.facts.notes)
    if ref.facts.shared_host and target.facts.shared_host:
        notes.append(CONCURRENT_NOTE)
    for run in (ref, target):
        hint = autocast_registration_hint(run)
        if hint:
            notes.append(f"{run.backend.label} error: {hint}")
    for hint in (
        cuda_refuses_too_hint(ref, target),
        kernel_only_op_hint(ref, target),
        float64_gradcheck_hint(ref, target),
        missing_tpu_op_hint(ref, target),
    ):
        if hint:
            notes.append(f"{target.backend.label} error: {hint}")
    half_fft = cpu_lacks_half_fft_hint(ref)
    if half_fft:
        notes.append(f"{ref.backend.label} error: {half_fft}")
    if ref.ok and target.ok:
        from neuron_workbench.compare.scalars import max_steps_note

        unstopped = max_steps_note(ref.extras.get("scalars"), target.extras.get("scalars"))
        if unstopped:
            notes.append(unstopped)
    return notes


def _trace_of(value: Any) -> Any:
    # A live run holds the recorder; a recorded run (from an artifact) holds the trace's dict.
    from neuron_workbench.trace.layers import LayerTrace

    data = recorded(value)
    if isinstance(data, dict):
        try:
            return LayerTrace.from_dict(data)
        except (KeyError, TypeError, ValueError):  # a trace from another version: context only
            return None
    return data

"""Run one cell on the reference and the target backend, compare, and build the :class:`Report`."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.compare import Comparison, compare_outputs
from neuron_workbench.compare.budget import (
    JUDGES,
    Budget,
    OracleRuns,
    measure_budget,
    tolerance_lines,
)
from neuron_workbench.compare.tolerances import Tolerance, TolerancePolicy
from neuron_workbench.errors import BackendUnavailable, OptionError
from neuron_workbench.report.hints import Evidence, autocast_registration_hint, hints_for
from neuron_workbench.report.report import Report
from neuron_workbench.run import (
    CellProgram,
    ResidentObjects,
    Run,
    RunSpec,
    commit,
    execute,
    mark_resident,
)
from neuron_workbench.run.cuda_on_host import REF_PRECISIONS
from neuron_workbench.run.executor import (
    Captured,
    Executor,
    InProcessExecutor,
    Instrument,
    capture_text,
)
from neuron_workbench.run.records import recorded

if TYPE_CHECKING:
    from neuron_workbench.compare.layer_divergence import LayerComparison

KEEP_CHOICES = ("ref", "target")
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
RNG_CHOICES = ("device", "cpu")
WHAT_IF_CHOICES = ("bf16-matmul",)


@dataclass(frozen=True)
class CompareOptions:
    """Settings of one comparison (also recorded in the report).

    Attributes
    ----------
    ref, target : str
        Backend names.
    rtol, atol : float or None
        One tolerance for every output (both or neither).
    preset : str
        Tolerance preset (see ``compare.tolerances.PRESETS``).
    per_output : tuple of (str, Tolerance)
        Tolerance overrides by output path or glob.
    seed : int
        Seed at the start of each run.
    keep : str
        Whose results stay in the namespace: ``ref`` or ``target``.
    layers : bool
        Record per-module statistics and find the first diverging module.
    layers_full : tuple of str
        Module-name globs whose full outputs are kept for an element-wise look.
    steps : int
        Run the cell this many times per backend, as consecutive steps (``--steps``; ``%%neuron
        --repeat`` sets it too).
    rng : str
        ``device`` (each device's generator) or ``cpu`` (draw on the CPU and move).
    what_if : str or None
        ``bf16-matmul``: round float32 matmul/conv inputs to bfloat16 on the emulated target.
    ref_precision : str
        ``cuda``: a cpu reference computes as a CUDA GPU would (TF32 matmuls when the cell enables
        them); ``fp32``: full float32 matmuls.
    list_fallbacks : bool
        A ``tpu`` target runs with the CPU fallback on and lists every missing op (``--list-fallbacks``);
        off leaves the adapter's default (``NEURON_WORKBENCH_TPU_LIST_FALLBACKS``).
    track_per_op : bool
        A real ``neuron`` target attributes every fallback to its call (``--track-per-op``, a
        synchronize per op); off leaves the adapter's default (``NEURON_WORKBENCH_NEURON_TRACK_PER_OP``).
    judge : str
        ``tolerance`` or ``budget`` (``--judge``).
    max_steps : int or None
        Stop both runs after this many scalars from the first call site that makes one
        (``--max-steps``; see :mod:`neuron_workbench.run.scalars`).
    compile_check : bool
        Also run the cell with ``torch.compile`` off on both sides and report that verdict too
        (``--compile-check``; :mod:`neuron_workbench.run.compile_check`).
    """

    ref: str = "cpu"
    target: str = "neuron"
    rtol: float | None = None
    atol: float | None = None
    preset: str = "default"
    per_output: tuple[tuple[str, Tolerance], ...] = ()
    seed: int = 0
    keep: str = "ref"
    layers: bool = False
    layers_full: tuple[str, ...] = ()
    steps: int = 1
    rng: str = "device"
    what_if: str | None = None
    ref_precision: str = "cuda"
    list_fallbacks: bool = False
    track_per_op: bool = False
    judge: str = "tolerance"
    max_steps: int | None = None
    compile_check: bool = False

    def backend(self, name: str) -> Any:
        """The adapter for ``name`` with the options these settings give it (tpu, neuron)."""
        backend = get_backend(name)
        options = {}
        if self.list_fallbacks and backend.name == "tpu":
            options["list_fallbacks"] = True
        if self.track_per_op and backend.name == "neuron":
            options["track_per_op"] = True
        return get_backend(backend.name, **options) if options else backend

    def policy(self) -> TolerancePolicy:
        """The tolerance policy these options describe."""
        return TolerancePolicy(self.preset, self.rtol, self.atol, self.per_output)

    def validate(self) -> None:
        """Raise :class:`WorkbenchUsageError` for anything a run could not honour.

        A bad option value raises its subclass :class:`~neuron_workbench.errors.OptionError`,
        which names the option by its API name (front ends spell it as their flag).
        """
        get_backend(self.ref)
        get_backend(self.target)
        self.policy()
        choices = {
            "keep": KEEP_CHOICES,
            "rng": RNG_CHOICES,
            "what_if": (None, *WHAT_IF_CHOICES),
            "ref_precision": REF_PRECISIONS,
            "judge": JUDGES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                shown = ", ".join(c for c in allowed if c is not None)
                raise OptionError("{0} must be one of {choices}", name, choices=shown)
        if self.steps < 1:
            raise OptionError("{0} must be at least 1", "steps")
        if self.max_steps is not None and self.max_steps < 1:
            raise OptionError("{0} must be at least 1", "max_steps")

    def check_target_flags(self, targets: Sequence[str]) -> None:
        """Raise :class:`~neuron_workbench.errors.OptionError` for a target option no target takes."""
        names = {get_backend(name).name for name in targets}
        if self.list_fallbacks and "tpu" not in names:
            raise OptionError("{0} applies to a tpu target", "list_fallbacks")
        if self.track_per_op and "neuron" not in names:
            raise OptionError("{0} applies to a neuron target", "track_per_op")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ref": self.ref,
            "target": self.target,
            "seed": self.seed,
            "keep": self.keep,
            "tolerance": self.policy().to_dict(),
            "layers": self.layers,
            "layers_full": list(self.layers_full),
            "steps": self.steps,
            "rng": self.rng,
            "what_if": self.what_if,
            "ref_precision": self.ref_precision,
            **({"list_fallbacks": True} if self.list_fallbacks else {}),
            **({"track_per_op": True} if self.track_per_op else {}),
            **({"judge": self.judge} if self.judge != "tolerance" else {}),
            **({"max_steps": self.max_steps} if self.max_steps is not None else {}),
            **({"compile_check": True} if self.compile_check else {}),
        }


@dataclass
class CellComparison:
    """A report plus each run's captured output (so the caller can replay what the cell printed)."""

    report: Report
    captured: dict[str, Captured]
    last_value: Any = None
    #: Reports of further targets against the same reference run (``--target neuron,tpu``).
    extra_reports: list[Report] = field(default_factory=list)


def compare_cell(
    program: CellProgram,
    namespace: MutableMapping[str, Any],
    options: CompareOptions,
    *,
    hidden: frozenset[str] = frozenset(),
    resident: ResidentObjects | None = None,
    capture: Callable[[], contextlib.AbstractContextManager[Captured]] = capture_text,
    instruments: dict[str, Instrument] | None = None,
    reference: Run | None = None,
    executor: Executor | None = None,
    extra_targets: Sequence[str] = (),
) -> CellComparison:
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
        More targets compared against the same reference run (``--target neuron,tpu``); their
        reports are ``CellComparison.extra_reports``, and only the first target's run can be kept.

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
    all_instruments.setdefault("scalars", scalar_instrument(options.max_steps))
    if options.layers:
        from neuron_workbench.run.cell import calls_backward
        from neuron_workbench.trace.layers import layer_instrument

        # Gradient hooks cost a little per module call: only when the cell runs a backward pass.
        gradients = options.steps > 1 or calls_backward(program, namespace)
        all_instruments["layers"] = layer_instrument(options.layers_full, gradients)
    resident = resident if resident is not None else ResidentObjects()
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
    )
    # Every target runs before anything is committed: all start from the same namespace. A target in
    # a worker runs while the reference runs here, unless timings must not compete (--profile).
    targets = [(target_backend, "target"), *((b, f"target:{b.name}") for b in extra_backends)]
    together = (
        reference is None
        and "profile" not in all_instruments
        and getattr(executor, "concurrent", False)
    )
    if together:
        pending: list[Any] = []
        try:
            with _cores_shared():
                for backend, run_id in targets:
                    pending.append(
                        executor.start(spec, backend, run_id=run_id, what_if=options.what_if)  # type: ignore[attr-defined]
                    )
                ref_run = execute(spec, ref_backend, run_id="ref")
            target_runs = [_checked_target(each.result()) for each in pending]
        except BaseException:  # an interrupt, an option a target refused: abandon every run
            for each in pending:
                each.cancel()
            raise
    else:
        ref_run = reference if reference is not None else execute(spec, ref_backend, run_id="ref")
        target_runs = [
            _run_target(spec, executor, backend, run_id, options.what_if)
            for backend, run_id in targets
        ]
    target_run, extra_runs = target_runs[0], target_runs[1:]
    for run in (ref_run, *target_runs):
        _note_compiled_draws(run)
    schedule = [CONCURRENT_NOTE] if together else []
    if reference is not None and options.judge == "budget":
        schedule.append(RECORDED_BUDGET_NOTE)
    comparison, layers = compare_runs(ref_run, target_run, policy)
    extra_comparisons = [compare_runs(ref_run, extra_run, policy) for extra_run in extra_runs]
    # the oracle reruns the cell from the namespace as it was: before anything is committed
    oracle = OracleRuns()
    budgets = [
        precision_budget(spec, ref_backend, ref_run, run, each, options.judge, oracle)
        if reference is None
        else None
        for run, each in zip(
            target_runs, [comparison, *(c for c, _ in extra_comparisons)], strict=True
        )
    ]
    # --compile-check: the cell once more with torch.compile off, before anything is committed
    eager = (
        _compile_check(spec, ref_backend, executor, target_backend, options, policy, program.source)
        if options.compile_check
        else None
    )
    last_value = None
    if ref_run.ok and target_run.ok:
        if reference is not None or options.keep == "target":
            kept, other = target_run, ref_run
        else:
            kept, other = ref_run, target_run
        commit(namespace, kept)
        mark_resident(resident, kept, other)
        last_value = kept.last_value
    warnings = [
        f"{name!r} could not be deep-copied, so both runs used the same object"
        for name in sorted(set(ref_run.shared_names) | set(target_run.shared_names))
    ]
    warnings += _compile_warnings(target_run)
    report = Report(
        ref=ref_run,
        target=target_run,
        comparison=comparison,
        cell_source=program.source,
        options=options.to_dict(),
        warnings=warnings,
        layers=layers,
        notes=comparison_notes(ref_run, target_run, policy) + schedule + _explained(comparison),
        budget=budgets[0],
        scalars=compare_observed_scalars(ref_run, target_run, policy, oracle.oracle),
        compile_check=eager,
    )
    extra_reports = []
    for extra_run, (extra_comparison, extra_layers), extra_budget in zip(
        extra_runs, extra_comparisons, budgets[1:], strict=True
    ):
        extra_reports.append(
            Report(
                ref=ref_run,
                target=extra_run,
                comparison=extra_comparison,
                cell_source=program.source,
                options={**options.to_dict(), "target": extra_run.backend.name},
                warnings=list(warnings),
                layers=extra_layers,
                notes=comparison_notes(ref_run, extra_run, policy) + schedule,
                budget=extra_budget,
                scalars=compare_observed_scalars(ref_run, extra_run, policy, oracle.oracle),
            )
        )
    return CellComparison(report, spec.captured, last_value, extra_reports=extra_reports)


def compare_observed_scalars(
    ref: Run, target: Run, policy: TolerancePolicy | None = None, oracle: Run | None = None
) -> Any:
    """The two runs' observed scalars compared (a ``ScalarComparison``), with hints where they part.

    ``oracle``: the precision budget's float64 rerun, when it ran for this cell; the first
    divergence then gets its error ratio ``R``. None when either run raised or neither
    materialised a scalar from a tensor.
    """
    if not (ref.ok and target.ok) or "scalars" not in ref.extras or "scalars" not in target.extras:
        return None
    from neuron_workbench.compare.compare import OutputDiff
    from neuron_workbench.compare.scalars import compare_scalars

    policy = with_precision_floor(policy or TolerancePolicy(), ref, target)
    scalars = compare_scalars(ref.extras["scalars"], target.extras["scalars"], policy)
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
        first.hints = hints_for(diff, ref, target)
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
    policy: TolerancePolicy,
    source: str,
) -> Report:
    """The report of the cell run with ``torch.compile`` off on both sides (``--compile-check``)."""
    from neuron_workbench.run.compile_check import eager_runs

    ref, target = eager_runs(
        spec,
        ref_backend,
        lambda eager, run_id: _run_target(eager, executor, target_backend, run_id, options.what_if),
    )
    comparison, _ = compare_runs(ref, target, policy)
    return Report(
        ref=ref,
        target=target,
        comparison=comparison,
        cell_source=source,
        options=options.to_dict(),
        notes=comparison_notes(ref, target, policy) + _explained(comparison),
    )


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
        key = f"{name} (compiled)"
        run.facts.random_ops[key] = run.facts.random_ops.get(key, 0) + count
        if "dropout" in name:
            run.facts.dropout_in_training += count


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
) -> Budget | None:
    """The precision budget of a comparison, measured lazily.

    Under ``judge="budget"`` every floating output is measured; under ``tolerance`` only the
    outputs that failed their tolerance, and nothing (no oracle run) when none did.
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
    try:
        budget = measure_budget(spec, ref_backend, ref, target, paths, oracle=oracle)
    except Exception as exc:  # a measuring bug must not cost the user the comparison itself
        return Budget(oracle_error=f"the precision budget failed: {type(exc).__name__}: {exc}")
    budget.tolerances = tolerance_lines(comparison.failures, budget)
    if judge == "budget":
        _explain_beyond_budget(comparison, budget, ref, target)
    return budget


def _explain_beyond_budget(comparison: Comparison, budget: Budget, ref: Run, target: Run) -> None:
    """Hints for outputs within tolerance but beyond budget (the tolerance judge gave them none)."""
    evidence = None
    for diff in comparison.compared:
        measured = budget.get(diff.path)
        if diff.passed and measured is not None and not measured.within:
            evidence = evidence or Evidence(ref, target)
            # judged as the failure the budget says it is
            diff.hints = hints_for(
                dataclasses.replace(diff, status="differ"), ref, target, evidence
            )


@contextlib.contextmanager
def _cores_shared() -> Iterator[None]:
    """Half the intra-op threads each for the reference here and the target in its worker.

    The two processes run at the same time; with all threads each, their thread pools would fight
    over the cores (a parallel region waits for its slowest thread). Both runs use the same count,
    so their reductions split alike.
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
    ref: Run, target: Run, policy: TolerancePolicy | None = None
) -> tuple[Comparison | None, LayerComparison | None]:
    """Compare two finished runs, live or recorded: outputs with hints, and layers if both have them.

    Returns ``(None, None)`` when either run raised.
    """
    if not (ref.ok and target.ok):
        return None, None
    policy = with_precision_floor(policy or TolerancePolicy(), ref, target)
    _complete_outputs(ref, target)
    comparison = compare_outputs(ref.outputs, target.outputs, policy=policy)
    failures = comparison.failures
    if failures:  # the evidence (random-draw fingerprints, ...) is read only to explain a failure
        evidence = Evidence(ref, target, policy)
        for diff in failures:
            diff.hints = hints_for(diff, ref, target, evidence)
            diff.explained = evidence.amplification(diff) or ""
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
    return comparison, layers


def _complete_outputs(ref: Run, target: Run) -> None:
    """Compare an input one run changed in place with the other run's final value of it.

    Moving a module to a device can read as an in-place change on one backend and not on another
    (an emulated device swaps parameter tensors; CPU and CUDA swap their ``.data``); either way the
    cell's effect is the object's final state, which every run keeps in its bindings.
    """
    for run, other in ((ref, target), (target, ref)):
        for name in other.outputs:
            if name not in run.outputs and name in run.bindings:
                run.outputs[name] = run.bindings[name]


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
    for run in (ref, target):
        hint = autocast_registration_hint(run)
        if hint:
            notes.append(f"{run.backend.label} error: {hint}")
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

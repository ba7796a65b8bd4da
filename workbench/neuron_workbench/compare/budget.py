"""The precision budget: how far each output is from a float64 oracle, against the reference's own.

For every floating output the reference's error against a float64 rerun of the same cell (the
*noise floor*) is what the reference itself can promise; the target's error against the same oracle,
divided by that floor, is the error ratio ``R``. ``R`` about 1 means the target is as accurate as the
reference; a target-only bug gives a large ``R`` whatever the tolerances.

The oracle is a float64 rerun of the cell on the reference path under a promoting function mode
(:mod:`~neuron_workbench.compare.oracle`), with the reference's own random draws.

What cannot be promoted, and is marked: an output whose oracle value is not float64 (computed
outside torch, bit reinterpretation with ``view(dtype)``, a dtype the cell branches on), or is
missing or of another shape; then, as when the oracle run raises, a *random-rounding* rerun of the
reference gives the floor instead (each op's floating result moved by up to one unit in the last
place at random, a few samples; Verificarlo/Verrou's Monte Carlo arithmetic), and ``R`` is measured
against the reference.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_workbench.compare.compare import with_cpu_kernels
from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.compare.oracle import (
    OracleRuns,
    oracle_instrument,
    rerun,
    rounding_instrument,
)
from neuron_workbench.compare.tolerances import dtype_named
from neuron_workbench.run.executor import RunSpec
from neuron_workbench.run.measurements import source_dtype
from neuron_workbench.run.records import Run

__all__ = [
    "BUDGET_CLASSES",
    "JUDGES",
    "Budget",
    "OracleRuns",
    "BudgetClass",
    "OutputBudget",
    "measure_budget",
]

#: How a verdict judges floating outputs: by fixed tolerances, or by the precision budget.
JUDGES = ("tolerance", "budget")
#: Floor sources, as the report names them.
ORACLE = "float64 oracle"
RANDOM_ROUNDING = "random rounding"
#: Random-rounding samples when no oracle can be had.
ROUNDING_SAMPLES = 3


@dataclass(frozen=True)
class BudgetClass:
    """One band of ``R``: up to ``limit`` (inclusive), its label, and whether it is within budget."""

    limit: float
    label: str
    within: bool


#: The bands of ``R``, in order (data, so they can be recalibrated): AWS's framework-equivalence
#: method passes up to 1.2 and calls 1.2-2 marginal.
BUDGET_CLASSES: tuple[BudgetClass, ...] = (
    BudgetClass(1.2, "as accurate as the reference", True),
    BudgetClass(2.0, "marginal", True),
    BudgetClass(math.inf, "less accurate", False),
)


def classify(ratio: float, classes: Sequence[BudgetClass] = BUDGET_CLASSES) -> BudgetClass:
    """The band ``ratio`` falls in (the last band for NaN)."""
    for band in classes:
        if ratio <= band.limit:
            return band
    return classes[-1]


@dataclass
class OutputBudget:
    """One floating output's noise floor and error ratio.

    Attributes
    ----------
    path : str
        The output leaf (as in :class:`~neuron_workbench.compare.OutputDiff`).
    source : str
        ``float64 oracle`` or ``random rounding`` (where no oracle could be had).
    floor, floor_worst : float
        ‖ref − oracle‖ (Frobenius) and the largest element of |ref − oracle|; with random rounding,
        the reference against its perturbed reruns. At least one ulp of the output's dtype (its
        norm over the elements, and the largest): no stored result is promised closer.
    error, error_worst : float
        The same for the target.
    ratio : float
        ``R = max(error, ulp) / floor`` (0 when the target is exact, 1.0 when both are):
        an error within the dtype's rounding counts as one ulp, so a one-ulp difference from an
        exact reference is ``R`` 2 at most, within budget.
    label : str
        The band's label (:data:`BUDGET_CLASSES`).
    within : bool
        Whether ``R`` is within budget.
    note : str
        Why the oracle could not be used for this output, when ``source`` is random rounding.
    histogram : dict or None
        The element-wise errors' distribution: ``edges`` (``HISTOGRAM_BINS + 1`` values of
        log10 |error|; exact elements count in the first bin) and the ``ref`` and ``target`` counts.
    """

    path: str
    source: str
    floor: float
    floor_worst: float
    error: float
    error_worst: float
    ratio: float
    label: str
    within: bool
    note: str = ""
    histogram: dict[str, list[float]] | None = None

    @property
    def factor(self) -> str:
        """``R`` as the report writes it: ``0.015``, ``1.1``, ``38``, ``2.0e+06``; ``inf`` (zero floor)."""
        if not math.isfinite(self.ratio):
            return "inf"
        if 0 < self.ratio < 0.1:  # a target far more accurate than the reference is not R 0.0
            return f"{self.ratio:.2g}"
        if self.ratio < 10:
            return f"{self.ratio:.1f}"
        return f"{self.ratio:.0f}" if self.ratio < 1e4 else f"{self.ratio:.1e}"

    def describe(self) -> str:
        """``loss: target 38x less accurate than the reference`` or ``loss: R 1.1, marginal``.

        An infinite ``R`` says why: the target's NaN or Inf differ from the reference's, or the
        reference is exact where the target is not.
        """
        if self.within:
            return f"{self.path}: R {self.factor}, {self.label}"
        if math.isinf(self.error):  # (see _target_distance)
            return f"{self.path}: target's NaN or Inf differ from the reference's (R inf)"
        if not math.isfinite(self.ratio):
            return f"{self.path}: target differs where the reference is exact (R inf)"
        return f"{self.path}: target {self.factor}x less accurate than the reference"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite numbers as strings)."""
        data = dataclasses.asdict(self)
        for key, value in list(data.items()):
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = str(value)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputBudget:
        """Inverse of :meth:`to_dict`."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("floor", "floor_worst", "error", "error_worst", "ratio"):
            values[key] = float(values[key])
        return cls(**values)


@dataclass
class Budget:
    """Every floating output's :class:`OutputBudget`, and how the floors were measured."""

    outputs: list[OutputBudget] = field(default_factory=list)
    #: Why the oracle run failed as a whole (random rounding then gave every floor), or "".
    oracle_error: str = ""
    #: ``--tol`` lines that would pass each output that failed its tolerance (see
    #: :func:`tolerance_lines`).
    tolerances: list[str] = field(default_factory=list)

    def get(self, path: str) -> OutputBudget | None:
        """The budget of output ``path``, or None when it has none (not floating, not measured)."""
        for output in self.outputs:
            if output.path == path:
                return output
        return None

    @property
    def worst(self) -> OutputBudget | None:
        """The output with the largest ``R``."""
        return max(self.outputs, key=lambda o: o.ratio, default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "outputs": [o.to_dict() for o in self.outputs],
            "oracle_error": self.oracle_error,
            "tolerances": list(self.tolerances),
            "classes": [
                {
                    "limit": str(c.limit) if math.isinf(c.limit) else c.limit,
                    "label": c.label,
                    "within": c.within,
                }
                for c in BUDGET_CLASSES
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Budget:
        """Inverse of :meth:`to_dict`."""
        return cls(
            [OutputBudget.from_dict(o) for o in data.get("outputs", [])],
            data.get("oracle_error", ""),
            list(data.get("tolerances", [])),
        )


#: How much looser than the tightest passing tolerance a suggested ``--tol`` is.
SAFETY_FACTOR = 2.0


def tolerance_lines(
    failures: Sequence[Any], budget: Budget | None = None, safety: float = SAFETY_FACTOR
) -> list[str]:
    """``--tol`` lines (``PATH=RTOL,ATOL``) that pass each output that failed its tolerance.

    Each keeps the output's ``rtol`` and loosens ``atol`` to ``safety`` times the tightest passing
    one (or keeps ``atol`` and loosens ``rtol`` when that is the smaller change). An output whose R is
    beyond budget is listed as a comment: a tolerance would hide a real difference. So is an
    integer or boolean output (an index, a count, a flag): its dtype has no rounding, so any
    difference is a changed value (an int64 that wrapped, an argmax that flipped), which a
    tolerance would hide.
    """
    lines = []
    for diff in failures:
        rtol, atol = diff.tolerance.rtol, diff.tolerance.atol
        options = []
        if diff.tight_atol is not None:
            options.append((rtol, diff.tight_atol * safety))
        if diff.tight_rtol is not None:
            options.append((diff.tight_rtol * safety, atol))
        if not options:
            continue
        new_rtol, new_atol = min(
            options, key=lambda pair: pair[0] / max(rtol, 1e-300) + pair[1] / max(atol, 1e-300)
        )
        line = f"--tol {_quoted(f'{diff.path}={new_rtol:.1e},{new_atol:.1e}')}"
        measured = budget.get(diff.path) if budget is not None else None
        if measured is not None and not measured.within:
            line = f"# {line}  (R {measured.factor}: beyond budget, a tolerance would hide it)"
        elif _exact_dtype(diff.ref_dtype) and _exact_dtype(diff.target_dtype):
            line = (
                f"# {line}  (integer values that changed, not rounding: a tolerance would hide it)"
            )
        lines.append(line)
    return lines


def _quoted(value: str) -> str:
    """``value`` quoted for a shell and for the magic's line alike (which keeps quotes whole).

    Single quotes, or double quotes for a path holding one (``opt.state[0]['exp_avg']``, which a
    shell would otherwise split); ``shlex.quote`` where neither is safe.
    """
    if "'" not in value:
        return f"'{value}'"
    if not any(ch in value for ch in '"$`\\!'):
        return f'"{value}"'
    return shlex.quote(value)


def _exact_dtype(name: str | None) -> bool:
    """Whether ``name`` is an integer or boolean dtype (``int64``, ``bool``): one with no rounding."""
    dtype = dtype_named(name)
    return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)


# ---------------------------------------------------------------------------------------------
# Measuring


def _float_leaf(value: Any) -> torch.Tensor | None:
    if type(value).__module__ == "numpy":
        # A NumPy array or scalar (``probs = p.cpu().numpy()``) is a floating output as the
        # comparison reads it: left out, a bug within its loosened tolerance passed the judge.
        # (A copy: no tensor holds an array's negative strides, ``a[::-1]``, or shares a
        # read-only one.)
        value = torch.as_tensor(value.copy())
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        return value.detach()
    if isinstance(value, float):
        # A number made from a tensor (``loss.item()``) is exactly a value of that tensor's dtype,
        # as the tolerance judges it: its floor is that dtype's ulp, not float64's
        dtype = source_dtype(value)
        if dtype is None or not dtype.is_floating_point:
            dtype = torch.float64
        return torch.tensor(float(value), dtype=dtype)
    return None


def _distance(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Frobenius norm and largest element of ``a − b`` over elements finite in both, in float64."""
    a = a.detach().cpu().to(torch.complex128 if a.is_complex() else torch.float64)
    b = b.detach().cpu().to(a.dtype)
    diff = (a - b).abs()
    finite = torch.isfinite(a) & torch.isfinite(b)
    diff = diff[finite]
    if not diff.numel():
        return 0.0, 0.0
    return float(torch.linalg.vector_norm(diff)), float(diff.max())


#: Bins of an output's error histogram.
HISTOGRAM_BINS = 24


def _errors(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| element-wise in float64, finite elements only, flattened."""
    a = a.detach().cpu().to(torch.complex128 if a.is_complex() else torch.float64)
    diff = (a - b.detach().cpu().to(a.dtype)).abs().flatten()
    return diff[torch.isfinite(diff)]


def error_histogram(ref: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]] | None:
    """Counts of log10 |error| of the reference and the target on shared bins (None if all exact)."""
    logs = []
    for errors in (ref, target):
        logs.append(torch.log10(errors.clamp_min(torch.finfo(torch.float64).tiny)))
    nonzero = torch.cat([lg[e > 0] for lg, e in zip(logs, (ref, target), strict=True)])
    if not nonzero.numel():
        return None
    low, high = float(nonzero.min()), float(nonzero.max())
    high = max(high, low + 1e-6)
    edges = torch.linspace(low, high, HISTOGRAM_BINS + 1, dtype=torch.float64)
    counts = [torch.histc(lg.clamp(low, high), HISTOGRAM_BINS, low, high).tolist() for lg in logs]
    return {"edges": edges.tolist(), "ref": counts[0], "target": counts[1]}


def _target_distance(
    ref: torch.Tensor, target: torch.Tensor, oracle: torch.Tensor
) -> tuple[float, float]:
    """The target's distance to the oracle; infinite where its NaN/Inf are not the ref's.

    Distances count finite elements only, so a NaN the reference does not have must not vanish,
    nor an infinity of the other sign, or a NaN where the reference has an infinity (a mask filled
    with ``inf`` where the reference fills ``-inf``): each is a changed value, not rounding.
    """
    if not torch.equal(_non_finite(ref), _non_finite(target)):
        return math.inf, math.inf
    return _distance(target, oracle)


def _ulp_floor(value: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """One unit in the last place of each element of ``value`` in ``dtype`` (norm and largest).

    A result stored in ``dtype`` is at best within half an ulp of the true value and, for most
    ops, within one (faithful rounding). With the floor at one ulp, a target within one ulp of
    the reference has ``R <= (e_ref + ulp) / max(e_ref, ulp) <= 2``: a one-ulp difference is never
    beyond budget, however exact the reference happens to be.
    """
    if value.is_complex() or dtype.is_complex:
        value = value.abs()
        dtype = torch.float64 if dtype in (torch.complex128, torch.float64) else torch.float32
    if not dtype.is_floating_point:
        return 0.0, 0.0
    ulp = ulps(value, dtype)
    ulp = ulp[torch.isfinite(ulp)]
    if not ulp.numel():
        return 0.0, 0.0
    return float(torch.linalg.vector_norm(ulp)), float(ulp.max())


def _non_finite(value: torch.Tensor) -> torch.Tensor:
    """Where ``value`` is NaN (first row: 1) and where it is +Inf or -Inf (second row: 1, -1).

    Read as the comparison reads it (float8 and complex32 widened: no isfinite kernel; a complex
    value's parts each); two results have their NaN and Inf in the same places, with the same
    signs, exactly when these are equal.
    """
    value = with_cpu_kernels(value.detach().cpu())
    if value.is_complex():
        value = torch.view_as_real(value)
    nan = torch.isnan(value)
    sign = torch.where(torch.isinf(value), torch.sign(value), torch.zeros_like(value))
    return torch.stack([nan.to(torch.int8), sign.to(torch.int8)])


def ulps(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of each element of ``|value|`` stored in ``dtype``, in float64."""
    stored = value.detach().cpu().abs().to(dtype)
    if dtype.itemsize == 1:
        # float8 has no nextafter kernel: its spacing is eps at its exponent, subnormals' that of
        # the smallest normal number
        info = torch.finfo(dtype)
        exponent = torch.floor(torch.log2(stored.double()))
        return info.eps * torch.exp2(exponent.clamp_min(math.log2(info.smallest_normal)))
    return (torch.nextafter(stored, torch.full_like(stored, math.inf)) - stored).double()


def error_ratio(error: float, floor: float, least: float = 0.0) -> float:
    """``R``: the target's error over the floor, both at least ``least`` (the dtype's ulp).

    An exact target is 0 (1 when the reference is exact too), whatever the floor.
    """
    if error == 0.0:
        return 1.0 if floor == 0.0 else 0.0
    error, floor = max(error, least), max(floor, least)
    return error / floor if floor > 0.0 else math.inf


def _output_budget(
    path: str,
    source: str,
    floor: tuple[float, float],
    error: tuple[float, float],
    note: str = "",
    least: tuple[float, float] = (0.0, 0.0),
) -> OutputBudget:
    # Neither run can be closer than the dtype's rounding: both errors count from one ulp up.
    ratio = error_ratio(error[0], floor[0], least[0])
    floor = (max(floor[0], least[0]), max(floor[1], least[1]))
    band = classify(ratio)
    return OutputBudget(
        path, source, floor[0], floor[1], error[0], error[1], ratio, band.label, band.within, note
    )


def _unpromoted(ref: torch.Tensor, oracle: Any) -> str:
    """Why ``oracle`` cannot serve as the float64 value of ``ref`` ("" when it can)."""
    leaf = _float_leaf(oracle)
    if leaf is None:
        return "the oracle run did not produce it as a floating value"
    if leaf.shape != ref.shape:
        return f"the oracle run gave shape {list(leaf.shape)}"
    if leaf.dtype not in (torch.float64, torch.complex128):
        return f"not promoted (the oracle computed it in {str(leaf.dtype).removeprefix('torch.')})"
    return ""


def measure_budget(
    spec: RunSpec,
    backend: Any,
    ref: Run,
    target: Run,
    paths: Sequence[str] | None = None,
    *,
    user_modules: Sequence[str] = ("__main__",),
    oracle: OracleRuns | None = None,
) -> Budget:
    """Rerun the cell as the float64 oracle and measure each floating output's floor and ``R``.

    Parameters
    ----------
    spec : RunSpec
        The spec both runs ran from, before anything was committed (the namespace as it was).
    backend : Backend
        The reference backend (the oracle runs on its path).
    ref, target : Run
        The finished runs.
    paths : sequence of str, optional
        Output leaves to measure (the failing ones); all floating outputs when None.
    user_modules : sequence of str
        As for :func:`~neuron_workbench.compare.flatten.iter_leaves`.
    oracle : OracleRuns, optional
        Reruns already made for this cell (filled in here when empty).

    Returns
    -------
    Budget
        One :class:`OutputBudget` per floating output leaf present in both runs with one shape.
    """
    ref_leaves = dict(iter_leaves(ref.outputs, user_modules=user_modules))
    target_leaves = dict(iter_leaves(target.outputs, user_modules=user_modules))
    wanted: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for path, value in ref_leaves.items():
        if paths is not None and path not in paths:
            continue
        a, b = _float_leaf(value), _float_leaf(target_leaves.get(path))
        if a is not None and b is not None and a.shape == b.shape:
            wanted[path] = (a, b)
    budget = Budget()
    if not wanted:
        return budget
    runs = oracle if oracle is not None else OracleRuns()
    if runs.oracle is None:
        runs.oracle = rerun(spec, backend, oracle_instrument(spec))
    oracle_run = runs.oracle
    oracle_leaves: dict[str, Any] = {}
    if oracle_run.ok:
        oracle_run.outputs.update(
            {k: v for k, v in oracle_run.bindings.items() if k not in oracle_run.outputs}
        )
        oracle_leaves = dict(iter_leaves(oracle_run.outputs, user_modules=user_modules))
    else:
        assert oracle_run.error is not None
        budget.oracle_error = f"the float64 oracle run raised {oracle_run.error.summary}"
    fallback: dict[str, str] = {}
    for path, (a, b) in wanted.items():
        why = _unpromoted(a, oracle_leaves.get(path)) if oracle_run.ok else budget.oracle_error
        if why:
            fallback[path] = why
            continue
        oracle = _float_leaf(oracle_leaves[path])
        assert oracle is not None
        measured_output = against_oracle(path, a, b, oracle)
        measured_output.histogram = error_histogram(_errors(a, oracle), _errors(b, oracle))
        budget.outputs.append(measured_output)
    if fallback:
        if runs.rounding is None:
            runs.rounding = [
                rerun(spec, backend, rounding_instrument(sample))
                for sample in range(ROUNDING_SAMPLES)
            ]
        budget.outputs.extend(_rounding_budgets(runs.rounding, wanted, fallback, user_modules))
        order = list(wanted)
        budget.outputs.sort(key=lambda o: order.index(o.path))
    return budget


def against_oracle(
    path: str, ref: torch.Tensor, target: torch.Tensor, oracle: torch.Tensor
) -> OutputBudget:
    """``R`` of one value: the target's distance to its float64 ``oracle`` over the reference's.

    Both distances count from one ulp of ``ref``'s dtype (see :func:`_ulp_floor`).
    """
    least = _ulp_floor(oracle, ref.dtype)
    return _output_budget(
        path, ORACLE, _distance(ref, oracle), _target_distance(ref, target, oracle), least=least
    )


def _rounding_budgets(
    reruns: Sequence[Run],
    wanted: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    fallback: Mapping[str, str],
    user_modules: Sequence[str],
) -> list[OutputBudget]:
    """Floors from random-rounding reruns of the reference, for outputs the oracle could not give."""
    norms: dict[str, list[float]] = {path: [] for path in fallback}
    worst: dict[str, float] = dict.fromkeys(fallback, 0.0)
    first: dict[str, torch.Tensor] = {}
    for run in reruns:
        if not run.ok:
            continue
        run.outputs.update({k: v for k, v in run.bindings.items() if k not in run.outputs})
        leaves = dict(iter_leaves(run.outputs, user_modules=user_modules))
        for path in fallback:
            moved = _float_leaf(leaves.get(path))
            if moved is None or moved.shape != wanted[path][0].shape:
                continue
            norm, top = _distance(wanted[path][0], moved)
            first.setdefault(path, moved)
            norms[path].append(norm)
            worst[path] = max(worst[path], top)
    budgets = []
    for path, why in fallback.items():
        if not norms[path]:
            continue  # no floor at all: the output keeps its tolerance verdict only
        floor = (math.sqrt(sum(n * n for n in norms[path]) / len(norms[path])), worst[path])
        ref, target = wanted[path]
        error = _target_distance(ref, target, ref)
        least = _ulp_floor(ref, ref.dtype)
        measured = _output_budget(path, RANDOM_ROUNDING, floor, error, note=why, least=least)
        measured.histogram = error_histogram(_errors(ref, first[path]), _errors(target, ref))
        budgets.append(measured)
    return budgets

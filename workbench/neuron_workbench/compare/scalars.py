"""Two runs' observed scalars, aligned by call site and occurrence: where the curves part.

Each call site's sequence on the reference is compared with the same site's on the target, value
by value (the ``n``-th ``loss.item()`` at ``train.py:88`` with the target's ``n``-th), with the
tolerance of the tensor's dtype (``torch.testing.assert_close``'s table, or the run's ``rtol`` and
``atol``). Where they part first is the earliest mismatch in the reference's order of events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_workbench.compare.tolerances import Tolerance, TolerancePolicy, dtype_named
from neuron_workbench.run.records import recorded
from neuron_workbench.run.scalars import ScalarSeries, ScalarTrace

__all__ = [
    "ScalarComparison",
    "ScalarDivergence",
    "SiteComparison",
    "compare_scalars",
    "max_steps_note",
    "scalar_budget",
]


@dataclass
class ScalarDivergence:
    """The first place two runs' scalars part: call site, occurrence (1-based), both values."""

    site: str
    occurrence: int
    ref: Any
    target: Any
    hints: list[str] = field(default_factory=list)
    #: The float64 oracle's value there and the error ratio ``R`` (the target's error against it
    #: over the reference's), when the precision budget's oracle ran for this cell anyway.
    oracle: float | None = None
    ratio: float | None = None
    budget_label: str = ""

    def budget_line(self) -> str:
        """``R 41 (less accurate) against the float64 oracle`` or empty when not measured."""
        if self.ratio is None:
            return ""
        factor = "inf" if math.isinf(self.ratio) else f"{self.ratio:.3g}"
        return f"R {factor} ({self.budget_label}) against the float64 oracle {self.oracle:.8g}"

    def headline(self) -> str:
        """``train.py:88 #3: 2.30125 vs 2.30561`` (a missing value reads ``none``)."""
        ref, target = _told_apart(self.ref, self.target)
        return f"{self.site} #{self.occurrence}: {ref} vs {target}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "site": self.site,
            "occurrence": self.occurrence,
            "ref": _json(self.ref),
            "target": _json(self.target),
            "hints": list(self.hints),
            "oracle": _json(self.oracle),
            "ratio": _json(self.ratio),
            "budget": self.budget_label or None,
        }


@dataclass
class SiteComparison:
    """One call site's two sequences and how they compare.

    ``abs_diff`` holds ``|target - ref|`` per aligned occurrence (None where either is not a
    finite number); ``parts_at`` is the first occurrence (1-based) outside tolerance (under the
    budget judge: beyond budget) or missing on one side, None when the sequences match.
    """

    site: str
    how: str
    dtype: str | None
    tolerance: Tolerance
    ref: list[Any]
    target: list[Any]
    ref_count: int
    target_count: int
    abs_diff: list[float | None]
    parts_at: int | None = None
    max_abs: float = 0.0
    #: Occurrences outside tolerance that the budget judge passed (their R within budget).
    within_budget: int = 0

    @property
    def matched(self) -> bool:
        """True when every aligned occurrence is within tolerance (or budget) and the counts agree."""
        return self.parts_at is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "site": self.site,
            "how": self.how,
            "dtype": self.dtype,
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "ref": [_json(v) for v in self.ref],
            "target": [_json(v) for v in self.target],
            "ref_count": self.ref_count,
            "target_count": self.target_count,
            "abs_diff": [_json(v) for v in self.abs_diff],
            "parts_at": self.parts_at,
            "max_abs": _json(self.max_abs),
            "matched": self.matched,
            "within_budget": self.within_budget,
        }


@dataclass
class ScalarComparison:
    """Every call site's comparison, and the first divergence (None when all match)."""

    sites: list[SiteComparison]
    first: ScalarDivergence | None = None
    #: Sites only one run reached.
    only_ref: list[str] = field(default_factory=list)
    only_target: list[str] = field(default_factory=list)
    stopped_at: int | None = None

    @property
    def parted(self) -> bool:
        """True when the runs' scalars part somewhere."""
        return self.first is not None

    def summary(self) -> str:
        """``2 scalar sites match`` or ``scalars part at train.py:88 #3: 2.30 vs 2.31``."""
        if self.first is None:
            count = len(self.sites)
            line = f"{count} scalar site{'s' if count != 1 else ''} match"
            within = sum(site.within_budget for site in self.sites)
            if within:
                line += f" ({within} value{'s' if within != 1 else ''} within precision budget)"
            return line
        return f"scalars part at {self.first.headline()}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "sites": [s.to_dict() for s in self.sites],
            "first": self.first.to_dict() if self.first is not None else None,
            "only_ref": list(self.only_ref),
            "only_target": list(self.only_target),
            "max_steps": self.stopped_at,
            "summary": self.summary(),
        }


def _json(value: Any) -> Any:
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _told_apart(ref: Any, target: Any) -> tuple[str, str]:
    """Both values shown, with as many digits beyond six as it takes to show that they differ.

    Where the runs part, a float64 loss computed as float32 parts in its eighth digit: at six,
    the line read ``15.49 vs 15.49``.
    """
    if isinstance(ref, float) and isinstance(target, float) and ref != target:
        for digits in range(6, 18):
            shown = f"{ref:.{digits}g}", f"{target:.{digits}g}"
            if shown[0] != shown[1]:
                if digits > 6:  # both to the digit that differs: 15.489961 vs 15.489960
                    shown = f"{ref:#.{digits}g}", f"{target:#.{digits}g}"
                return shown
    return _shown(ref), _shown(target)


def _numbers(value: Any) -> list[float]:
    return [float(v) for v in value] if isinstance(value, list) else [float(value)]


def _differs(a: Any, b: Any, tolerance: Tolerance) -> tuple[bool, float | None]:
    """Whether two occurrences differ beyond ``tolerance``; and ``|b - a|`` (its largest)."""
    xs, ys = _numbers(a), _numbers(b)
    if len(xs) != len(ys):
        return True, None
    worst: float | None = 0.0
    differs = False
    for x, y in zip(xs, ys, strict=True):
        if math.isnan(x) or math.isnan(y):
            differs = differs or math.isnan(x) != math.isnan(y)
            worst = None
            continue
        if math.isinf(x) or math.isinf(y):
            differs = differs or x != y
            worst = None
            continue
        delta = abs(y - x)
        if delta > tolerance.allowed(abs(x)):
            differs = True
        if worst is not None:
            worst = max(worst, delta)
    return differs, worst


def _trace(value: Any) -> ScalarTrace | None:
    data = recorded(value)
    if isinstance(data, dict):
        try:
            return ScalarTrace.from_dict(data)
        except (KeyError, TypeError, ValueError, OverflowError):  # not compared (see below)
            return None
    return data if isinstance(data, ScalarTrace) else None


def recorded_trace(value: Any) -> ScalarTrace | None:
    """A run's recorded ``scalars`` (live, or as an artifact holds them) as a trace.

    Parameters
    ----------
    value : ScalarTrace, dict or None
        The run's ``scalars`` extra.

    Returns
    -------
    ScalarTrace or None
        None when the run recorded none, or the data cannot be read.
    """
    return _trace(value)


def unreadable_trace(value: Any) -> str | None:
    """Why a run's recorded ``scalars`` cannot be compared (a damaged artifact's), else None."""
    data = recorded(value)
    if not isinstance(data, dict):
        return None if data is None or isinstance(data, ScalarTrace) else type(data).__name__
    try:
        ScalarTrace.from_dict(data)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _site(
    ref: ScalarSeries,
    target: ScalarSeries,
    policy: TolerancePolicy,
    oracle: ScalarSeries | None = None,
) -> tuple[SiteComparison, int | None]:
    """One site's comparison, and the reference's event order of its first mismatch.

    With the float64 oracle's series of the site (the budget judge), an occurrence of a floating
    site is judged by its ``R`` alone, as a floating output is: one outside tolerance whose ``R``
    is within budget is no mismatch (it is counted in ``within_budget``), and one within
    tolerance whose ``R`` is beyond budget is. An integer or boolean site (a count, a flag) has
    no rounding: its tolerance judges it.
    """
    from neuron_workbench.compare.budget import classify

    dtype_ref, dtype_target = dtype_named(ref.dtype), dtype_named(target.dtype or ref.dtype)
    tolerance = policy.for_output(f"scalars/{ref.site}", dtype_ref, dtype_target)
    by_budget = oracle is not None and dtype_ref is not None and dtype_ref.is_floating_point
    diffs: list[float | None] = []
    parts_at = None
    order = None
    within_budget = 0
    for index, (a, b) in enumerate(zip(ref.values, target.values, strict=False)):
        differs, delta = _differs(a, b, tolerance)
        diffs.append(delta)
        if by_budget and oracle is not None and index < len(oracle.values):
            ratio = _scalar_ratio(a, b, oracle.values[index], ref.dtype)
            if ratio is not None:
                within = classify(ratio).within
                if differs and within:
                    within_budget += 1
                differs = not within
        if differs and parts_at is None:
            parts_at, order = index + 1, ref.order[index]
    if parts_at is None and ref.count != target.count:
        shorter = min(ref.count, target.count)
        parts_at = shorter + 1
        if shorter < len(ref.order):
            order = ref.order[shorter]
        else:  # the reference ended first: after its last event
            order = (ref.order[-1] + 1) if ref.order else 0
    finite = [d for d in diffs if d is not None]
    site = SiteComparison(
        site=ref.site,
        how=ref.how,
        dtype=ref.dtype,
        tolerance=tolerance,
        ref=list(ref.values),
        target=list(target.values),
        ref_count=ref.count,
        target_count=target.count,
        abs_diff=diffs,
        parts_at=parts_at,
        max_abs=max(finite) if finite else 0.0,
        within_budget=within_budget,
    )
    return site, order


def _value_at(values: list[Any], occurrence: int) -> Any:
    return values[occurrence - 1] if occurrence <= len(values) else None


def compare_scalars(
    ref_trace: Any,
    target_trace: Any,
    policy: TolerancePolicy | None = None,
    *,
    oracle_trace: Any = None,
) -> ScalarComparison | None:
    """Align two runs' scalars by call site and occurrence and compare them.

    Parameters
    ----------
    ref_trace, target_trace : ScalarTrace or dict
        What each run's ``scalars`` instrument recorded (live, or from JSON).
    policy : TolerancePolicy, optional
        The comparison's tolerances (a site is judged as an output ``scalars/<site>``).
    oracle_trace : ScalarTrace or dict, optional
        The budget judge's float64 oracle run's scalars: a floating value parts the runs where
        its error ratio ``R`` is beyond budget, whatever its tolerance, as a float output is
        judged.

    Returns
    -------
    ScalarComparison or None
        None when either run recorded nothing (or no trace).
    """
    ref, target = _trace(ref_trace), _trace(target_trace)
    if ref is None or target is None or not (ref.series or target.series):
        return None
    policy = policy or TolerancePolicy()
    oracle = _trace(oracle_trace) if oracle_trace is not None else None
    sites: list[SiteComparison] = []
    first: tuple[int, SiteComparison] | None = None
    for name, series in ref.series.items():
        other = target.series.get(name)
        if other is None:
            continue
        site, order = _site(series, other, policy, oracle.series.get(name) if oracle else None)
        sites.append(site)
        if order is not None and (first is None or order < first[0]):
            first = (order, site)
    only_ref = [name for name in ref.series if name not in target.series]
    only_target = [name for name in target.series if name not in ref.series]
    divergence = None
    if first is not None:
        site = first[1]
        assert site.parts_at is not None
        divergence = ScalarDivergence(
            site.site,
            site.parts_at,
            _value_at(site.ref, site.parts_at),
            _value_at(site.target, site.parts_at),
        )
    elif only_ref or only_target:
        name = (only_ref or only_target)[0]
        series = (ref.series if only_ref else target.series)[name]
        value = series.values[0] if series.values else None
        divergence = ScalarDivergence(
            name, 1, value if only_ref else None, None if only_ref else value
        )
    return ScalarComparison(
        sites=sites,
        first=divergence,
        only_ref=only_ref,
        only_target=only_target,
        # a limit the loop never reached stopped nothing: the report must not say it did
        stopped_at=ref.max_steps if ref.stopped or target.stopped else None,
    )


def max_steps_note(ref_trace: Any, target_trace: Any) -> str | None:
    """Why ``--max-steps N`` stopped neither run, or None (no limit, or a run stopped).

    A step is counted by the first call site that materialises a scalar from a tensor: a loop
    that makes none (no ``loss.item()``, no ``print(f"{loss:.4f}")``), or fewer than ``N``,
    runs to its end, which the user asked to cut short.

    Parameters
    ----------
    ref_trace, target_trace : ScalarTrace or dict
        What each run's ``scalars`` instrument recorded (live, or from JSON).

    Returns
    -------
    str or None
        The report's note.
    """
    ref, target = _trace(ref_trace), _trace(target_trace)
    if ref is None or target is None or ref.max_steps is None or ref.stopped or target.stopped:
        return None
    limit = f"--max-steps {ref.max_steps} did not stop the runs"
    first = next(iter(ref.series.values()), None)
    if first is None:
        return (
            f"{limit}: the cell made no scalar from a tensor (loss.item(), "
            'print(f"{loss:.4f}")), which is what counts a step, so both ran to their end'
        )
    return (
        f"{limit}: its first scalar's call site ({first.site}) made {first.count}, "
        f"fewer than {ref.max_steps}, so both ran to their end"
    )


def _scalar_ratio(ref: Any, target: Any, oracle: Any, dtype: str | None) -> float | None:
    """``R`` of one occurrence against the oracle's value; None unless all three are finite.

    A ``.tolist()``'s numbers are one value, as an output's elements are (Frobenius norms); the
    three must be as long.
    """
    from neuron_workbench.compare.budget import error_ratio, ulps

    values = [value if isinstance(value, list) else [value] for value in (ref, target, oracle)]
    if len({len(v) for v in values}) != 1 or not all(
        isinstance(n, int | float) and math.isfinite(n) for v in values for n in v
    ):
        return None
    ref_t, target_t, oracle_t = (torch.tensor(v, dtype=torch.float64) for v in values)
    torch_dtype = dtype_named(dtype)
    # neither run is promised closer than one ulp of its dtype: a float64 loss that the reference
    # got exactly was "R inf" for any target error
    least = 0.0
    if torch_dtype is not None and torch_dtype.is_floating_point:
        least = float(torch.linalg.vector_norm(ulps(oracle_t, torch_dtype)))
    return error_ratio(
        float(torch.linalg.vector_norm(target_t - oracle_t)),
        float(torch.linalg.vector_norm(ref_t - oracle_t)),
        least,
    )


def scalar_budget(divergence: ScalarDivergence, dtype: str | None, oracle_trace: Any) -> None:
    """Give ``divergence`` its error ratio ``R`` against a float64 oracle run's scalars, in place.

    ``R = |target - oracle| / |ref - oracle|``, both counted from one ulp of ``dtype`` up, as the
    budget of an output counts them (:func:`~neuron_workbench.compare.budget.error_ratio`), and
    banded as outputs are. Nothing when the oracle did not reach that occurrence or a value is not
    a finite number.
    """
    from neuron_workbench.compare.budget import classify

    trace = _trace(oracle_trace)
    series = trace.series.get(divergence.site) if trace is not None else None
    if series is None or divergence.occurrence > len(series.values):
        return
    oracle = series.values[divergence.occurrence - 1]
    ratio = _scalar_ratio(divergence.ref, divergence.target, oracle, dtype)
    if ratio is None or isinstance(oracle, list):  # (a .tolist() is judged, not shown)
        return
    divergence.oracle, divergence.ratio = float(oracle), ratio
    divergence.budget_label = classify(ratio).label

"""Compare two runs' outputs leaf by leaf, collecting every difference as data."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import torch

from neuron_workbench.compare.flatten import USER_MODULES, FlattenedOutputs, iter_leaves
from neuron_workbench.compare.metrics import tensor_stats
from neuron_workbench.compare.tolerances import (
    EXACT,
    PYTHON_FLOAT_DTYPE,
    Tolerance,
    TolerancePolicy,
)
from neuron_workbench.run.measurements import (
    is_measurement,
    provenance_of,
    source_dtype,
)
from neuron_workbench.run.namespace import UNUSABLE_DEVICE_TYPE
from neuron_workbench.run.records import NotCompared

#: Status of an output that could not be compared (a :class:`NotCompared` marker on either side).
NOT_COMPARED = "not-compared"
#: Every status an output can have. ``match`` passes; :data:`NOT_COMPARED` neither passes nor
#: fails; every other status is a failure.
STATUSES = ("match", "differ", "shape", "dtype", "missing", "nan-mismatch", "error", NOT_COMPARED)
#: Longest reason a :data:`NOT_COMPARED` headline quotes (the full one is in ``detail``).
_HEADLINE_REASON = 160


@dataclass
class OutputDiff:
    """How one output leaf compares between the reference and the target run.

    Attributes
    ----------
    path : str
        Where the leaf lives, e.g. ``out['logits'][0]`` or ``model.fc.weight.grad``.
    status : str
        One of :data:`STATUSES`.
    kind : str
        ``tensor``, ``number``, ``text`` or ``none``.
    tolerance : Tolerance
        The ``rtol``/``atol`` the output was judged with.
    max_abs, mean_abs, max_rel, rmse : float or None
        Error statistics over elements finite on both sides.
    cosine, snr_db : float or None
        Cosine similarity of the two tensors, and the reference's signal-to-error ratio in dB.
    mismatched, numel : int
        Elements outside tolerance, and elements compared.
    nan_mismatches, inf_mismatches : int
        Elements whose NaN or infinity placement (or sign) differs.
    worst_index : tuple of int or None
        The element that exceeds its allowed difference the most (or the largest difference).
    worst_ref, worst_target, allowed_at_worst : float or None
        The two values there, and ``atol + rtol * |ref|`` there.
    tight_rtol, tight_atol : float or None
        The smallest ``atol`` that passes with this ``rtol``, and the smallest ``rtol`` that passes
        with this ``atol``; ``None`` when no tolerance can pass.
    detail : str
        One line explaining a non-numeric status (shapes, dtypes, a missing output), or for
        ``not-compared`` which side could not be compared and why (``target: could not be sent
        back from the neuron worker process (...)``).
    hints : list of str
        Likely causes of the difference, from what is known about the two runs.
    explained : str
        Why a ``differ`` output does not fail the verdict, with its evidence (an Adam step's
        amplification of gradients that matched; ``report/hints.py``); empty otherwise.
    """

    path: str
    status: str
    kind: str
    tolerance: Tolerance
    ref_dtype: str | None = None
    target_dtype: str | None = None
    ref_shape: tuple[int, ...] | None = None
    target_shape: tuple[int, ...] | None = None
    numel: int = 0
    mismatched: int = 0
    nan_mismatches: int = 0
    inf_mismatches: int = 0
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    rmse: float | None = None
    cosine: float | None = None
    snr_db: float | None = None
    worst_index: tuple[int, ...] | None = None
    worst_ref: float | None = None
    worst_target: float | None = None
    allowed_at_worst: float | None = None
    tight_rtol: float | None = None
    tight_atol: float | None = None
    detail: str = ""
    hints: list[str] = field(default_factory=list)
    explained: str = ""

    @property
    def passed(self) -> bool:
        """True when the status is ``match`` (a ``not-compared`` output has not passed)."""
        return self.status == "match"

    @property
    def compared(self) -> bool:
        """False exactly for a ``not-compared`` output: its value is unknown on one side."""
        return self.status != NOT_COMPARED

    @property
    def failed(self) -> bool:
        """True when the output was compared and did not match."""
        return self.compared and not self.passed

    @property
    def mismatch_pct(self) -> float:
        """Mismatched elements as a percentage of the compared ones."""
        return 100.0 * self.mismatched / self.numel if self.numel else 0.0

    def headline(self) -> str:
        """A short, deterministic description of why this output failed or was not compared.

        Empty when it passed; ``mod (target: could not be sent back ...)`` when not compared (the
        reason cut to 160 characters).
        """
        if self.passed:
            return ""
        if self.status == NOT_COMPARED:
            why = self.detail or "not compared"
            if len(why) > _HEADLINE_REASON:
                why = why[: _HEADLINE_REASON - 1].rstrip() + "…"
            return f"{self.path} ({why})"
        if self.status == "nan-mismatch":
            count = self.nan_mismatches + self.inf_mismatches
            return f"{self.path} NaN/Inf placement differs ({count} element{'' if count == 1 else 's'})"
        if self.status == "differ" and self.max_abs is not None:
            allowed = self.allowed_at_worst if self.allowed_at_worst is not None else 0.0
            if self.detail and not (math.isfinite(self.max_abs) and math.isfinite(allowed)):
                return f"{self.path} {self.detail}"  # Python ints beyond a float: exact digits
            if self.worst_ref is None or self.worst_target is None:
                return f"{self.path} max|Δ| {self.max_abs:.1e} > {allowed:.1e}"
            worst = abs(self.worst_target - self.worst_ref)
            # inf - inf: two Python ints too large for a float (their exact |Δ| is max_abs); one
            # element (a number) is its own worst, whose floats may round alike (a checksum
            # 10**29 off by 2**32), where max_abs is its exact |Δ|
            if (
                self.numel == 1
                or not math.isfinite(worst)
                or math.isclose(worst, self.max_abs, rel_tol=1e-9, abs_tol=0.0)
            ):
                return f"{self.path} max|Δ| {self.max_abs:.1e} > {allowed:.1e}"
            # The element furthest outside its tolerance is not the one with the largest |Δ|.
            at = list(self.worst_index or ())
            return (
                f"{self.path} |Δ| {worst:.1e} > {allowed:.1e} at {at} (max|Δ| {self.max_abs:.1e})"
            )
        return f"{self.path} {self.detail or self.status}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        finite = _finite_or_none
        data = {
            "path": self.path,
            "status": self.status,
            "kind": self.kind,
            "rtol": self.tolerance.rtol,
            "atol": self.tolerance.atol,
            "ref_dtype": self.ref_dtype,
            "target_dtype": self.target_dtype,
            "ref_shape": list(self.ref_shape) if self.ref_shape is not None else None,
            "target_shape": list(self.target_shape) if self.target_shape is not None else None,
            "numel": self.numel,
            "mismatched": self.mismatched,
            "mismatch_pct": self.mismatch_pct,
            "nan_mismatches": self.nan_mismatches,
            "inf_mismatches": self.inf_mismatches,
            "max_abs": finite(self.max_abs),
            "mean_abs": finite(self.mean_abs),
            "max_rel": finite(self.max_rel),
            "rmse": finite(self.rmse),
            "cosine": finite(self.cosine),
            "snr_db": finite(self.snr_db),
            "worst_ref": finite(self.worst_ref),
            "worst_target": finite(self.worst_target),
            "allowed_at_worst": finite(self.allowed_at_worst),
            "tight_rtol": finite(self.tight_rtol),
            "tight_atol": finite(self.tight_atol),
            "worst_index": list(self.worst_index) if self.worst_index is not None else None,
            "detail": self.detail,
            "hints": list(self.hints),
        }
        if self.explained:
            data["explained"] = self.explained
        return data


def _finite_or_none(value: float | None) -> float | str | None:
    # JSON has no NaN/Inf; keep them readable instead of producing invalid JSON.
    if value is None or math.isfinite(value):
        return value
    return str(value)


@dataclass(frozen=True)
class Measurement:
    """An output that came from a timer, a memory statistic or a device property: shown, not diffed.

    Recognised by where its value came from (:mod:`neuron_workbench.run.measurements`), also when
    derived by arithmetic (``(t1 - t0) * 1e3``) or held in a list or dict.

    Attributes
    ----------
    path : str
        Where the output lives (``step_ms``, ``stats['peak']``).
    kind : str
        ``time``, ``memory`` or ``device``.
    source : str
        The call it came from (``torch.cuda.max_memory_allocated``).
    unit : str or None
        ``ms``, ``MiB``... where known.
    ref, target : float, int, str or None
        Each run's value (None where that run has no such output).
    """

    path: str
    kind: str
    source: str
    unit: str | None
    ref: Any
    target: Any

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (plain numbers and strings)."""
        return {
            "path": self.path,
            "kind": self.kind,
            "source": self.source,
            "unit": self.unit,
            "ref": _plain_value(self.ref),
            "target": _plain_value(self.target),
        }


def _plain_value(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return _finite_or_none(float(value))
    if isinstance(value, int):
        return int(value)
    return str(value)


def _measurement(path: str, ref: Any, target: Any) -> Measurement:
    prov = provenance_of(ref) if is_measurement(ref) else provenance_of(target)
    assert prov is not None
    other = provenance_of(target) if prov is provenance_of(ref) else provenance_of(ref)
    # Each side names its own source; the unit is shown only where both runs agree on it.
    unit = prov.unit if other is None or other.unit == prov.unit else None
    return Measurement(path, prov.kind, prov.source, unit, ref, target)


@dataclass
class Comparison:
    """Every output's :class:`OutputDiff`, in output order.

    Each output is exactly one of: matched (``passed``), failed (in :attr:`failures`), or not
    compared (in :attr:`not_compared`). Outputs that were not compared do not fail the comparison,
    and do not count as matches either: :attr:`passed` is about the :attr:`compared` outputs only,
    so it is also True when nothing was compared; whether anything was is for the caller to judge
    (a report's verdict is then ``UNCOMPARED``, never ``PASS``).
    """

    diffs: list[OutputDiff] = field(default_factory=list)
    #: Outputs that are measurements (timings, memory, device properties): never in the verdict.
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every compared output matched (``not-compared`` outputs are ignored)."""
        return not self.failures

    # A report reads these several times over its hundreds of outputs: by status, as
    # OutputDiff.compared and .failed decide, without a property call per output.

    @property
    def compared(self) -> list[OutputDiff]:
        """The outputs that were compared (matched or failed)."""
        return [d for d in self.diffs if d.status != NOT_COMPARED]

    @property
    def failures(self) -> list[OutputDiff]:
        """The compared outputs that did not match."""
        return [d for d in self.diffs if d.status != "match" and d.status != NOT_COMPARED]

    @property
    def not_compared(self) -> list[OutputDiff]:
        """The outputs with status ``not-compared``."""
        return [d for d in self.diffs if d.status == NOT_COMPARED]

    def counts(self) -> dict[str, int]:
        """Number of outputs per status, ``not-compared`` included (only statuses that occur)."""
        counts: dict[str, int] = {}
        for diff in self.diffs:
            counts[diff.status] = counts.get(diff.status, 0) + 1
        return counts


def compare_outputs(
    ref: Mapping[str, Any],
    target: Mapping[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    policy: TolerancePolicy | None = None,
    user_modules: Collection[str] = USER_MODULES,
    devices: tuple[str, str] | None = None,
    temp_names: tuple[Sequence[str], Sequence[str]] | None = None,
    measured_texts: tuple[Mapping[str, Sequence[str]], Mapping[str, Sequence[str]]] | None = None,
    measured_values: tuple[Mapping[float, Sequence[str]], Mapping[float, Sequence[str]]]
    | None = None,
    ref_flattened: FlattenedOutputs | None = None,
) -> Comparison:
    """Compare the named outputs of two runs.

    Parameters
    ----------
    ref, target : mapping of str to object
        Output name to value (tensors, modules, containers, numbers, strings, instances of
        notebook classes, :class:`NotCompared` markers) for each run.
    rtol, atol : float, optional
        One tolerance pair for every output (both or neither); shorthand for a policy.
    policy : TolerancePolicy, optional
        Preset and per-output overrides; ``rtol``/``atol`` must not be given with it.
    user_modules : collection of str, optional
        ``__module__`` of the classes whose instances are compared through their attributes
        (see :func:`~neuron_workbench.compare.flatten.iter_leaves`).
    devices : tuple of (str, str), optional
        The device each run's tensors lived on (``cpu`` or ``cuda:0``, ``neuron:0``): the cell's
        ``cuda`` on each side. Two strings that are one text but for naming each run's own device
        match (``str(x.device)``, ``x.device.type``, ``f"on {x.device}"``), as the same value seen
        by each run; names are whole tokens. Likewise a path only the reference has and one only
        the target has that are one path but for such a name (``d['cpu']``, ``d['neuron:0']``
        from ``d[str(x.device)]``) are one output, reported at the reference's path, where the
        pairing is one-to-one; paths that could pair several ways stay ``missing``. Without
        ``devices``, texts and paths are compared as they are.
    temp_names : tuple of (sequence of str, sequence of str), optional
        The random names ``tempfile`` drew in each run, in order (``RunFacts.temp_names``). Two
        strings that differ only where each holds a name its own run drew at the same place in
        its order (the path of a checkpoint in a ``TemporaryDirectory`` the cell made) match: the
        same code made them.
    measured_texts : tuple of (mapping, mapping), optional
        The texts each run made of its measurements, to their measurement's ``(kind, source)``
        (``RunFacts.measured_texts``). Two strings that differ, and are one text but for such a
        text of each run's own at the same places (``f"step took {ms:.1f} ms"``), are a
        :class:`Measurement`, not a difference.
    measured_values : tuple of (mapping, mapping), optional
        The float values of each run's measurements, to their ``(kind, source)``
        (``RunFacts.measured_values``). A plain number, or an array or tensor of them (a pandas
        column of timings), that differs and holds only its own run's measured values on each side
        (``float(np.median(times))``) is a :class:`Measurement`, not a difference.
    ref_flattened : FlattenedOutputs, optional
        The reference's outputs flattened ahead (while the target ran): its leaves of each output
        still bound to the same object are used as they are. Ignored where its ``user_modules``
        are not these.

    Returns
    -------
    Comparison
        One :class:`OutputDiff` per leaf present in either run. Mismatches are data, never raised.
        A :class:`NotCompared` marker on either side gives one ``not-compared`` output at its
        path, which stands for everything the other side has under that path. A leaf that is a
        measurement on either side (a timer's, a memory statistic's or a device property's value)
        is a :class:`Measurement` instead, in ``Comparison.measurements``.
    """
    if policy is None:
        policy = TolerancePolicy(rtol=rtol, atol=atol)
    elif rtol is not None or atol is not None:
        raise ValueError("give rtol/atol or a policy, not both")
    if ref_flattened is not None and ref_flattened.user_modules == frozenset(user_modules):
        ref_leaves = dict(ref_flattened.leaves(ref))
    else:
        ref_leaves = dict(iter_leaves(ref, user_modules=user_modules))
    target_leaves = dict(iter_leaves(target, user_modules=user_modules))
    target_only = [p for p in target_leaves if p not in ref_leaves]
    # A key naming each run's device (d[str(x.device)]) is one output under two paths: the
    # target's path of each reference path that has a partner there.
    partner: dict[str, str] = {}
    if devices is not None and target_only:
        ref_only = [p for p in ref_leaves if p not in target_leaves]
        partner = _paired_by_device(ref_only, target_only, devices)
    paired = set(partner.values())
    paths = list(ref_leaves) + [p for p in target_only if p not in paired]
    markers = [
        p
        for p in paths
        if isinstance(ref_leaves.get(p), NotCompared)
        or isinstance(target_leaves.get(partner.get(p, p)), NotCompared)
    ]
    reported: set[str] = set()
    diffs = []
    measurements = []
    tolerances = _Tolerances(policy)
    measured = None
    if measured_values is not None and all(measured_values):  # (a run that measured nothing)
        measured = (_MeasuredValues(measured_values[0]), _MeasuredValues(measured_values[1]))
    for path in paths:
        marker = _covering_marker(path, markers) if markers else None
        if marker is not None:
            if marker not in reported:
                reported.add(marker)
                target_marker = partner.get(marker, marker)
                diffs.append(
                    _not_compared(marker, ref_leaves.get(marker), target_leaves.get(target_marker))
                )
            continue
        target_path = partner.get(path, path)
        ref_leaf, target_leaf = ref_leaves.get(path), target_leaves.get(target_path)
        # The common leaf, a tensor on both sides, is neither missing nor a measurement (those
        # are tagged numbers and strings): it goes straight to the comparison.
        if type(ref_leaf) not in _PLAIN_TENSORS or type(target_leaf) not in _PLAIN_TENSORS:
            if is_measurement(ref_leaf) or is_measurement(target_leaf):
                measurements.append(_measurement(path, ref_leaf, target_leaf))
                continue
            if target_path not in target_leaves or path not in ref_leaves:
                side = "target" if target_path not in target_leaves else "reference"
                diffs.append(
                    OutputDiff(path, "missing", "none", EXACT, detail=f"missing on the {side}")
                )
                continue
        diff = _compare_leaf(path, ref_leaf, target_leaf, tolerances, devices, temp_names)
        if diff.status == "differ" and diff.kind == "text" and measured_texts is not None:
            made = _made_of_measurements(ref_leaf, target_leaf, measured_texts)
            if made is not None:
                measurements.append(Measurement(path, *made, None, ref_leaf, target_leaf))
                continue
        if diff.status == "differ" and measured is not None:
            made = _measured_numbers(ref_leaf, target_leaf, measured)
            if made is not None:
                measurements.append(Measurement(path, *made, None, ref_leaf, target_leaf))
                continue
        if target_path != path:  # say where the target has it, as the path is the reference's
            diff.detail = "; ".join(filter(None, (diff.detail, f"{target_path} on the target")))
        diffs.append(diff)
    return Comparison(diffs, measurements)


def _covering_marker(path: str, markers: list[str]) -> str | None:
    """The marker path equal to ``path`` or above it (``trainer`` covers ``trainer.model.w``)."""
    for marker in markers:
        if path == marker or path.startswith((f"{marker}.", f"{marker}[")):
            return marker
    return None


def _not_compared(path: str, ref: Any, target: Any) -> OutputDiff:
    """The ``not-compared`` output at ``path``; ``detail`` names the side(s) and the reason."""
    sides = [
        (side, value.reason)
        for side, value in (("reference", ref), ("target", target))
        if isinstance(value, NotCompared)
    ]
    if len(sides) == 2 and sides[0][1] == sides[1][1]:
        detail = f"both runs: {sides[0][1]}"
    else:
        detail = "; ".join(f"{side}: {reason}" for side, reason in sides)
    return OutputDiff(path, NOT_COMPARED, "none", EXACT, detail=detail)


def compare_leaf(
    path: str,
    ref: Any,
    target: Any,
    policy: TolerancePolicy | None = None,
    *,
    devices: tuple[str, str] | None = None,
    temp_names: tuple[Sequence[str], Sequence[str]] | None = None,
) -> OutputDiff:
    """Compare one leaf pair; never raises for a value problem (it becomes status ``error``).

    A :class:`NotCompared` marker on either side gives status ``not-compared``. ``devices`` are
    the runs' devices and ``temp_names`` the names each drew from ``tempfile`` (see
    :func:`compare_outputs`).
    """
    tolerances = _Tolerances(policy or TolerancePolicy())
    return _compare_leaf(path, ref, target, tolerances, devices, temp_names)


class _Tolerances:
    """The tolerance of each output under one policy, worked out once per pair of dtypes."""

    def __init__(self, policy: TolerancePolicy) -> None:
        self.policy = policy
        self._by_dtypes: dict[tuple[torch.dtype, torch.dtype], Tolerance] = {}

    def of(self, path: str, ref_dtype: torch.dtype, target_dtype: torch.dtype) -> Tolerance:
        if self.policy.per_output:
            return self.policy.for_output(path, ref_dtype, target_dtype)
        # The same for every output of these dtypes; looked up here without hashing the policy.
        key = (ref_dtype, target_dtype)
        tolerance = self._by_dtypes.get(key)
        if tolerance is None:
            tolerance = self._by_dtypes[key] = _dtype_tolerance(self.policy, *key)
        return tolerance


@functools.lru_cache(maxsize=256)
def _dtype_tolerance(
    policy: TolerancePolicy, ref_dtype: torch.dtype, target_dtype: torch.dtype
) -> Tolerance:
    # A policy without per-output overrides decides by dtypes alone (it is frozen, so hashable).
    return policy.for_output("", ref_dtype, target_dtype)


def _compare_leaf(
    path: str,
    ref: Any,
    target: Any,
    tolerances: _Tolerances,
    devices: tuple[str, str] | None,
    temp_names: tuple[Sequence[str], Sequence[str]] | None = None,
) -> OutputDiff:
    if type(ref) in _PLAIN_TENSORS and type(target) in _PLAIN_TENSORS:
        # The common leaf (a weight, a gradient, a state tensor): no markers or scalar sources
        # to look for.
        try:
            return _compare_tensors(path, "tensor", ref, target, tolerances)
        except Exception as exc:  # a comparison bug must not hide the other outputs
            return OutputDiff(path, "error", "none", EXACT, detail=_one_line(exc))
    if isinstance(ref, NotCompared) or isinstance(target, NotCompared):
        return _not_compared(path, ref, target)
    try:
        if _beyond_int64(ref) or _beyond_int64(target):
            return _compare_python_ints(path, ref, target, tolerances)
        ref_t, target_t = _as_tensor(ref), _as_tensor(target)
        ref_t, target_t = _in_source_dtype(ref, ref_t, target, target_t)
        if ref_t is not None and target_t is not None:
            kind = "tensor" if isinstance(ref, torch.Tensor) or _is_array(ref) else "number"
            # A Python float of unknown origin gets float32's tolerance (PYTHON_FLOAT_DTYPE); one
            # made from a tensor is judged in that tensor's dtype.
            known = source_dtype(ref) is not None or source_dtype(target) is not None
            return _compare_tensors(path, kind, ref_t, target_t, tolerances, source_known=known)
        if ref_t is not None or target_t is not None:
            return OutputDiff(
                path,
                "dtype",
                "none",
                EXACT,
                detail=f"{type(ref).__name__} vs {type(target).__name__}",
            )
        kind = "none" if ref is None and target is None else "text"
        status = "match" if type(ref) is type(target) and ref == target else "differ"
        detail = "" if status == "match" else _text_difference(ref, target)
        if status == "differ" and devices is not None and _same_device_named(ref, target, devices):
            status, detail = "match", f"the runs' devices: {_short(ref)} and {_short(target)}"
        if (
            status == "differ"
            and temp_names is not None
            and _same_but_temp_names(ref, target, temp_names)
        ):
            status = "match"
            detail = f"the runs' temporary names: {_short(ref)} and {_short(target)}"
        return OutputDiff(path, status, kind, EXACT, detail=detail)
    except Exception as exc:  # a comparison bug must not hide the other outputs
        return OutputDiff(path, "error", "none", EXACT, detail=_one_line(exc))


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_python_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _beyond_int64(value: Any) -> bool:
    """Whether ``value`` is a Python int that no int64 tensor holds (``10**400``, ``2**64``)."""
    return _is_python_int(value) and not _INT64_MIN <= value <= _INT64_MAX


def _as_float(value: int | Fraction) -> float:
    """``value`` as a float, or an infinity of its sign where it is too large for one."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # copysign would convert value too


def _scientific(value: int | Fraction) -> str:
    """``value`` as ``1.0e+400``: a float's format where it fits one, else exact decimal digits."""
    number = _as_float(value)
    if math.isfinite(number):
        return f"{number:.1e}"
    exact = Decimal(value.numerator) / Decimal(value.denominator)  # never through str(int)
    return format(exact, ".1e")


def _compare_python_ints(path: str, ref: Any, target: Any, tolerances: _Tolerances) -> OutputDiff:
    """Compare two Python ints exactly, at least one of them beyond int64.

    Python ints have no size limit (``n = 10**400`` is a valid output), so they are compared as
    ints, the tolerance's ``atol + rtol * |ref|`` as an exact fraction: nothing is converted to a
    tensor or a float to decide. Only the statistics the report shows become floats, an infinity
    where the number is too large for one. A big int against anything but an int is a ``dtype``
    difference, as an int against a float is.
    """
    if not (_is_python_int(ref) and _is_python_int(target)):
        names = [
            "int beyond int64" if _beyond_int64(v) else type(v).__name__ for v in (ref, target)
        ]
        return OutputDiff(path, "dtype", "number", EXACT, detail=" vs ".join(names))
    a, b = int(ref), int(target)
    # An int's tolerance is int64's (exact by default), so a --tol override applies as it does
    # to the ints that fit in int64.
    tolerance = tolerances.of(path, torch.int64, torch.int64)
    diff = OutputDiff(
        path,
        "match",
        "number",
        tolerance,
        ref_dtype="int",
        target_dtype="int",
        ref_shape=(),
        target_shape=(),
        numel=1,
    )
    delta = abs(b - a)
    if delta == 0:  # as for bitwise-equal tensors
        diff.max_abs = diff.mean_abs = diff.max_rel = diff.rmse = 0.0
        diff.cosine, diff.snr_db = 1.0, math.inf
        diff.tight_rtol = diff.tight_atol = 0.0
        return diff
    rtol, atol = Fraction(tolerance.rtol), Fraction(tolerance.atol)
    allowed = atol + rtol * abs(a)
    diff.max_abs = diff.mean_abs = diff.rmse = _as_float(delta)
    diff.max_rel = _as_float(Fraction(delta, abs(a))) if a else math.inf
    diff.worst_index = ()
    diff.worst_ref, diff.worst_target = _as_float(a), _as_float(b)
    diff.allowed_at_worst = _as_float(allowed)
    # The smallest atol (at this rtol) and rtol (at this atol) that pass; None where no float
    # tolerance can say it.
    tight_atol = _as_float(max(delta - rtol * abs(a), Fraction(0)))
    diff.tight_atol = tight_atol if math.isfinite(tight_atol) else None
    if delta <= atol:
        diff.tight_rtol = 0.0
    elif a:
        tight_rtol = _as_float((delta - atol) / abs(a))
        diff.tight_rtol = tight_rtol if math.isfinite(tight_rtol) else None
    if delta > allowed:
        diff.status, diff.mismatched = "differ", 1
        if not (math.isfinite(diff.max_abs) and math.isfinite(diff.allowed_at_worst)):
            diff.detail = f"max|Δ| {_scientific(delta)} > {_scientific(allowed)}"
    return diff


def _one_line(exc: Exception) -> str:
    # torch's dispatcher errors run to dozens of lines: the report line gets the first
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
#: A device's name as a whole token of a text (``cpu``, ``cuda:0``, ``neuron``), for device types
#: ``{kinds}``: not inside a longer word (``cpu_time``, ``xcpu``), an index only where one follows.
_DEVICE_NAME = r"(?<!\w)((?:{kinds})(?::\d+)?)(?!\w)"


@functools.lru_cache(maxsize=16)
def _device_names(kinds: tuple[str, ...]) -> re.Pattern[str]:
    """The pattern of :data:`_DEVICE_NAME` for these device types (longest first)."""
    alternatives = "|".join(re.escape(kind) for kind in sorted(kinds, key=len, reverse=True))
    return re.compile(_DEVICE_NAME.format(kinds=alternatives))


def _device_split(text: str, devices: tuple[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``text`` cut at the names of either run's device: the texts between them, and the names.

    Both runs' device types are cut on both sides, so a name a cell wrote as a literal (a
    ``"cpu"`` in the cell's own text, the same in both runs) lines up with itself.
    """
    kinds = tuple(dict.fromkeys(k for device in devices if (k := device.partition(":")[0])))
    if not kinds:  # an empty type would cut every text everywhere
        return (text,), ()
    parts = _device_names(kinds).split(text)
    return tuple(parts[0::2]), tuple(parts[1::2])


def _names_agree(ref: tuple[str, ...], target: tuple[str, ...], devices: tuple[str, str]) -> bool:
    """Whether each pair of device names is one name, or each run's own device.

    ``cpu`` standing in for ``cuda`` names no index (``str(x.device)`` is ``cpu``); where both
    names carry one, the indices must agree.
    """
    if len(ref) != len(target):
        return False
    ref_kind, target_kind = (device.partition(":")[0] for device in devices)
    for ref_name, target_name in zip(ref, target, strict=True):
        if ref_name == target_name:  # the same literal in both runs
            continue
        (a_kind, _, a_index), (b_kind, _, b_index) = (
            ref_name.partition(":"),
            target_name.partition(":"),
        )
        if (a_kind, b_kind) != (ref_kind, target_kind):
            return False
        if a_index and b_index and a_index != b_index:
            return False
    return True


def _same_device_named(ref: Any, target: Any, devices: tuple[str, str]) -> bool:
    """Whether ``ref`` and ``target`` are one text but for naming each run's own device.

    ``"cpu"`` and ``"neuron:0"`` (``str(x.device)``), or ``"on cpu"`` and ``"on neuron:0"``
    (``f"on {x.device}"``): on a GPU both runs would have written ``cuda``. Names count as whole
    tokens only, and each run's text only where it names that run's device, so a text that
    differs anywhere else still differs. Where the host stands in for cuda, the reprs it writes
    without a device (see :func:`_as_the_host_writes_it`) count as naming it.
    """
    if type(ref) is not str or type(target) is not str:
        return False
    if _names_the_same(ref, target, devices):
        return True
    if devices[0].partition(":")[0] != "cpu":
        return False
    written = _as_the_host_writes_it(target, devices[1].partition(":")[0])
    if written == target:
        return False
    return _names_the_same(_SUFFIX_BREAK.sub(", ", ref), _SUFFIX_BREAK.sub(", ", written), devices)


def _names_the_same(ref: str, target: str, devices: tuple[str, str]) -> bool:
    """Whether the texts are the same between their device names, and those name each run's."""
    (ref_text, ref_names), (target_text, target_names) = (
        _device_split(ref, devices),
        _device_split(target, devices),
    )
    return ref_text == target_text and _names_agree(ref_names, target_names, devices)


#: A tensor repr's device suffix (``, device='neuron:0'``), which may start a line of its own.
_REPR_DEVICE = r",\s*device='{kind}(?::\d+)?'"
#: The line break torch puts before a repr's suffix (``dtype=``, ``grad_fn=``) where the line is
#: full: the device suffix may have filled it in one run alone, so neither run's counts.
_SUFFIX_BREAK = re.compile(r",\n *(?=[a-z_]+=)")


def _as_the_host_writes_it(text: str, kind: str) -> str:
    """``text`` as the host would have written it of its own tensors and devices, for ``kind``.

    A CPU tensor's repr names no device (``tensor([1.])``), where one on ``kind`` does
    (``tensor([1.], device='neuron:0')``), as one on a GPU does (``device='cuda:0'``); a device's
    repr names the CPU's without an index (``device(type='cpu')``), the device's with one. The
    reference standing in for cuda holds the cell's cuda tensors on the CPU, so the texts the cell
    wrote of them (``str(logits)``, ``f"pred: {x}"``, ``repr(x.device)``) lack what the target's
    have: both are taken out of the target's text.
    """
    written = re.sub(_REPR_DEVICE.format(kind=re.escape(kind)), "", text)
    return re.sub(rf"(device\(type='{re.escape(kind)}'), index=\d+\)", r"\1)", written)


#: A ``torch.device`` as a dict key shows in a path: ``d[device(type='cpu')]``.
_DEVICE_KEY = re.compile(r"device\(type='(\w+)'(?:, index=(\d+))?\)")


def _device_keys_named(path: str, target_kind: str) -> str:
    """``path`` with its ``torch.device`` keys written as the device's name (``device('cpu')``).

    ``{x.device: ...}`` is keyed by each run's own device: ``device(type='cpu')`` on the reference
    (the host standing in for cuda, no index) and the target's device, which the kernel holds as
    ``privateuseone`` when it has no such device of its own (see ``run.transport``): named as the
    target's device type here, so that the two keys pair as ``d[str(x.device)]``'s do.
    """
    if "device(" not in path:
        return path

    def named(match: re.Match[str]) -> str:
        kind, index = match.group(1), match.group(2)
        if kind == UNUSABLE_DEVICE_TYPE:
            kind = target_kind
        return f"device('{kind}:{index}')" if index is not None else f"device('{kind}')"

    return _DEVICE_KEY.sub(named, path)


def _paired_by_device(
    ref_only: list[str], target_only: list[str], devices: tuple[str, str]
) -> dict[str, str]:
    """Pair the paths only one run has that are one path but for naming each run's device.

    ``d[str(x.device)]`` is ``d['cpu']`` on the reference and ``d['neuron:0']`` on the target: one
    output. Only one-to-one pairings are kept: a dict keyed by both ``str(x.device)`` and
    ``x.device.type`` has one key on the reference (``cpu``) and two on the target (``neuron:0``,
    ``neuron``), and which of them is the reference's is anyone's guess, so all stay missing.

    Returns
    -------
    dict of str to str
        Reference path to the target's path of the same output, in the reference's order.
    """
    by_text: dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]] = {}
    target_kind = devices[1].partition(":")[0]
    for path in target_only:
        text, names = _device_split(_device_keys_named(path, target_kind), devices)
        if names:
            by_text.setdefault(text, []).append((path, names))
    if not by_text:  # the common case: no path names a device
        return {}
    candidates: dict[str, list[str]] = {}
    for path in ref_only:
        text, names = _device_split(_device_keys_named(path, target_kind), devices)
        if names:
            candidates[path] = [
                other
                for other, other_names in by_text.get(text, ())
                if _names_agree(names, other_names, devices)
            ]
    chosen = Counter(other for others in candidates.values() for other in others)
    return {
        path: others[0]
        for path, others in candidates.items()
        if len(others) == 1 and chosen[others[0]] == 1
    }


def _same_but_temp_names(
    ref: Any, target: Any, temp_names: tuple[Sequence[str], Sequence[str]]
) -> bool:
    """Whether two strings differ only in names their own runs drew from ``tempfile``.

    Each run draws its own random names (``mkdtemp``'s ``tmpa1b2c3d4``), so a path built on one
    differs between runs of the same code. The same code draws its names in the same order: the
    strings must be the same around those names, and each name the reference's must be the one
    drawn at the same place in the target's run (its first folder where the reference has its
    first).
    """
    if type(ref) is not str or type(target) is not str:
        return False
    ref_parts = _split_on_names(ref, temp_names[0])
    target_parts = _split_on_names(target, temp_names[1])
    if len(ref_parts) != len(target_parts) or len(ref_parts) == 1:
        return False
    for i, (a, b) in enumerate(zip(ref_parts, target_parts, strict=True)):
        if i % 2 == 0:  # the text around the names
            if a != b:
                return False
        elif temp_names[0].index(a) != temp_names[1].index(b):
            return False
    return True


def _made_of_measurements(
    ref: Any,
    target: Any,
    measured_texts: tuple[Mapping[str, Sequence[str]], Mapping[str, Sequence[str]]],
) -> tuple[str, str] | None:
    """The ``(kind, source)`` of the measurement two texts were made of, where they differ only so.

    Each run times itself, so a log line built from its timing (``f"step took {ms:.1f} ms"``)
    differs between runs of the same code. The texts must be the same around the places where
    each holds a text its own run made of a measurement: the first such place names the source.
    """
    if type(ref) is not str or type(target) is not str:
        return None
    ref_texts, target_texts = measured_texts
    ref_parts = _split_on_names(ref, ref_texts)
    target_parts = _split_on_names(target, target_texts)
    if len(ref_parts) != len(target_parts) or len(ref_parts) == 1:
        return None
    if any(a != b for a, b in zip(ref_parts[::2], target_parts[::2], strict=True)):
        return None
    kind, source = ref_texts[ref_parts[1]]
    return kind, f"a text formatted from {source}"


#: The most numbers of an array or tensor looked up among a run's measured values.
_MEASURED_LOOKUP = 4096


def _measured_numbers(
    ref: Any, target: Any, measured: tuple[_MeasuredValues, _MeasuredValues]
) -> tuple[str, str] | None:
    """The ``(kind, source)`` of the measurements two numbers (or arrays of them) are, or None.

    ``float(np.median(times))`` and ``pd.DataFrame(rows)["ms"]`` hold a run's measurements as plain
    numbers: each side must hold only values its own run measured (exactly: a float found by
    chance among a run's timings is no risk worth naming).
    """
    try:
        made = measured[0].source_of(ref)
        if made is None or measured[1].source_of(target) is None:
            return None
    except Exception:  # (an array torch cannot view): compared as it is, never a crash
        return None
    kind, source = made
    return kind, source


class _MeasuredValues:
    """One run's measured values, found in the dtype of the array that holds them.

    An array of another float dtype holds them rounded to it (``torch.tensor(times)``: float32);
    each dtype's rounded table is made once per comparison, not once per output.
    """

    def __init__(self, values: Mapping[float, Sequence[str]]) -> None:
        self.values = values
        self._rounded: dict[torch.dtype, Mapping[float, Sequence[str]]] = {}

    def _in(self, dtype: torch.dtype) -> Mapping[float, Sequence[str]]:
        if dtype == torch.float64:
            return self.values
        if dtype not in self._rounded:
            rounded = torch.tensor(list(self.values), dtype=torch.float64).to(dtype).double()
            self._rounded[dtype] = dict(zip(rounded.tolist(), self.values.values(), strict=True))
        return self._rounded[dtype]

    def source_of(self, value: Any) -> Sequence[str] | None:
        """What measured the numbers of ``value`` (a float, a float array or tensor), or None.

        Every one of them must be a measured value.
        """
        if type(value) is float:
            return self.values.get(value)
        if not (_is_array(value) or isinstance(value, torch.Tensor)):
            return None
        if _is_array(value):
            value = value.copy()  # (a reversed array's negative strides: no tensor views them)
        tensor = torch.as_tensor(value).detach()
        if not tensor.is_floating_point() or not 0 < tensor.numel() <= _MEASURED_LOOKUP:
            return None
        lookup = self._in(tensor.dtype)
        numbers = tensor.to("cpu", torch.float64).flatten().tolist()
        if any(number not in lookup for number in numbers):
            return None
        return lookup[numbers[0]]


def _split_on_names(text: str, names: Collection[str]) -> list[str]:
    """``text`` cut around the ``names`` it holds: text, name, text, ... (just ``[text]``: none)."""
    held = sorted({name for name in names if name and name in text}, key=len, reverse=True)
    if not held:
        return [text]
    return re.split("(" + "|".join(map(re.escape, held)) + ")", text)


def _text_difference(ref: Any, target: Any) -> str:
    """``ref != target`` as a report line shows it, where two long strings first differ.

    Two texts that differ past the part :func:`_short` keeps (a decoded sentence whose last word
    changed) are shown from a little before their first difference, with its position.
    """
    left, right = _short(ref), _short(target)
    if left != right or type(ref) is not type(target) or not isinstance(ref, str | bytes):
        return f"{left} != {right}"
    at = next((i for i, pair in enumerate(zip(ref, target)) if pair[0] != pair[1]), None)
    if at is None:  # one is the other's beginning
        at = min(len(ref), len(target))
    start = max(0, at - 10)
    return (
        f"…{_short(ref[start:])} != …{_short(target[start:])} (first difference at character {at})"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_array(value: Any) -> bool:
    return type(value).__module__ == "numpy"


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if _is_array(value):
        if value.ndim and (min(value.strides) < 0 or not value.flags.writeable):
            # no tensor holds negative strides (``a[::-1]``: "ValueError: At least one stride
            # ... is negative", an error for arrays that matched), or shares a read-only array
            # without warning the user under the cell
            value = value.copy()
        return torch.as_tensor(value)
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    if isinstance(value, complex):
        return torch.tensor(value, dtype=torch.complex128)
    return None


def _in_source_dtype(
    ref: Any, ref_t: torch.Tensor | None, target: Any, target_t: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Python scalars made from tensors (``loss.item()``) as the dtype of the tensors they came from.

    The conversion to a Python number is exact, so the value is one of that dtype's, and the
    difference between two runs is a difference in that dtype (its tolerance, its name in the
    report). When the runs' sources differ in dtype, both are judged in the less precise one (the
    tensors themselves show the dtype difference where the cell binds them).
    """
    if ref_t is None or target_t is None:
        return ref_t, target_t
    dtypes = [d for d in (source_dtype(ref), source_dtype(target)) if d is not None]
    if not dtypes:
        return ref_t, target_t
    dtype = dtypes[0]
    if len(dtypes) == 2 and dtypes[0] != dtypes[1]:
        dtype = max(dtypes, key=_resolution)
    if ref_t.dtype.is_floating_point != dtype.is_floating_point:
        return ref_t, target_t
    return ref_t.to(dtype), target_t.to(dtype)


def _resolution(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 1.0


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dense_on_one_device(
    ref: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if ref.layout != torch.strided:  # sparse: compared as their dense values
        ref, target = ref.to_dense(), target.to_dense()
    # Emulated device tensors are compared through their host copy; a CUDA pair stays on the GPU.
    a = ref if ref.device.type in ("cpu", "cuda") else ref.cpu()
    b = target if target.device == a.device else target.to(a.device)
    return a, b


#: Dtypes whose values the comparison's CPU kernels (isclose, abs, mul) cannot read, and the dtype
#: that holds each of their values exactly.
_WIDENED = {
    dtype: wide
    for name, wide in (
        ("float8_e4m3fn", torch.float32),
        ("float8_e4m3fnuz", torch.float32),
        ("float8_e5m2", torch.float32),
        ("float8_e5m2fnuz", torch.float32),
        ("complex32", torch.complex64),
    )
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}


def with_cpu_kernels(value: torch.Tensor) -> torch.Tensor:
    """``value`` in a dtype the CPU's kernels (isclose, abs, isfinite) compute with, same values.

    float8 and complex32 values are widened exactly (their tolerance stays their dtype's); a
    quantized tensor is its dequantized values, as ``torch.testing.assert_close`` compares it.
    Anything else is returned as it is.
    """
    if value.is_quantized:
        return value.dequantize()
    wide = _WIDENED.get(value.dtype)
    return value if wide is None else value.to(wide)


def _compare_tensors(
    path: str,
    kind: str,
    ref: torch.Tensor,
    target: torch.Tensor,
    tolerances: _Tolerances,
    *,
    source_known: bool = False,
) -> OutputDiff:
    """Compare two tensors (``ref`` and ``target`` need not be detached: nothing here records)."""
    ref_dtype, target_dtype = ref.dtype, target.dtype
    if kind == "number" and ref_dtype == torch.float64 and not source_known:
        tolerance = tolerances.of(path, PYTHON_FLOAT_DTYPE, PYTHON_FLOAT_DTYPE)
    else:
        tolerance = tolerances.of(path, ref_dtype, target_dtype)
    diff = OutputDiff(
        path,
        "match",
        kind,
        tolerance,
        ref_dtype=_dtype_name(ref_dtype),
        target_dtype=_dtype_name(target_dtype),
        ref_shape=tuple(ref.shape),
        target_shape=tuple(target.shape),
    )
    if diff.ref_shape != diff.target_shape:
        diff.status = "shape"
        diff.detail = f"shape {list(ref.shape)} vs {list(target.shape)}"
        return diff
    if ref_dtype != target_dtype:
        diff.status = "dtype"
        diff.detail = f"dtype {diff.ref_dtype} vs {diff.target_dtype}"
        return diff
    if ref.is_meta or target.is_meta:  # a model built on the meta device: shapes, no values
        if not (ref.is_meta and target.is_meta):
            diff.status = "differ"
            which = "reference" if ref.is_meta else "target"
            diff.detail = f"the {which} holds a meta tensor (no values)"
        else:
            diff.detail = "meta tensors: no values, same shape and dtype"
        return diff
    layout = ref.layout
    if layout != target.layout:
        diff.status = "differ"
        diff.detail = f"layout {layout} vs {target.layout}"
        return diff
    if layout == torch.strided and ref.is_cpu and target.is_cpu:
        a, b = ref, target  # the usual pair: nothing to convert or move
    else:
        a, b = _dense_on_one_device(ref.detach(), target.detach())
    diff.numel = a.numel()
    if diff.numel == 0:
        return diff
    a, b = with_cpu_kernels(a), with_cpu_kernels(b)  # (one dtype here: both or neither)
    if torch.equal(a, b):
        # Bitwise-equal outputs (the common case between the CPU and the emulator) need no metrics.
        diff.max_abs = diff.mean_abs = diff.max_rel = diff.rmse = 0.0
        diff.cosine, diff.snr_db = 1.0, math.inf
        diff.tight_rtol = diff.tight_atol = 0.0
        return diff
    stats = tensor_stats(a, b, tolerance)
    diff.mismatched = stats.mismatched
    diff.nan_mismatches, diff.inf_mismatches = stats.nan_mismatches, stats.inf_mismatches
    diff.max_abs, diff.mean_abs, diff.max_rel = stats.max_abs, stats.mean_abs, stats.max_rel
    diff.rmse, diff.cosine, diff.snr_db = stats.rmse, stats.cosine, stats.snr_db
    diff.tight_rtol, diff.tight_atol = stats.tight_rtol, stats.tight_atol
    if not a.is_complex():
        shape = a.shape
        diff.worst_index = (
            tuple(int(i) for i in torch.unravel_index(torch.tensor(stats.worst_index), shape))
            if a.dim()
            else ()
        )
        diff.worst_ref, diff.worst_target = stats.worst_ref, stats.worst_target
        diff.allowed_at_worst = stats.allowed_at_worst
    if stats.nan_mismatches or stats.inf_mismatches:
        diff.status = "nan-mismatch"
    elif stats.mismatched:
        diff.status = "differ"
    return diff

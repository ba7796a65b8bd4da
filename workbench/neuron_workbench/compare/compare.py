"""Compare two runs' outputs leaf by leaf, collecting every difference as data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.compare.tolerances import (
    EXACT,
    PYTHON_FLOAT_DTYPE,
    Tolerance,
    check_pair,
    resolve,
)

#: Every status an output can have; only ``match`` passes.
STATUSES = ("match", "differ", "shape", "dtype", "missing", "nan-mismatch", "error")


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
    max_abs, max_rel : float or None
        Largest absolute and relative difference over elements that are finite on both sides.
    mismatched, numel : int
        Elements outside tolerance, and elements compared.
    worst_index : tuple of int or None
        The element that exceeds its allowed difference the most (or the largest difference).
    worst_ref, worst_target : float or None
        The two values at ``worst_index``.
    allowed_at_worst : float or None
        ``atol + rtol * |ref|`` at ``worst_index``.
    detail : str
        One line explaining a non-numeric status (shapes, dtypes, a missing output).
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
    max_abs: float | None = None
    max_rel: float | None = None
    worst_index: tuple[int, ...] | None = None
    worst_ref: float | None = None
    worst_target: float | None = None
    allowed_at_worst: float | None = None
    detail: str = ""

    @property
    def passed(self) -> bool:
        """True when the status is ``match``."""
        return self.status == "match"

    def headline(self) -> str:
        """A short, deterministic description of why this output failed (empty when it passed)."""
        if self.passed:
            return ""
        if self.status in ("differ", "nan-mismatch") and self.max_abs is not None:
            allowed = self.allowed_at_worst if self.allowed_at_worst is not None else 0.0
            if self.status == "nan-mismatch":
                return f"{self.path} NaN/Inf placement differs ({self.mismatched} elements)"
            return f"{self.path} max|Δ| {self.max_abs:.1e} > {allowed:.1e}"
        return f"{self.path} {self.detail or self.status}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
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
            "max_abs": _finite_or_none(self.max_abs),
            "max_rel": _finite_or_none(self.max_rel),
            "worst_index": list(self.worst_index) if self.worst_index is not None else None,
            "worst_ref": _finite_or_none(self.worst_ref),
            "worst_target": _finite_or_none(self.worst_target),
            "allowed_at_worst": _finite_or_none(self.allowed_at_worst),
            "detail": self.detail,
        }


def _finite_or_none(value: float | None) -> float | str | None:
    # JSON has no NaN/Inf; keep them readable instead of producing invalid JSON.
    if value is None or math.isfinite(value):
        return value
    return str(value)


@dataclass
class Comparison:
    """Every output's :class:`OutputDiff`, in output order."""

    diffs: list[OutputDiff] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every output matched."""
        return all(d.passed for d in self.diffs)

    @property
    def failures(self) -> list[OutputDiff]:
        """The outputs that did not match."""
        return [d for d in self.diffs if not d.passed]

    def counts(self) -> dict[str, int]:
        """Number of outputs per status (only statuses that occur)."""
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
) -> Comparison:
    """Compare the named outputs of two runs.

    Parameters
    ----------
    ref, target : mapping of str to object
        Output name to value (tensors, modules, containers, numbers, strings) for each run.
    rtol, atol : float, optional
        Override the per-dtype defaults; give both or neither.

    Returns
    -------
    Comparison
        One :class:`OutputDiff` per leaf present in either run. Mismatches are data, never raised.
    """
    check_pair(rtol, atol)
    ref_leaves = dict(iter_leaves(ref))
    target_leaves = dict(iter_leaves(target))
    paths = list(ref_leaves) + [p for p in target_leaves if p not in ref_leaves]
    diffs = []
    for path in paths:
        if path not in target_leaves or path not in ref_leaves:
            side = "target" if path not in target_leaves else "reference"
            diffs.append(
                OutputDiff(path, "missing", "none", EXACT, detail=f"missing on the {side}")
            )
            continue
        diffs.append(compare_leaf(path, ref_leaves[path], target_leaves[path], rtol, atol))
    return Comparison(diffs)


def compare_leaf(
    path: str, ref: Any, target: Any, rtol: float | None = None, atol: float | None = None
) -> OutputDiff:
    """Compare one leaf pair; never raises for a value problem (it becomes status ``error``)."""
    try:
        ref_t, target_t = _as_tensor(ref), _as_tensor(target)
        if ref_t is not None and target_t is not None:
            kind = "tensor" if isinstance(ref, torch.Tensor) or _is_array(ref) else "number"
            return _compare_tensors(path, kind, ref_t, target_t, rtol, atol)
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
        detail = "" if status == "match" else f"{_short(ref)} != {_short(target)}"
        return OutputDiff(path, status, kind, EXACT, detail=detail)
    except Exception as exc:  # a comparison bug must not hide the other outputs
        return OutputDiff(path, "error", "none", EXACT, detail=f"{type(exc).__name__}: {exc}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_array(value: Any) -> bool:
    return type(value).__module__ == "numpy"


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if _is_array(value):
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


def _compare_tensors(
    path: str,
    kind: str,
    ref: torch.Tensor,
    target: torch.Tensor,
    rtol: float | None,
    atol: float | None,
) -> OutputDiff:
    ref_dtype, target_dtype = ref.dtype, target.dtype
    tol_dtypes = (ref_dtype, target_dtype)
    if kind == "number" and ref_dtype == torch.float64:
        tol_dtypes = (PYTHON_FLOAT_DTYPE, PYTHON_FLOAT_DTYPE)
    tolerance = resolve(*tol_dtypes, rtol, atol)
    diff = OutputDiff(
        path,
        "match",
        kind,
        tolerance,
        ref_dtype=str(ref_dtype).removeprefix("torch."),
        target_dtype=str(target_dtype).removeprefix("torch."),
        ref_shape=tuple(ref.shape),
        target_shape=tuple(target.shape),
    )
    if ref.shape != target.shape:
        diff.status = "shape"
        diff.detail = f"shape {list(ref.shape)} vs {list(target.shape)}"
        return diff
    if ref_dtype != target_dtype:
        diff.status = "dtype"
        diff.detail = f"dtype {diff.ref_dtype} vs {diff.target_dtype}"
        return diff
    a = ref.cpu() if ref.device.type != "cpu" else ref
    b = target.to(a.device) if target.device != a.device else target
    diff.numel = a.numel()
    if diff.numel == 0:
        return diff
    if torch.equal(a, b):
        # Bitwise-equal outputs (the common case between the CPU and the emulator) need no metrics.
        diff.max_abs = diff.max_rel = 0.0
        return diff
    if a.is_complex():
        compute = torch.complex128
    else:
        compute = torch.float64 if a.dtype == torch.float64 else torch.float32
    a_c = a.to(compute) if a.dtype != compute else a
    b_c = b.to(compute) if b.dtype != compute else b
    if a.is_floating_point() or a.is_complex():
        close = torch.isclose(b_c, a_c, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
        nan_a, nan_b = torch.isnan(a_c), torch.isnan(b_c)
        nan_mismatch = int((nan_a != nan_b).sum())
    else:
        close = a == b
        nan_mismatch = 0
    mismatched = int((~close).sum())
    delta = (b_c - a_c).abs()
    finite = torch.isfinite(delta)
    magnitude = a_c.abs()
    if bool(finite.any()):
        finite_delta = torch.where(finite, delta, torch.zeros((), dtype=delta.dtype))
        diff.max_abs = float(finite_delta.max())
        nonzero = finite & (magnitude > 0)
        if bool(nonzero.any()):
            rel = torch.where(nonzero, finite_delta / torch.where(nonzero, magnitude, 1), 0)
            diff.max_rel = float(rel.max())
        else:
            diff.max_rel = 0.0 if diff.max_abs == 0 else math.inf
    allowed = tolerance.atol + tolerance.rtol * magnitude
    excess = torch.where(finite, delta - allowed, torch.full((), math.inf, dtype=delta.real.dtype))
    excess = torch.where(close, torch.full((), -math.inf, dtype=excess.dtype), excess)
    flat = (
        int(excess.reshape(-1).argmax())
        if mismatched
        else int(delta.reshape(-1).nan_to_num(0).argmax())
    )
    index = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else ()
    )
    diff.worst_index = index
    diff.worst_ref = _scalar(a_c.reshape(-1)[flat])
    diff.worst_target = _scalar(b_c.reshape(-1)[flat])
    diff.allowed_at_worst = float(allowed.reshape(-1)[flat])
    diff.mismatched = mismatched
    if nan_mismatch:
        diff.status = "nan-mismatch"
        diff.mismatched = max(mismatched, nan_mismatch)
    elif mismatched:
        diff.status = "differ"
    return diff


def _scalar(value: torch.Tensor) -> float:
    if value.is_complex():
        return float(value.abs())
    return float(value)

"""Error statistics of one tensor pair, reduced chunk by chunk.

Every statistic is accumulated over fixed-size chunks of the flattened tensors, so the extra memory
is a few chunk-sized temporaries however large the inputs are, and on a GPU the reduction runs on
the device with only scalars coming back at the end. The pass/fail decision per element is
``torch.isclose`` on the original dtype, exactly as ``torch.testing.assert_close`` decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_workbench.compare.tolerances import Tolerance

#: Elements per chunk: 1 Mi float32 elements = 4 MiB per temporary.
CHUNK_ELEMENTS = 1 << 20


@dataclass
class TensorStats:
    """What :func:`tensor_stats` measured for one tensor pair (``ref`` is the expected side).

    Differences are taken over elements that are finite on both sides; ``nan_mismatches`` and
    ``inf_mismatches`` count elements whose NaN or infinity placement (or sign) differs.
    """

    numel: int
    mismatched: int
    nan_mismatches: int
    inf_mismatches: int
    max_abs: float
    mean_abs: float
    max_rel: float
    rmse: float
    cosine: float
    snr_db: float
    worst_index: int
    worst_ref: float
    worst_target: float
    allowed_at_worst: float
    tight_atol: float | None
    tight_rtol: float | None


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return (
        torch.float64 if dtype in (torch.float64, torch.complex128, torch.int64) else torch.float32
    )


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


def tensor_stats(
    ref: torch.Tensor,
    target: torch.Tensor,
    tolerance: Tolerance,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> TensorStats:
    """Compare ``target`` against ``ref`` (same shape and dtype) under ``tolerance``.

    Parameters
    ----------
    ref, target : torch.Tensor
        Tensors of equal shape and dtype. ``target`` is moved to ``ref``'s device one chunk at a
        time when they live on different devices.
    tolerance : Tolerance
        ``rtol``/``atol`` of the element-wise decision.
    chunk_elements : int
        Elements reduced at once (bounds the temporary memory).

    Returns
    -------
    TensorStats
        Counts, error statistics, the worst element (flat index) and the tightest tolerances that
        would have passed (``None`` when no tolerance can: NaN/Inf placement differs).
    """
    a_flat = ref.detach().reshape(-1)
    b_flat = target.detach().reshape(-1)
    device = a_flat.device
    numel = a_flat.numel()
    floating = ref.is_floating_point() or ref.is_complex()
    compute = _compute_dtype(ref.dtype)
    eps = torch.finfo(ref.dtype).eps if floating else 0.0
    rtol, atol = tolerance.rtol, tolerance.atol
    zero = torch.zeros((), dtype=torch.float64, device=device)
    mismatched = nan_mm = inf_mm = zero.clone()
    n_finite = zero.clone()
    sum_abs = sum_sq = sum_ab = sum_aa = sum_bb = zero.clone()
    max_abs = max_rel = zero.clone()
    need_atol = need_rtol = zero.clone()
    impossible_rtol = torch.zeros((), dtype=torch.bool, device=device)
    worst_bad = (zero - math.inf, -1)  # largest excess over the allowed error, among mismatches
    worst_any = (zero - 1.0, -1)  # largest difference overall, when nothing mismatches
    for start in range(0, max(numel, 1), chunk_elements):
        a = a_flat[start : start + chunk_elements]
        b = b_flat[start : start + chunk_elements]
        if b.device != device:
            b = b.to(device)
        if a.numel() == 0:
            break
        if floating:
            close = torch.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = a == b
        mismatched = mismatched + (~close).sum()
        a_c = _as_real(a).to(compute)
        b_c = _as_real(b).to(compute)
        if floating:
            nan_a, nan_b = torch.isnan(a_c), torch.isnan(b_c)
            nan_mm = nan_mm + (nan_a != nan_b).sum()
            inf_a, inf_b = torch.isinf(a_c), torch.isinf(b_c)
            inf_mm = inf_mm + ((inf_a | inf_b) & (a_c != b_c) & ~(nan_a | nan_b)).sum()
            finite = torch.isfinite(a_c) & torch.isfinite(b_c)
        else:
            finite = torch.ones_like(a_c, dtype=torch.bool)
        delta = torch.where(finite, (b_c - a_c).abs(), 0)
        mag = torch.where(finite, a_c.abs(), 0)
        n_finite = n_finite + finite.sum()
        sum_abs = sum_abs + delta.sum(dtype=torch.float64)
        sum_sq = sum_sq + delta.square().sum(dtype=torch.float64)
        a_f = torch.where(finite, a_c, 0)
        b_f = torch.where(finite, b_c, 0)
        sum_ab = sum_ab + (a_f * b_f).sum(dtype=torch.float64)
        sum_aa = sum_aa + a_f.square().sum(dtype=torch.float64)
        sum_bb = sum_bb + b_f.square().sum(dtype=torch.float64)
        max_abs = torch.maximum(max_abs, delta.max().to(torch.float64))
        nonzero = mag > 0
        rel = torch.where(nonzero, delta / torch.where(nonzero, mag, 1), 0)
        max_rel = torch.maximum(max_rel, rel.max().to(torch.float64))
        # Tightest tolerances, with a margin for rounding in the original dtype (isclose computes
        # |a - b| and atol + rtol * |b| there).
        up, down = 1 + 2 * eps, 1 - 2 * eps
        need_atol = torch.maximum(
            need_atol, (delta * up - rtol * mag * down).max().to(torch.float64)
        )
        excess_over_atol = delta * up - atol * down
        rtol_needed = torch.where(
            nonzero, excess_over_atol / torch.where(nonzero, mag * down, 1), 0
        )
        need_rtol = torch.maximum(need_rtol, rtol_needed.max().to(torch.float64))
        impossible_rtol = impossible_rtol | ((~nonzero) & (excess_over_atol > 0)).any()
        # Worst element of this chunk.
        if not a.is_complex():
            allowed = atol + rtol * mag
            excess = torch.where(finite, delta - allowed, math.inf)
            excess = torch.where(close, -math.inf, excess)
            idx = int(excess.argmax())
            if float(excess[idx]) > float(worst_bad[0]):
                worst_bad = (excess[idx].to(torch.float64), start + idx)
            idx_any = int(delta.argmax())
            if float(delta[idx_any]) > float(worst_any[0]):
                worst_any = (delta[idx_any].to(torch.float64), start + idx_any)
    mismatched_i = int(mismatched)
    nan_i, inf_i = int(nan_mm), int(inf_mm)
    n_fin = float(n_finite)
    if numel and not ref.is_complex():
        worst = worst_bad[1] if mismatched_i else worst_any[1]
        worst = max(worst, 0)
        wa = a_flat[worst].to(torch.float64).item()
        wb = b_flat[worst].to(torch.float64).item()
        allowed_at_worst = atol + rtol * abs(wa)
    else:
        worst, wa, wb, allowed_at_worst = 0, math.nan, math.nan, atol
    aa, bb, ab, sq = float(sum_aa), float(sum_bb), float(sum_ab), float(sum_sq)
    if aa == 0 and bb == 0:
        cosine = 1.0
    elif aa == 0 or bb == 0:
        cosine = 0.0
    else:
        cosine = ab / math.sqrt(aa * bb)
    snr_db = math.inf if sq == 0 else (10 * math.log10(aa / sq) if aa > 0 else -math.inf)
    placement_differs = nan_i or inf_i
    tight_atol = None if placement_differs else max(float(need_atol), 0.0) * (1 + 4 * eps)
    tight_rtol = None
    if not placement_differs and not bool(impossible_rtol):
        tight_rtol = max(float(need_rtol), 0.0) * (1 + 4 * eps)
    return TensorStats(
        numel=numel,
        mismatched=mismatched_i,
        nan_mismatches=nan_i,
        inf_mismatches=inf_i,
        max_abs=float(max_abs),
        mean_abs=float(sum_abs) / n_fin if n_fin else 0.0,
        max_rel=float(max_rel),
        rmse=math.sqrt(sq / n_fin) if n_fin else 0.0,
        cosine=cosine,
        snr_db=snr_db,
        worst_index=worst,
        worst_ref=wa,
        worst_target=wb,
        allowed_at_worst=allowed_at_worst,
        tight_atol=tight_atol,
        tight_rtol=tight_rtol,
    )

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

#: Elements per chunk: 128 Ki float32 elements = 512 KiB per scratch buffer (fits in L2 cache;
#: measured fastest on a 2-core x86 host, 2026-12).
CHUNK_ELEMENTS = 1 << 17


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
    """The dtype a chunk's statistics are computed in: exact for every integer dtype.

    Integers go to float64 (exact up to 2**53): in float32, int32 values above 2**24 round, so
    16777217 vs 16777218 read max |Δ| 2 (or 0, for a "differ" of two values rounding alike).
    """
    if dtype in (torch.float64, torch.complex128):
        return torch.float64
    if dtype.is_floating_point or dtype.is_complex:
        return torch.float32
    return torch.float64


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t


class _Totals:
    """Running totals over chunks (plain Python numbers: one sync per statistic per chunk)."""

    def __init__(self) -> None:
        self.mismatched = self.nan_mm = self.inf_mm = 0
        self.n_finite = 0
        self.sum_abs = self.sum_sq = self.sum_aa = self.sum_bb = self.sum_ab = 0.0
        self.max_abs = self.max_rel = self.max_mag = 0.0
        self.need_atol = -math.inf  # max of (|Δ| - rtol |ref|) over finite elements
        self.need_rtol = 0.0  # max of (|Δ| - atol) / |ref| over finite elements with ref != 0
        self.impossible_rtol = False
        self.worst_bad = (-math.inf, -1)  # largest excess over the allowed error, among mismatches
        self.worst_any = (-1.0, -1)  # largest difference overall

    def worst(self, start: int, bad: tuple[float, int] | None, any_: tuple[float, int]) -> None:
        if bad is not None and bad[0] > self.worst_bad[0]:
            self.worst_bad = (bad[0], start + bad[1])
        if any_[0] > self.worst_any[0]:
            self.worst_any = (any_[0], start + any_[1])


class _Buffers:
    """Chunk-sized scratch tensors reused across chunks (no allocation, no page faults per chunk)."""

    def __init__(self, like: torch.Tensor, size: int) -> None:
        self.ad = torch.empty(size, dtype=like.dtype, device=like.device)
        self.mag = torch.empty_like(self.ad)
        self.tmp = torch.empty_like(self.ad)
        self.mask = torch.empty(size, dtype=torch.bool, device=like.device)

    def view(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ad[:n], self.mag[:n], self.tmp[:n], self.mask[:n]


def _fast_chunk(
    totals: _Totals,
    start: int,
    a: torch.Tensor,
    b: torch.Tensor,
    tol: Tolerance,
    buffers: _Buffers,
    aa: float,
    bb: float,
) -> bool:
    """A float32/float64 chunk finite on both sides: few passes, same decision as ``isclose``.

    ``isclose`` passes an element when ``|b - a| <= atol + rtol * |a|``, computed in the tensors'
    dtype; the same expression is evaluated here, and ``excess > 0`` is exactly its negation.
    False (nothing counted) where the squared differences overflow the dtype (``|Δ|`` beyond
    about 1e19 in float32): the general path measures that chunk in float64.
    """
    rtol, atol = tol.rtol, tol.atol
    ad, mag, tmp, mask = buffers.view(a.numel())
    torch.sub(b, a, out=ad).abs_()
    sum_sq = float(torch.dot(ad, ad))
    if not math.isfinite(sum_sq):
        return False
    torch.abs(a, out=mag)
    torch.mul(mag, rtol, out=tmp)
    # |Δ| - rtol |ref|: the atol each element needs (taken before atol is added, so a large atol
    # cannot swallow a small difference through cancellation).
    torch.sub(ad, tmp, out=tmp)
    totals.need_atol = max(totals.need_atol, float(tmp.max()))
    # tmp now holds |Δ| - rtol |ref|; the excess over the allowed error is that minus atol, but
    # isclose rounds rtol |ref| + atol first, so recompute the threshold the way it does.
    torch.mul(mag, rtol, out=tmp).add_(atol)
    torch.sub(ad, tmp, out=tmp)
    max_excess, at_excess = torch.max(tmp, 0)
    mismatched = int(torch.gt(tmp, 0, out=mask).sum()) if float(max_excess) > 0 else 0
    max_abs, at_abs = torch.max(ad, 0)
    totals.mismatched += mismatched
    totals.n_finite += a.numel()
    totals.sum_abs += float(ad.sum())
    totals.sum_sq += sum_sq
    totals.sum_aa += aa
    totals.sum_bb += bb
    # a.b: from the norms where the chunks are close (exact to a few ulps there), else its own
    # sum (a.b is small next to |a|^2 + |b|^2, which the identity would cancel away)
    if sum_sq <= min(aa, bb):
        totals.sum_ab += (aa + bb - sum_sq) / 2
    else:
        totals.sum_ab += float(torch.dot(a.to(torch.float64), b.to(torch.float64)))
    totals.max_abs = max(totals.max_abs, float(max_abs))
    totals.max_mag = max(totals.max_mag, float(mag.max()))
    if float(max_abs) > 0:
        any_zero = bool(torch.eq(mag, 0, out=mask).any())
        torch.div(ad, mag, out=tmp)
        if any_zero:
            tmp.masked_fill_(mask, 0)
        totals.max_rel = max(totals.max_rel, float(tmp.max()))
        torch.sub(ad, atol, out=tmp).div_(mag)
        if any_zero:
            tmp.masked_fill_(mask, 0)
            totals.impossible_rtol |= bool((ad[mask] > atol).any())
        totals.need_rtol = max(totals.need_rtol, float(tmp.max()))
    bad = (float(max_excess), int(at_excess)) if mismatched else None
    totals.worst(start, bad, (float(max_abs), int(at_abs)))
    return True


def _general_chunk(
    totals: _Totals, start: int, a: torch.Tensor, b: torch.Tensor, tol: Tolerance, floating: bool
) -> None:
    """Any dtype, NaN and infinities included: ``isclose`` decides, statistics skip non-finite."""
    rtol, atol = tol.rtol, tol.atol
    compute = _compute_dtype(a.dtype)
    if floating:
        close = torch.isclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
    elif (rtol or atol) and a.dtype != torch.bool:
        close = torch.isclose(b, a, rtol=rtol, atol=atol)  # as assert_close judges integers
    else:
        close = a == b
    mismatched = int((~close).sum())
    totals.mismatched += mismatched
    a_c = _as_real(a).to(compute)
    b_c = _as_real(b).to(compute)
    if floating:
        nan_a, nan_b = torch.isnan(a_c), torch.isnan(b_c)
        inf_a, inf_b = torch.isinf(a_c), torch.isinf(b_c)
        inf_mm = (inf_a | inf_b) & (a_c != b_c) & ~(nan_a | nan_b)
        if a.is_complex():
            # Counted per element, as numel and mismatched are (an inf+infj overflow is one
            # element, not two), and a number with a NaN part is NaN, as isclose reads it.
            nan_a, nan_b = nan_a.view(-1, 2).any(-1), nan_b.view(-1, 2).any(-1)
            inf_mm = inf_mm.view(-1, 2).any(-1) & ~(nan_a | nan_b)
        totals.nan_mm += int((nan_a != nan_b).sum())
        totals.inf_mm += int(inf_mm.sum())
        finite = torch.isfinite(a_c) & torch.isfinite(b_c)
    else:
        finite = torch.ones_like(a_c, dtype=torch.bool)
    delta = torch.where(finite, (b_c - a_c).abs(), 0)
    mag = torch.where(finite, a_c.abs(), 0)
    totals.n_finite += int(finite.sum())
    totals.sum_abs += float(delta.sum(dtype=torch.float64))
    # squares in float64: a float32 or bfloat16 |Δ| beyond about 1e19 overflows squared
    totals.sum_sq += float(delta.to(torch.float64).square().sum())
    a_f = torch.where(finite, a_c, 0).to(torch.float64)
    b_f = torch.where(finite, b_c, 0).to(torch.float64)
    totals.sum_aa += float(a_f.square().sum())
    totals.sum_bb += float(b_f.square().sum())
    totals.sum_ab += float(torch.dot(a_f, b_f))
    totals.max_abs = max(totals.max_abs, float(delta.max()))
    totals.max_mag = max(totals.max_mag, float(mag.max()))
    nonzero = mag > 0
    rel = torch.where(nonzero, delta / torch.where(nonzero, mag, 1), 0)
    totals.max_rel = max(totals.max_rel, float(rel.max()))
    totals.need_atol = max(totals.need_atol, float((delta - rtol * mag).max()))
    over_atol = torch.where(nonzero, (delta - atol) / torch.where(nonzero, mag, 1), 0)
    totals.need_rtol = max(totals.need_rtol, float(over_atol.max()))
    totals.impossible_rtol |= bool(((~nonzero) & (delta > atol)).any())
    if a.is_complex():
        return
    excess = torch.where(finite, delta - (atol + rtol * mag), math.inf)
    excess = torch.where(close, -math.inf, excess)
    at_bad = int(excess.argmax())
    at_any = int(delta.argmax())
    bad = (float(excess[at_bad]), at_bad) if mismatched else None
    totals.worst(start, bad, (float(delta[at_any]), at_any))


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
    fast_dtype = ref.dtype in (torch.float32, torch.float64)
    eps = torch.finfo(ref.dtype).eps if floating else 0.0
    totals = _Totals()
    buffers = _Buffers(a_flat, min(chunk_elements, numel)) if fast_dtype and numel else None
    for start in range(0, numel, chunk_elements):
        a = a_flat[start : start + chunk_elements]
        b = b_flat[start : start + chunk_elements]
        if b.device != device:
            b = b.to(device)
        if buffers is not None:
            # Squared norms are needed anyway; a NaN or infinity anywhere makes them non-finite,
            # which sends the chunk down the general path without a separate isfinite pass.
            aa, bb = float(torch.dot(a, a)), float(torch.dot(b, b))
            if (
                math.isfinite(aa)
                and math.isfinite(bb)
                and _fast_chunk(totals, start, a, b, tolerance, buffers, aa, bb)
            ):
                continue
        _general_chunk(totals, start, a, b, tolerance, floating)
    return _finish(totals, a_flat, b_flat, tolerance, eps)


def _finish(
    totals: _Totals, a_flat: torch.Tensor, b_flat: torch.Tensor, tol: Tolerance, eps: float
) -> TensorStats:
    numel = a_flat.numel()
    if numel and not a_flat.is_complex():
        worst = totals.worst_bad[1] if totals.mismatched else totals.worst_any[1]
        worst = max(worst, 0)
        wa = a_flat[worst].to(torch.float64).item()
        wb = b_flat[worst].to(torch.float64).item()
        allowed_at_worst = tol.atol + tol.rtol * abs(wa)
    else:
        worst, wa, wb, allowed_at_worst = 0, math.nan, math.nan, tol.atol
    aa, bb, dd = totals.sum_aa, totals.sum_bb, totals.sum_sq
    if aa == 0 and bb == 0:
        cosine = 1.0
    elif aa == 0 or bb == 0:
        cosine = 0.0
    else:
        norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
        if dd <= min(aa, bb):
            # From |a - b|^2 = |a|^2 + |b|^2 - 2 a.b, written so that near-identical tensors keep
            # digits.
            cosine = 1.0 - (dd - (norm_a - norm_b) ** 2) / (2 * norm_a * norm_b)
        else:  # far apart: the identity would cancel a.b away against |a|^2 + |b|^2
            cosine = totals.sum_ab / (norm_a * norm_b)
        cosine = max(-1.0, min(1.0, cosine))
    # (as a difference of logarithms: aa / dd can underflow to 0 where both are positive)
    snr_db = (
        math.inf if dd == 0 else (10 * (math.log10(aa) - math.log10(dd)) if aa > 0 else -math.inf)
    )
    n_fin = totals.n_finite
    placement_differs = totals.nan_mm or totals.inf_mm
    # Margins cover rounding where isclose evaluates |b - a| and atol + rtol * |a| in the dtype.
    margin = 4 * eps * (totals.max_abs + tol.rtol * totals.max_mag + max(totals.need_atol, 0.0))
    tight_atol = tight_rtol = None
    if not placement_differs:
        tight_atol = max(totals.need_atol, 0.0) * (1 + 4 * eps) + margin
        if not totals.impossible_rtol:
            # isclose scales an integer tensor by rtol in float32: its rounding needs room too
            scaled = eps or torch.finfo(torch.float32).eps
            tight_rtol = max(totals.need_rtol, 0.0) * (1 + 8 * scaled) + (8 * eps if eps else 0.0)
    return TensorStats(
        numel=numel,
        mismatched=totals.mismatched,
        nan_mismatches=totals.nan_mm,
        inf_mismatches=totals.inf_mm,
        max_abs=totals.max_abs,
        mean_abs=totals.sum_abs / n_fin if n_fin else 0.0,
        max_rel=totals.max_rel,
        rmse=math.sqrt(dd / n_fin) if n_fin else 0.0,
        cosine=cosine,
        snr_db=snr_db,
        worst_index=worst,
        worst_ref=wa,
        worst_target=wb,
        allowed_at_worst=allowed_at_worst,
        tight_atol=tight_atol,
        tight_rtol=tight_rtol,
    )

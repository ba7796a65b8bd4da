"""Tolerances as data: per-dtype defaults and the rules for combining them.

The table starts from ``torch.testing.assert_close``'s defaults, and follows its two rules: the
loosest tolerance of the two dtypes applies, and ``rtol``/``atol`` are given together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_workbench.errors import WorkbenchUsageError


@dataclass(frozen=True)
class Tolerance:
    """An element passes when ``|target - ref| <= atol + rtol * |ref|``."""

    rtol: float
    atol: float

    def allowed(self, reference_magnitude: float) -> float:
        """The largest absolute difference allowed at an element of this magnitude."""
        return self.atol + self.rtol * reference_magnitude


EXACT = Tolerance(0.0, 0.0)

#: Defaults per floating dtype (``torch.testing.assert_close``'s table); other dtypes compare exactly.
DTYPE_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float16: Tolerance(1e-3, 1e-5),
    torch.bfloat16: Tolerance(1.6e-2, 1e-5),
    torch.float32: Tolerance(1.3e-6, 1e-5),
    torch.float64: Tolerance(1e-7, 1e-7),
    torch.complex32: Tolerance(1e-3, 1e-5),
    torch.complex64: Tolerance(1.3e-6, 1e-5),
    torch.complex128: Tolerance(1e-7, 1e-7),
}

#: Python floats in a cell almost always come from ``.item()`` of a float32 tensor, so they get the
#: float32 row rather than float64's, which no accelerator could meet.
PYTHON_FLOAT_DTYPE = torch.float32


def default_tolerance(*dtypes: torch.dtype | None) -> Tolerance:
    """The loosest default tolerance over ``dtypes`` (exact for integer and boolean dtypes)."""
    rows = [DTYPE_TOLERANCES.get(d, EXACT) for d in dtypes if d is not None]
    if not rows:
        return EXACT
    return Tolerance(max(r.rtol for r in rows), max(r.atol for r in rows))


def check_pair(rtol: float | None, atol: float | None) -> None:
    """Reject a lone ``rtol`` or ``atol``: a lone ``atol=0`` would still pass the default ``rtol``."""
    if (rtol is None) != (atol is None):
        raise WorkbenchUsageError("give --rtol and --atol together, or neither")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:
            raise WorkbenchUsageError(f"{name} must be a non-negative number, got {value}")


def resolve(
    ref_dtype: torch.dtype | None,
    target_dtype: torch.dtype | None,
    rtol: float | None = None,
    atol: float | None = None,
) -> Tolerance:
    """The tolerance for one output: the user's pair if given, else the dtype defaults."""
    check_pair(rtol, atol)
    if rtol is not None and atol is not None:
        return Tolerance(float(rtol), float(atol))
    return default_tolerance(ref_dtype, target_dtype)

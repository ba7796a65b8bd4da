"""Tolerances as data: per-dtype tables, named presets, per-output overrides.

The default table is ``torch.testing.assert_close``'s, and the rules are its two: the loosest
tolerance of the two dtypes applies, and ``rtol``/``atol`` are given together or not at all.
Presets and the float8 rows are ours (the vendors publish no tolerance guidance; see
``shared/notes/torchneuron.md`` §7 and §14), and say so in their descriptions.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from neuron_workbench.errors import OptionError, WorkbenchUsageError


@dataclass(frozen=True)
class Tolerance:
    """An element passes when ``|target - ref| <= atol + rtol * |ref|``."""

    rtol: float
    atol: float

    def allowed(self, reference_magnitude: float) -> float:
        """The largest absolute difference allowed at an element of this magnitude."""
        return self.atol + self.rtol * reference_magnitude


EXACT = Tolerance(0.0, 0.0)

#: ``torch.testing.assert_close``'s defaults; other dtypes (integers, bool) compare exactly.
DTYPE_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float16: Tolerance(1e-3, 1e-5),
    torch.bfloat16: Tolerance(1.6e-2, 1e-5),
    torch.float32: Tolerance(1.3e-6, 1e-5),
    torch.float64: Tolerance(1e-7, 1e-7),
    torch.complex32: Tolerance(1e-3, 1e-5),
    torch.complex64: Tolerance(1.3e-6, 1e-5),
    torch.complex128: Tolerance(1e-7, 1e-7),
}
# float8 rows (ours): rtol is the format's machine epsilon, atol its smallest normal number.
for _name, _tol in (
    ("float8_e4m3fn", Tolerance(0.125, 2.0**-6)),
    ("float8_e4m3fnuz", Tolerance(0.125, 2.0**-7)),
    ("float8_e5m2", Tolerance(0.25, 2.0**-14)),
    ("float8_e5m2fnuz", Tolerance(0.25, 2.0**-15)),
):
    if hasattr(torch, _name):
        DTYPE_TOLERANCES[getattr(torch, _name)] = _tol

_FLOATS32_AND_UP = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _preset(
    base: Mapping[torch.dtype, Tolerance], **rows: Tolerance
) -> dict[torch.dtype, Tolerance]:
    table = dict(base)
    for dtype in _FLOATS32_AND_UP:
        key = "fp32" if dtype in (torch.float32, torch.complex64) else "fp64"
        if key in rows:
            table[dtype] = rows[key]
    return table


@dataclass(frozen=True)
class Preset:
    """A named dtype table with a sentence saying where its numbers come from."""

    name: str
    description: str
    table: Mapping[torch.dtype, Tolerance] = field(repr=False)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("default", "torch.testing.assert_close's per-dtype defaults", DTYPE_TOLERANCES),
        Preset("strict", "bitwise equality for every dtype", {}),
        Preset(
            "fp32-accelerator",
            "ours: float32 (and float64, which Trainium computes as float32) within rtol 1e-4, "
            "atol 1e-5, the range TorchNeuron's own tests use for fp32 element-wise ops",
            _preset(DTYPE_TOLERANCES, fp32=Tolerance(1e-4, 1e-5), fp64=Tolerance(1e-4, 1e-5)),
        ),
        Preset(
            "bf16-autocast",
            "ours: every float output judged at bfloat16 precision (rtol 1.6e-2, atol 1e-3), for "
            "cells under bf16 autocast or TPU's default 1-pass bf16 matmuls",
            _preset(
                {
                    **DTYPE_TOLERANCES,
                    torch.bfloat16: Tolerance(1.6e-2, 1e-3),
                    torch.float16: Tolerance(1.6e-2, 1e-3),
                },
                fp32=Tolerance(1.6e-2, 1e-3),
                fp64=Tolerance(1.6e-2, 1e-3),
            ),
        ),
    )
}

#: Python floats in a cell almost always come from ``.item()`` of a float32 tensor, so they get the
#: float32 row rather than float64's, which no accelerator could meet.
PYTHON_FLOAT_DTYPE = torch.float32


def dtype_named(name: str | None) -> torch.dtype | None:
    """The torch dtype a report names (``"float32"``, ``"int64"``), or None for no such dtype.

    Parameters
    ----------
    name : str or None
        A dtype's name as reports and artifacts write it (``str(dtype)`` without ``torch.``).

    Returns
    -------
    torch.dtype or None
        The dtype; None for None, an empty name, or a name that is no dtype of this torch.
    """
    found = getattr(torch, name, None) if name else None
    return found if isinstance(found, torch.dtype) else None


def default_tolerance(*dtypes: torch.dtype | None, preset: str = "default") -> Tolerance:
    """The loosest tolerance over ``dtypes`` in ``preset`` (exact where the table has no row)."""
    table = PRESETS[preset].table
    rows = [table.get(d, EXACT) for d in dtypes if d is not None]
    if not rows:
        return EXACT
    return Tolerance(max(r.rtol for r in rows), max(r.atol for r in rows))


def check_pair(rtol: float | None, atol: float | None) -> None:
    """Reject a lone ``rtol`` or ``atol``: a lone ``atol=0`` would still pass the default ``rtol``."""
    if (rtol is None) != (atol is None):
        raise OptionError("give {0} and {1} together, or neither", "rtol", "atol")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:
            raise OptionError("{0} must be a non-negative number, got {value}", name, value=value)


def parse_override(text: str) -> tuple[str, Tolerance]:
    """Parse ``PATH=RTOL,ATOL`` (one ``per_output`` tolerance) into a pattern and a tolerance."""
    pattern, sep, values = text.partition("=")
    parts = values.split(",")
    if not sep or not pattern.strip() or len(parts) != 2:
        raise OptionError("{0} expects PATH=RTOL,ATOL, got {text!r}", "per_output", text=text)
    try:
        rtol, atol = float(parts[0]), float(parts[1])
    except ValueError:
        raise OptionError(
            "{0} expects numbers in PATH=RTOL,ATOL, got {text!r}", "per_output", text=text
        ) from None
    check_pair(rtol, atol)
    return pattern.strip(), Tolerance(rtol, atol)


def _matches(pattern: str, path: str) -> bool:
    if path == pattern or path.startswith((pattern + ".", pattern + "[")):
        return True
    return any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(path, pattern)


@dataclass(frozen=True)
class TolerancePolicy:
    """Everything that decides an output's tolerance.

    Attributes
    ----------
    preset : str
        Name of the dtype table (see :data:`PRESETS`).
    rtol, atol : float or None
        One pair for every output (both or neither); overrides the preset.
    per_output : tuple of (str, Tolerance)
        Overrides by output path: an exact path (``logits``), a prefix of nested outputs
        (``model`` covers ``model.fc.weight``) or a glob (``model.*.grad``). The longest matching
        pattern wins over ``rtol``/``atol`` and the preset.
    precision_floor : tuple of torch.dtype
        Lower precisions the runs computed in (autocast's dtypes): a floating output's default
        tolerance is at least theirs, since it went through them. Only the ``default`` preset
        applies it; ``rtol``/``atol``, other presets and overrides win.
    """

    preset: str = "default"
    rtol: float | None = None
    atol: float | None = None
    per_output: tuple[tuple[str, Tolerance], ...] = ()
    precision_floor: tuple[torch.dtype, ...] = ()

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            known = ", ".join(PRESETS)
            raise WorkbenchUsageError(
                f"unknown tolerance preset {self.preset!r}; choose one of: {known}"
            )
        check_pair(self.rtol, self.atol)

    def for_output(
        self, path: str, ref_dtype: torch.dtype | None, target_dtype: torch.dtype | None
    ) -> Tolerance:
        """The tolerance of the output at ``path``."""
        matching = [(p, t) for p, t in self.per_output if _matches(p, path)]
        if matching:
            return max(matching, key=lambda item: len(item[0]))[1]
        if self.rtol is not None and self.atol is not None:
            return Tolerance(float(self.rtol), float(self.atol))
        if self.floors(ref_dtype, target_dtype):
            return default_tolerance(ref_dtype, target_dtype, *self.precision_floor)
        return default_tolerance(ref_dtype, target_dtype, preset=self.preset)

    def floors(self, *dtypes: torch.dtype | None) -> bool:
        """Whether :attr:`precision_floor` applies to an output of these dtypes."""
        return (
            bool(self.precision_floor)
            and self.preset == "default"
            and self.rtol is None
            and any(d is not None and (d.is_floating_point or d.is_complex) for d in dtypes)
        )

    def floor_note(self) -> str | None:
        """One sentence saying that (and how) autocast loosened the default tolerances."""
        if not (self.precision_floor and self.preset == "default" and self.rtol is None):
            return None
        names = ", ".join(str(d).removeprefix("torch.") for d in self.precision_floor)
        tol = default_tolerance(*self.precision_floor)
        return (
            f"autocast ({names}) was active: floating outputs are judged at {names}'s tolerance "
            f"(rtol {tol.rtol:.1e}, atol {tol.atol:.1e}), the lowest precision they went "
            "through; per-output tolerances, a preset or rtol/atol set others"
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (recorded in reports)."""
        return {
            "preset": self.preset,
            "rtol": self.rtol,
            "atol": self.atol,
            "per_output": {p: [t.rtol, t.atol] for p, t in self.per_output},
            "precision_floor": [str(d).removeprefix("torch.") for d in self.precision_floor],
        }

"""Two runs' op profiles joined by op: times, ratio, calls, bytes, fallback flag (pandas).

Reads what :mod:`neuron_workbench.trace.profile` recorded (objects or their JSON form); pandas is
imported only when a diff is made.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from neuron_workbench.opnames import normalize_op
from neuron_workbench.trace.profile_data import OpProfile, OpStat, as_profile

if TYPE_CHECKING:
    import pandas

__all__ = ["DIFF_COLUMNS", "profile_diff", "top_ops"]


def _phase_rows(profile: OpProfile, phase: str) -> list[OpStat]:
    if phase == "all":
        return profile.rows
    if phase == "first":
        return profile.first_call if profile.first_call is not None else profile.rows
    if phase == "steady":
        return profile.steady if profile.steady is not None else profile.rows
    raise ValueError(f"phase must be 'steady', 'first' or 'all', not {phase!r}")


DIFF_COLUMNS = [
    "op", "ref_time_s", "target_time_s", "ratio", "ref_calls", "target_calls", "ref_bytes",
    "target_bytes", "fallback", "ref_shapes", "target_shapes",
]  # fmt: skip


def profile_diff(
    ref: OpProfile | dict[str, Any],
    target: OpProfile | dict[str, Any],
    fallback_ops: Iterable[str] = (),
    *,
    phase: str = "steady",
) -> pandas.DataFrame:
    """Join two runs' op profiles by op: times, ratio, calls, bytes, fallback flag.

    Parameters
    ----------
    ref, target : OpProfile or dict
        The reference and target profiles (objects or their ``to_dict()`` form).
    fallback_ops : iterable of str
        Ops that fell back to the CPU on the target (``aten::sort`` or ``sort``); rows whose
        target ``fallback`` flag is set count too.
    phase : {"steady", "first", "all"}
        Which rows of repeated runs to join; profiles without repetitions use all rows.

    Returns
    -------
    pandas.DataFrame
        One row per op seen in either run, target time descending. ``ratio`` is target time over
        reference time (NaN where either is missing or zero). ``df.attrs["time_kind"]`` names what
        each side's times measure (``host CPU time`` for emulated devices).
    """
    import pandas as pd

    ref_p, target_p = as_profile(ref), as_profile(target)
    fell_back = {normalize_op(op) for op in fallback_ops}
    fell_back |= {row.op for row in _phase_rows(target_p, phase) if row.fallback}
    ref_rows = {row.op: row for row in _phase_rows(ref_p, phase)}
    target_rows = {row.op: row for row in _phase_rows(target_p, phase)}
    records = []
    for op in sorted(set(ref_rows) | set(target_rows)):
        r, t = ref_rows.get(op), target_rows.get(op)
        ref_time = r.self_time_s if r else 0.0
        target_time = t.self_time_s if t else 0.0
        ratio = target_time / ref_time if (r and t and ref_time > 0) else math.nan
        records.append(
            {
                "op": op,
                "ref_time_s": ref_time,
                "target_time_s": target_time,
                "ratio": ratio,
                "ref_calls": r.calls if r else 0,
                "target_calls": t.calls if t else 0,
                "ref_bytes": r.bytes_allocated if r else 0,
                "target_bytes": t.bytes_allocated if t else 0,
                "fallback": op in fell_back,
                "ref_shapes": r.shapes if r else "",
                "target_shapes": t.shapes if t else "",
            }
        )
    df = pd.DataFrame.from_records(records, columns=DIFF_COLUMNS)
    df = df.sort_values(["target_time_s", "op"], ascending=[False, True], ignore_index=True)
    df.attrs["time_kind"] = {"ref": ref_p.time_kind, "target": target_p.time_kind}
    df.attrs["backends"] = {"ref": ref_p.backend, "target": target_p.backend}
    return df


def top_ops(df: pandas.DataFrame, n: int = 10, by: str = "target_time_s") -> pandas.DataFrame:
    """The ``n`` rows of a :func:`profile_diff` frame with the largest ``by`` (NaN last)."""
    out = df.sort_values([by, "op"], ascending=[False, True], na_position="last").head(n)
    out = out.reset_index(drop=True)
    out.attrs.update(df.attrs)
    return out

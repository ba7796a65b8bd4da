"""The display model: what every renderer of report data reads, kept in one place.

Report data (``Report.to_dict()``) carries its display facts: each run's ``label`` (``neuron
(emulated)``, ``cpu (as cuda)``; :attr:`BackendInfo.label <neuron_workbench.backends.base.BackendInfo.label>`
is the one derivation), each run's ``time_kind`` (what its ``wall_time_s`` measures) and each op
profile's own ``time_kind``; quantities carry their unit in the key (``*_s`` seconds, ``*_bytes``
bytes). The renderers (``report/html.py``, ``views/tables.py``, ``views/figures.py`` and the
JupyterLab extension's ``src/charts.js``) read these keys through the accessors here (or their
JavaScript twins) rather than deriving them from backend facts; data of schema version 1, which has
no ``label``, gets one from the backend it describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuron_workbench.backends.base import BackendInfo
from neuron_workbench.trace.profile_data import HOST_CPU_TIME, WALL_TIME

__all__ = [
    "NEUTRAL_COLOR",
    "NOT_COMPARED_STATUS",
    "UNCOMPARED",
    "VERDICTS",
    "VERDICT_COLORS",
    "format_bytes",
    "op_time_kind",
    "output_fails",
    "output_judged_status",
    "output_status_class",
    "run_label",
    "run_time_kind",
    "verdict_color",
]

#: Verdict of a report whose runs both finished but compared nothing: the cell bound no comparable
#: output, or only outputs that could not be compared (status ``not-compared``). Never a pass.
UNCOMPARED = "UNCOMPARED"
#: Every verdict a report can have (``Report.verdict``), in the order summaries count them.
VERDICTS = ("PASS", "FAIL", "ERROR", UNCOMPARED)
#: Colour of notes, of the ``UNCOMPARED`` verdict and of an unknown verdict.
NEUTRAL_COLOR = "#57606a"
#: Badge colour of each verdict.
VERDICT_COLORS = {
    "PASS": "#1a7f37",
    "FAIL": "#cf222e",
    "ERROR": "#9a6700",
    UNCOMPARED: NEUTRAL_COLOR,
}


#: An output's status when it could not be compared (``neuron_workbench.compare.NOT_COMPARED``,
#: spelled here so that renderers need not import torch).
NOT_COMPARED_STATUS = "not-compared"


def verdict_color(verdict: Any) -> str:
    """The badge colour of ``verdict`` (:data:`NEUTRAL_COLOR` for anything else)."""
    return VERDICT_COLORS.get(str(verdict), NEUTRAL_COLOR)


def output_status_class(status: Any) -> str:
    """CSS class of an output's status: ``ok`` (match), ``na`` (not compared) or ``bad``."""
    if status == "match":
        return "ok"
    return "na" if status == NOT_COMPARED_STATUS else "bad"


def output_fails(output: Mapping[str, Any]) -> bool:
    """Whether an output (one of report data's ``outputs``) counts as a failure of the verdict.

    Under ``--judge budget`` a floating output whose R was measured carries ``budget_judged``
    (``within`` or ``beyond``), which decides, whatever its tolerance's ``status`` says; every other
    output fails when it was compared and did not match. A weight judged by its gradients
    (``explained``) keeps its row among the failures, marked as such.
    """
    judged = output.get("budget_judged")
    if judged:
        return judged == "beyond"
    return output.get("status") not in ("match", NOT_COMPARED_STATUS)


def output_judged_status(output: Mapping[str, Any]) -> tuple[str, str]:
    """An output's status as the verdict judged it: its CSS class and its text.

    The tolerance's ``status`` (``match``, ``differ``, ...) unless the precision budget judged the
    output the other way: then ``beyond budget`` or ``within budget``, with the tolerance's status.
    """
    status = str(output.get("status", ""))
    judged = output.get("budget_judged")
    fails = output_fails(output)
    if judged and fails != (output_status_class(status) == "bad"):
        return ("bad" if fails else "ok"), f"{judged} budget (tolerance: {status})"
    return output_status_class(status), status


def run_time_kind(emulated: bool) -> str:
    """What a run's wall time measures: host CPU time on an emulated device, else wall time."""
    return HOST_CPU_TIME if emulated else WALL_TIME


def run_label(run: Mapping[str, Any], default: str = "?") -> str:
    """How renderers name a run's backend: its ``label`` (from its backend in older data).

    Parameters
    ----------
    run : mapping
        ``data["ref"]`` or ``data["target"]`` of report data.
    default : str
        The label of a run without a backend.

    Returns
    -------
    str
        E.g. ``neuron (emulated)`` or ``cpu (as cuda)``.
    """
    if run.get("label"):
        return str(run["label"])
    backend = run.get("backend") or {}
    if not backend.get("name"):
        return default
    return BackendInfo(
        name=str(backend["name"]),
        device=str(backend.get("device", "")),
        device_name=str(backend.get("device_name", "")),
        emulated=bool(backend.get("emulated", False)),
        details=dict(backend.get("details") or {}),
    ).label


def op_time_kind(run: Mapping[str, Any]) -> str:
    """What a run's op times measure: its profile's ``time_kind``, else the run's own."""
    profile = run.get("profile") or {}
    if profile.get("time_kind"):
        return str(profile["time_kind"])
    if run.get("time_kind"):
        return str(run["time_kind"])
    return run_time_kind(bool((run.get("backend") or {}).get("emulated")))


def format_bytes(value: Any) -> str:
    """``12.3 KiB`` (binary units); ``n/a`` for None."""
    if value is None:
        return "n/a"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def largest_difference(entry: Mapping[str, Any], key: str = "max_abs") -> Any:
    """What a table shows as an output's or a scalar site's largest difference (``key``).

    The report's figures are over the elements finite on both sides; where one side is NaN (or
    infinite) and the other is not, the difference there is NaN (or infinite), which a table must
    show rather than the finite elements' 0.
    """
    if entry.get("nan_mismatches"):
        return "nan"
    if entry.get("inf_mismatches"):
        return "inf"
    ref, target = entry.get("ref"), entry.get("target")
    if isinstance(ref, list) and isinstance(target, list):  # a scalar site's two series
        kinds = set()
        for a, b in zip(ref, target):
            if _non_finite(a) != _non_finite(b):
                kinds |= {_non_finite(a), _non_finite(b)} - {None}
        if kinds:
            return "nan" if "nan" in kinds else "inf"
    return entry.get(key)


def _non_finite(value: Any) -> str | None:
    """``"nan"``, ``"inf"`` for such a number (or its JSON text), else None."""
    text = str(value).lower().lstrip("+-")
    if text in ("nan", "inf", "infinity"):
        return "inf" if text.startswith("inf") else "nan"
    return None

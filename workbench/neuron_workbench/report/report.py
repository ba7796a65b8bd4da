"""The result of one ``%%neuron`` cell: two runs, their comparison, and a verdict."""

from __future__ import annotations

import hashlib
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.backends.base import BackendInfo
from neuron_workbench.compare import Comparison
from neuron_workbench.report.display import UNCOMPARED, VERDICTS, run_time_kind
from neuron_workbench.report.schema import SCHEMA_VERSION
from neuron_workbench.run.records import Run, recorded
from neuron_workbench.run.script import script_name
from neuron_workbench.sites import program_line
from neuron_workbench.version import __version__

__all__ = ["REPORT_MIME", "UNCOMPARED", "VERDICTS", "Report"]

#: MIME type of the machine-readable report in a cell's output (see ``report.schema.json``).
REPORT_MIME = "application/vnd.neuron-workbench.report+json"


def _plural(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


def measurement_basis(kind: str, backend: BackendInfo) -> str:
    """What a measurement of ``kind`` on ``backend`` is, in words (shown next to its value).

    Timings on an emulated device or on the cpu reference are host CPU time; emulated memory
    figures are the emulator's accounting, the cpu reference's its own accounting of the tensors
    it allocated.
    """
    stands_in = backend.details.get("stands_in_for")
    if kind == "time":
        if backend.emulated:
            return "host CPU time (emulated device)"
        if backend.name == "cpu":
            return (
                f"host CPU time (cpu standing in for {stands_in})" if stands_in else "host CPU time"
            )
        return "wall time on the device's host"
    if kind == "memory":
        if backend.emulated:
            return "the emulator's accounting of live device tensors"
        if backend.name == "cpu":
            return "this run's accounting of the tensor storages it allocated on the host"
        return "the device allocator's statistics"
    if backend.emulated or stands_in:
        return "as the stand-in reports it (not a GPU's)"
    return "as the device reports it"


#: The warning of a report whose target put nothing on its device.
IDLE_TARGET = (
    "nothing this cell computed was on {target}: its tensors stayed on the CPU in both runs, so the "
    "comparison was of the CPU against the CPU. A device chosen in a plain cell from "
    "torch.cuda.is_available() is the CPU in a kernel without a GPU: choose it inside a %%neuron "
    'cell, or write "cuda".'
)


@dataclass(frozen=True)
class Report:
    """Reference run, target run, and how their outputs compare: finished when built.

    ``bool(report)`` is True exactly when the verdict is ``PASS``. The ``text/plain`` form is one
    deterministic line (verdict and counts, never timings), safe to check in notebooks under nbval.
    The verdict is one of :data:`VERDICTS`; see :attr:`verdict`.
    """

    ref: Run
    target: Run
    comparison: Comparison | None
    cell_source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: Per-module comparison (``--layers``); see :mod:`neuron_workbench.compare.layer_divergence`.
    layers: Any = None
    #: Migration findings for the cell's source (scanner data), shown in the Migration tab.
    migration: dict[str, Any] | None = None
    #: How the runs were compared beyond the verdict: autocast's tolerance floor, and how a
    #: reference stood in for another device (``cpu (as cuda)``) with what stays different.
    notes: list[str] = field(default_factory=list)
    #: The target put nothing on its device (its peak device memory was 0 while the cell's outputs
    #: hold tensors): the comparison was of the CPU against the CPU (see :data:`IDLE_TARGET`).
    idle_target: bool = False
    #: Each floating output's noise floor and error ratio R (:mod:`neuron_workbench.compare.budget`):
    #: measured for every floating output under ``judge="budget"``, for the failing ones otherwise.
    budget: Any = None
    #: The scalars both runs materialised, aligned by call site and occurrence (the loss curves;
    #: :mod:`neuron_workbench.compare.scalars`); None when neither run made one.
    scalars: Any = None
    #: ``--compile-check``: the report of the same cell with ``torch.compile`` off on both sides
    #: (:mod:`neuron_workbench.run.compile_check`); None when not asked for.
    compile_check: Any = None

    @property
    def scalars_part(self) -> bool:
        """True when the runs' observed scalars (a loss curve) part somewhere."""
        return self.scalars is not None and self.scalars.parted

    @property
    def judge(self) -> str:
        """``tolerance`` or ``budget``: how floating outputs were judged (the ``judge`` option)."""
        return str(self.options.get("judge", "tolerance"))

    def judged_failures(self) -> list[Any]:
        """The compared outputs that fail the verdict.

        Under ``judge="budget"`` a floating output with a measured R fails exactly when R is beyond
        budget (whatever its tolerance says); every other output fails as its tolerance says.
        """
        if self.comparison is None:
            return []
        if self.judge != "budget" or self.budget is None:
            return [d for d in self.comparison.failures if not d.explained]
        failures = []
        for diff in self.comparison.compared:
            if diff.explained:
                continue  # judged by its gradients (optimizer amplification), as under tolerance
            measured = self.budget.get(diff.path)
            failed = diff.failed
            if (measured is not None and not measured.within) or (measured is None and failed):
                failures.append(diff)
        return failures

    @property
    def first_divergence(self) -> Any:
        """The module call where a difference was born (``.module``, ``.call``, ``.error``), or None.

        Only known with ``--layers``.
        """
        return self.layers.first if self.layers is not None else None

    @property
    def verdict(self) -> str:
        """The cell's verdict, one of :data:`VERDICTS`.

        ``ERROR`` when a run raised; else :data:`UNCOMPARED` when nothing was compared (the cell
        bound no comparable output, or only outputs with status ``not-compared``); else ``PASS``
        when every compared output matched and ``FAIL`` when one did not. Outputs that were not
        compared never make a verdict ``FAIL``; the summary line counts them. Neither does a
        weight whose difference is an Adam step's amplification of gradients that matched
        (``OutputDiff.explained``; the summary counts it). Under
        ``--judge budget`` floating outputs pass or fail by their error ratio R
        (:meth:`judged_failures`). Scalars the runs materialised (``loss.item()``) count as
        compared: where they part the verdict is ``FAIL``.
        """
        if not (self.ref.ok and self.target.ok) or self.comparison is None:
            return "ERROR"
        if not self.comparison.compared and not (self.scalars is not None and self.scalars.sites):
            return UNCOMPARED
        return "FAIL" if self.judged_failures() or self.scalars_part else "PASS"

    def __bool__(self) -> bool:
        return self.verdict == "PASS"

    @property
    def title(self) -> str:
        """``neuron (emulated) vs cpu``: target first, then the reference."""
        return f"{self.target.backend.label} vs {self.ref.backend.label}"

    def summary(self) -> str:
        """The one-line verdict shown as ``text/plain``."""
        return self._summary(self.verdict)

    def _summary(self, verdict: str) -> str:
        """:meth:`summary` of this report, whose :attr:`verdict` is ``verdict``."""
        if verdict == "ERROR":
            parts = []
            for run in (self.ref, self.target):
                if run.error is not None:
                    places = [program_line(self.script, run.error.lineno)] * bool(run.error.lineno)
                    if run.error.raised_in:  # below the cell: a notebook's class, a module
                        places.append(run.error.raised_in)
                    where = f" ({', '.join(places)})" if places else ""
                    parts.append(f"{run.backend.name} raised {run.error.summary}{where}")
            body = "; ".join(parts)
        elif verdict == UNCOMPARED:
            assert self.comparison is not None
            skipped = self.comparison.not_compared
            body = "0 outputs compared"
            if skipped:
                body += f"; {len(skipped)} not compared: {skipped[0].headline()}"
                if len(skipped) > 1:
                    body += f" (+{len(skipped) - 1} more)"
        elif not self.comparison.compared:  # only the observed scalars were compared
            body = self._scalars_line()
            # as with compared outputs: the line said nothing of the ones left out (a model the
            # target's worker could not send back), a PASS that read as a complete one
            if self.comparison.not_compared:
                body += f"; {len(self.comparison.not_compared)} not compared"
        else:
            assert self.comparison is not None
            compared = self.comparison.compared
            failures = self.judged_failures()
            body = ""
            if self.judge == "budget" and verdict == "PASS" and self.budget is not None:
                body = _within_budget(self.budget, {d.path for d in compared if d.explained})
            judged = {id(d) for d in failures}
            passing = [d for d in self.comparison.failures if id(d) not in judged]
            # judged by their gradients: past their tolerance, or (--judge budget) past their budget
            amplified = len([d for d in compared if d.explained and id(d) not in judged])
            within = sum(not d.explained for d in passing)
            matched = len(compared) - len(failures) - within - amplified
            body += f"{_plural(len(compared), 'output', 'outputs')}, {matched} match"
            if amplified:
                by = "budget" if self.judge == "budget" and self.budget is not None else "tolerance"
                body += f", {amplified} within {by} by their gradients (optimizer amplification)"
            if within:
                body += f", {within} within budget"
            if failures:
                verb = "differs" if len(failures) == 1 else "differ"
                body += f", {len(failures)} {verb}: {self._failure_line(failures[0])}"
                if len(failures) > 1:
                    body += f" (+{len(failures) - 1} more)"
            skipped = self.comparison.not_compared
            if skipped:
                body += f"; {len(skipped)} not compared"
            if self.scalars_part:
                body += f"; {self._scalars_line()}"
        if self.comparison is not None and self.comparison.measurements:
            count = len(self.comparison.measurements)
            body += f"; {_plural(count, 'measurement', 'measurements')} shown, not compared"
        fallback_ops = self.target.fallback_ops()
        if fallback_ops:
            body += f"; {_plural(len(fallback_ops), 'op', 'ops')} fell back to CPU"
        if self.idle_target:
            body += f"; nothing ran on {self.target.backend.name}"
        first = self.first_divergence
        backward = self.layers.first_backward if self.layers is not None else None
        if verdict == "FAIL" and first is not None:
            body += f"; first divergence at {first.label}"
        elif verdict == "FAIL" and backward is not None:
            body += f"; first divergence at {backward.label} (backward)"
        if self.compile_check is not None:
            body += f"; with torch.compile off: {self.compile_check.verdict}"
        return f"{verdict} {self.title} — {body}"

    @property
    def script(self) -> str | None:
        """The file name of the script the runs ran (``train.py``), or None for a notebook cell.

        Known from either run's ``script`` record (``neuron-workbench run SCRIPT``, and a script's
        recordings that ``compare`` reads).
        """
        for run in (self.ref, self.target):
            extras = run.extras if isinstance(run.extras, dict) else {}
            name = script_name(extras.get("script"))
            if name:
                return name
        return None

    def _scalars_line(self) -> str:
        """The observed scalars' summary, with the short cause where they part and one is known."""
        line = self.scalars.summary()
        first = self.scalars.first
        notes = [_short_cause(first.hints)] if first is not None else []
        if first is not None and first.ratio is not None:  # the budget's oracle ran anyway
            notes.append(f"R {first.ratio:.3g}, {first.budget_label}")
        notes = [note for note in notes if note]
        return line + (f" ({'; '.join(notes)})" if notes else "")

    def _failure_line(self, diff: Any) -> str:
        """The first failure in the summary: its headline, or under the budget judge its R.

        Under the tolerance judge the line is unchanged; R is in the report's data and HTML.
        """
        measured = self.budget.get(diff.path) if self.budget is not None else None
        if measured is None or self.judge != "budget":
            return diff.headline()
        cause = _short_cause(diff.hints)
        return measured.describe() + (f" ({cause})" if cause else "")

    def __repr__(self) -> str:
        return f"<Report {self.summary()}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the documented report schema)."""
        source = self.cell_source
        verdict = self.verdict  # its summary line starts with it: worked out once
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "neuron-workbench.report",
            "workbench_version": __version__,
            "verdict": verdict,
            "summary": self._summary(verdict),
            "title": self.title,
            "ref": _run_dict(self.ref),
            "target": _run_dict(self.target),
            "outputs": self._output_dicts(),
            "counts": self.comparison.counts() if self.comparison else {},
            "fallback_ops": self.target.fallback_ops(),
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "layers": self.layers.to_dict() if self.layers is not None else None,
            "training": _training(self.ref, self.target, self.comparison),
            "measurements": self.measurements(),
            "migration": self.migration,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "budget": self.budget.to_dict() if self.budget is not None else None,
            "scalars": self.scalars.to_dict() if self.scalars is not None else None,
            **({"compile_check": _compile_check(self)} if self.compile_check is not None else {}),
            "options": dict(self.options),
            "cell": {"source": source, "sha256": hashlib.sha256(source.encode()).hexdigest()},
        }

    def _output_dicts(self) -> list[dict[str, Any]]:
        """Each output's data; under ``--judge budget`` with the budget's judgment of it.

        Its ``status`` is the tolerance's; where R was measured ``budget_judged`` (``within`` or
        ``beyond``) is what the verdict counted (:meth:`judged_failures`), so that renderers
        do not list as matching an output that failed the verdict.
        """
        if self.comparison is None:
            return []
        outputs = [d.to_dict() for d in self.comparison.diffs]
        if self.judge != "budget" or self.budget is None:
            return outputs
        for diff, data in zip(self.comparison.diffs, outputs):
            measured = self.budget.get(diff.path)
            if measured is not None and diff.compared and not diff.explained:
                data["budget_judged"] = "within" if measured.within else "beyond"
        return outputs

    def measurements(self) -> list[dict[str, Any]]:
        """The outputs that are measurements, as plain records, with what each run's value is.

        Each record: ``path``, ``kind`` (``time``, ``memory``, ``device``), ``source`` (the call),
        ``unit`` (None where unknown), ``ref`` and ``target`` (the values), ``ref_basis`` and
        ``target_basis`` (what the value is on that backend, see :func:`measurement_basis`).
        """
        if self.comparison is None:
            return []
        records = []
        for item in self.comparison.measurements:
            record = item.to_dict()
            record["ref_basis"] = measurement_basis(item.kind, self.ref.backend)
            record["target_basis"] = measurement_basis(item.kind, self.target.backend)
            records.append(record)
        return records

    def _repr_html_(self) -> str:
        from neuron_workbench.report.html import render_report_html

        return render_report_html(self.to_dict())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data = self.to_dict()
        from neuron_workbench.report.html import render_report_html

        return {
            "text/plain": data["summary"],
            "text/html": render_report_html(data),
            REPORT_MIME: data,
        }


#: Short names of the causes the summary line appends to an output's R, by the start of the hint
#: (``report.hints``) that gives the evidence for them.
_SHORT_CAUSES = (
    ("TPU fp32 matmuls default to 1-pass bfloat16", "TPU 1-pass bf16 matmuls"),
    ("the bf16 what-if policy was on", "bf16 what-if matmuls"),
    ("TF32:", "TF32 matmuls"),
    ("float64 is computed as float32 on neuron", "float64 computed as float32"),
    ("int64 arithmetic runs as int32 on neuron", "int64 computed as int32"),
)


def _short_cause(hints: list[str]) -> str:
    for hint in hints:
        for start, cause in _SHORT_CAUSES:
            if hint.startswith(start):
                return cause
    return ""


def _compile_check(report: Report) -> dict[str, Any]:
    """Both verdicts of ``--compile-check``: as written (compiled) and with torch.compile off."""
    eager = report.compile_check
    return {
        "compiled": report.verdict,
        "eager": eager.verdict,
        "eager_summary": eager.summary(),
        "eager_failures": [d.to_dict() for d in eager.judged_failures()],
        "eager_errors": {
            role: run.error.summary
            for role, run in (("ref", eager.ref), ("target", eager.target))
            if run.error is not None
        },
    }


def _within_budget(budget: Any, explained: Container[str] = ()) -> str:
    """``within precision budget (worst R 1.1 at loss): `` (empty when nothing was measured).

    Outputs judged by their gradients (``explained``) are counted apart, not as the worst R.
    """
    worst = max(
        (o for o in budget.outputs if o.path not in explained), key=lambda o: o.ratio, default=None
    )
    if worst is None:
        return ""
    return f"within precision budget (worst R {worst.factor} at {worst.path}): "


def _training(ref: Run, target: Run, comparison: Comparison | None) -> dict[str, Any] | None:
    """Per-step scalars of both runs (``--steps N``), for loss curves and per-step divergence.

    Measurements (a step's time, its peak memory) are not curves to compare and are left out.
    """
    if not ref.steps or not target.steps:
        return None
    measured = {m.path for m in comparison.measurements} if comparison is not None else set()
    names = [
        n
        for n in ref.steps[0]
        if n not in measured and all(n in step for step in ref.steps + target.steps)
    ]
    series = {}
    for name in names:
        a = [step[name] for step in ref.steps]
        b = [step[name] for step in target.steps]
        series[name] = {"ref": a, "target": b, "abs_diff": [abs(y - x) for x, y in zip(a, b)]}
    return {"steps": len(ref.steps), "series": series}


def _run_dict(run: Run) -> dict[str, Any]:
    extras = {}
    for name, value in run.extras.items():
        if name == "layers":
            continue  # per-run traces are large; the report carries their comparison instead
        if name == "facts":
            # the run's own facts, not an extra of that name (a loaded artifact's extras hold
            # whatever its file says); every other field of the run is written after the extras
            continue
        data = recorded(value)
        if hasattr(data, "to_dict"):
            extras[name] = data.to_dict()
        elif isinstance(data, dict | list):
            extras[name] = data
    return {
        "facts": run.facts.to_dict(),
        **extras,
        "backend": run.backend.to_dict(),
        "label": run.backend.label,
        "ok": run.ok,
        "error": run.error.to_dict() if run.error else None,
        "wall_time_s": run.wall_time_s,
        "time_kind": run_time_kind(run.backend.emulated),
        "memory": {"current_bytes": run.memory.current_bytes, "peak_bytes": run.memory.peak_bytes},
        "fallbacks": [dict(event) for event in run.fallbacks],
        "shared_names": list(run.shared_names),
        "stdout": run.stdout,
        "stderr": run.stderr,
    }

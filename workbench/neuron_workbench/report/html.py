"""HTML for reports, built from the report's JSON data so live and saved reports look the same.

Every user-provided string (variable names, cell source, error messages, printed output) goes through
:func:`html.escape`; the page needs no network and runs no script.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from neuron_workbench.report.compile_html import render_compile_section
from neuron_workbench.report.display import (
    NOT_COMPARED_STATUS,
    format_bytes,
    largest_difference,
    output_fails,
    output_judged_status,
    output_status_class,
    verdict_color,
)
from neuron_workbench.report.html_parts import esc
from neuron_workbench.report.html_parts import table as _table
from neuron_workbench.report.schema import read_report
from neuron_workbench.sites import function_at, site_label

_STYLE = """
.nw-report{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.4;
 border:1px solid #d0d7de;border-radius:6px;padding:10px 12px;margin:4px 0;max-width:1100px}
.nw-report .nw-verdict{display:inline-block;color:#fff;font-weight:600;border-radius:4px;
 padding:1px 8px;margin-right:8px}
.nw-report h4{margin:12px 0 4px 0;font-size:13px}
.nw-report table{border-collapse:collapse;margin:2px 0}
.nw-report th,.nw-report td{border:1px solid #d0d7de;padding:2px 8px;text-align:left;
 vertical-align:top}
.nw-report th{background:#f6f8fa}
.nw-report td.num{text-align:right;font-variant-numeric:tabular-nums}
.nw-report .bad{color:#cf222e;font-weight:600}
.nw-report .ok{color:#1a7f37}
.nw-report .note{color:#57606a}
.nw-report .na{color:#57606a;font-style:italic}
.nw-report pre{background:#f6f8fa;padding:6px;overflow:auto;max-height:240px;margin:2px 0}
.nw-report td pre{max-width:640px}
.nw-report>div:first-child,.nw-report .note{overflow-wrap:anywhere}
"""


def _fmt_float(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return f"{value:.3g}"


def _number_cell(value: Any) -> str:
    """``esc(_fmt_float(value))``: a float's text needs no escaping (a table has hundreds)."""
    if type(value) is float:
        return f"{value:.3g}"
    return esc(_fmt_float(value))


def _fmt_time(run: dict[str, Any]) -> str:
    seconds = run.get("wall_time_s")
    if seconds is None:
        return "n/a"
    label = run.get("time_kind", "wall time")
    return f"{seconds * 1000:.1f} ms ({label})"


def _backend_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for role in ("ref", "target"):
        run = data[role]
        backend = run["backend"]
        details = backend.get("details") or {}
        emulated = "emulated" if backend.get("emulated") else str(details.get("kind") or "real")
        status = '<span class="ok">ran</span>' if run["ok"] else '<span class="bad">raised</span>'
        rows.append(
            [
                esc("reference" if role == "ref" else "target"),
                esc(backend["name"]),
                esc(backend.get("device", "")),
                esc(f"{emulated}: {backend.get('device_name', '')}"),
                status,
                esc(_fmt_time(run)),
                esc(format_bytes((run.get("memory") or {}).get("peak_bytes"))),
                esc(len({str(e.get("op")) for e in run.get("fallbacks", [])})),
            ]
        )
    return rows


def _command_lines(data: dict[str, Any]) -> str:
    """``ran: python train.py --lr 0.1`` (and its folder) for a script's runs; ``""`` for a cell's.

    The script's arguments decide what it computed: a page of a run with ``-- --epochs 3`` read
    the same as one without them. Each run's own line where the two ran different ones (a
    recording compared with a run given other arguments).
    """
    ran = {}
    for role in ("ref", "target"):
        script = (data.get(role) or {}).get("script")
        if isinstance(script, dict) and isinstance(script.get("argv"), list):
            line = f"python {shlex.join(str(arg) for arg in script['argv'])}"
            where = f" in {script['cwd']}" if isinstance(script.get("cwd"), str) else ""
            ran[role] = (line, where)
    if len(set(ran.values())) == 1:
        roles = {next(iter(ran)): ""}
    else:
        roles = {role: f"{data[role]['backend']['name']} " for role in ran}
    return "".join(
        f"<div class='note'>{esc(who)}ran: <code>{esc(ran[role][0])}</code>{esc(ran[role][1])}</div>"
        for role, who in roles.items()
    )


def _emulation_notes(data: dict[str, Any]) -> str:
    notes = []
    for role in ("ref", "target"):
        backend = data[role]["backend"]
        if not backend.get("emulated"):
            continue
        details = backend.get("details", {})
        profile = details.get("profile", "unknown profile")
        provenance = details.get("provenance", "")
        notes.append(
            f"{backend['name']} is emulated on the host CPU (profile {profile}"
            + (f": {provenance}" if provenance else "")
            + "). Its timings are host CPU time, not device performance."
        )
    # How the runs were compared: autocast's tolerance floor, a reference standing in for cuda.
    notes.extend(str(n) for n in data.get("notes") or [])
    return "".join(f'<div class="note">{esc(n)}</div>' for n in notes)


def format_measurement(value: Any, unit: Any = None) -> str:
    """A measurement's value as text: ``12.4 ms``, ``0.0440 MiB``, ``8``, ``(8, 0)``, or ``—``."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, int):
        text = f"{value:,}" if abs(value) >= 10_000 else str(value)
    else:
        text = f"{value:.4g}"
    return f"{text} {unit}" if unit else text


#: What the measurements table's header says about the values.
MEASUREMENTS_NOTE = (
    "Values that came from timers, memory statistics or device properties (also when derived from "
    "them) are measurements: shown side by side, never compared, not in the verdict."
)


def measurement_rows(records: Iterable[dict[str, Any]]) -> list[list[str]]:
    """HTML table cells of report data's ``measurements``: output, kind, both values, sources."""
    return [
        [
            f"<code>{esc(m['path'])}</code>",
            esc(m["kind"]),
            esc(format_measurement(m.get("ref"), m.get("unit"))),
            esc(format_measurement(m.get("target"), m.get("unit"))),
            esc(m.get("source", "")),
            esc(f"reference: {m.get('ref_basis', '')}; target: {m.get('target_basis', '')}"),
        ]
        for m in records
    ]


MEASUREMENT_HEADERS = ("output", "kind", "reference", "target", "source", "what the values are")


def _output_rows(outputs: list[dict[str, Any]]) -> list[list[str]]:
    # a report has hundreds of outputs and a handful of statuses: each status's cell is made once
    status_cells: dict[str, str] = {}
    rows = []
    for out in outputs:
        get = out.get
        status = out["status"]
        passed = status == "match"
        # under --judge budget, R's judgment where it overrules the tolerance's status
        cls, text = output_judged_status(out) if "budget_judged" in out else ("", status)
        status_cell = status_cells.get(text)
        if status_cell is None:
            cls = cls or output_status_class(status)
            status_cell = status_cells[text] = f'<span class="{cls}">{esc(text)}</span>'
        if get("explained"):  # does not fail the verdict: its gradients matched
            status_cell += " (judged by its gradients)"
        dtype = get("ref_dtype") or ""
        target_dtype = get("target_dtype")
        if target_dtype and target_dtype != dtype:
            dtype = f"{dtype} / {target_dtype}"
        shape = get("ref_shape")
        shape_text = "" if shape is None else str(shape)
        target_shape = get("target_shape")
        if target_shape is not None and target_shape != shape:
            shape_text += f" / {target_shape}"
        mismatched = ""
        if get("numel"):
            mismatched = f"{out['mismatched']} / {out['numel']}"
        tolerance = ""
        if status != NOT_COMPARED_STATUS:
            tolerance = esc(f"{out['rtol']:.1e} / {out['atol']:.1e}")
        worst = ""
        if not passed and get("worst_index") is not None:
            worst = (
                f"{out['worst_index']}: {_fmt_float(get('worst_ref'))} vs "
                f"{_fmt_float(get('worst_target'))}"
            )
        rows.append(
            [
                f"<code>{esc(out['path'])}</code>",
                status_cell,
                esc(dtype),
                esc(shape_text),
                _number_cell(largest_difference(out)),
                _number_cell(largest_difference(out, "max_rel")),
                esc(mismatched),
                tolerance,
                esc(worst or get("detail", "")),
            ]
        )
    return rows


# --- source sites -------------------------------------------------------------------------------
# A site is ``{"file", "line", "function"}``. Inside a notebook the raw file is the kernel's temporary
# file of a cell (``/tmp/ipykernel_1/2.py``) or the magic's own ``<neuron-cell-3>``; people know the
# cell by its execution count, so the magic relabels such sites to ``file: "cell [7]"`` (plus
# ``cell: 7``) before anything shows or saves them; files become relative to the notebook's folder.


def _site_text(event: dict[str, Any]) -> str:
    site = event.get("site")
    if isinstance(site, dict) and site.get("file"):
        return site_label(site)
    return str(event.get("autograd_node") or "")


def _fallback_rows(events: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for event in events:
        count = event.get("count")
        time_s = event.get("cpu_time_s")
        rows.append(
            [
                f"<code>{esc(event.get('op'))}</code>",
                esc("" if count is None else count),
                esc(event.get("phase", "")),
                esc(event.get("module", "")),
                esc(_site_text(event)),
                esc("" if time_s is None else f"{time_s * 1000:.2f} ms"),
            ]
        )
    return rows


def _budget_section(budget: dict[str, Any] | None) -> str:
    """The precision budget: each measured output's noise floor, error and R, and --tol lines."""
    if not budget or not (budget.get("outputs") or budget.get("oracle_error")):
        return ""
    rows = [
        [
            f"<code>{esc(o['path'])}</code>",
            esc(o["source"]) + (f" ({esc(o['note'])})" if o.get("note") else ""),
            esc(_fmt_float(o["floor"])),
            esc(_fmt_float(o["floor_worst"])),
            esc(_fmt_float(o["error"])),
            esc(_fmt_float(o["error_worst"])),
            esc(_fmt_float(o["ratio"])),
            esc(o["label"]),
        ]
        for o in budget.get("outputs", [])
    ]
    headers = [
        "output",
        "floor from",
        "‖ref − oracle‖",
        "worst",
        "‖target − oracle‖",
        "worst",
        "R",
        "class",
    ]
    parts = [
        "<h4>Precision budget</h4>",
        '<div class="note">R = ‖target − oracle‖ / ‖ref − oracle‖ against a float64 rerun of '
        "the reference (the oracle): about 1 means the target is as accurate as the reference."
        "</div>",
    ]
    if budget.get("oracle_error"):
        parts.append(f'<div class="note">{esc(budget["oracle_error"])}</div>')
    if rows:
        parts.append(_table(headers, rows, numeric={2, 3, 4, 5, 6}))
    if budget.get("tolerances"):
        lines = "\n".join(esc(line) for line in budget["tolerances"])
        parts.append(f"<div class='note'>Tolerances that would pass:</div><pre>{lines}</pre>")
    return "".join(parts)


def render_report_html(data: dict[str, Any]) -> str:
    """Render one report (its :meth:`Report.to_dict` data) as a self-contained HTML fragment.

    Data of an earlier ``schema_version`` is read with :func:`~neuron_workbench.report.schema.read_report`.
    """
    data = read_report(data)
    verdict = data["verdict"]
    color = verdict_color(verdict)
    parts = [
        f"<style>{_STYLE}</style>",
        '<div class="nw-report">',
        f'<div><span class="nw-verdict" style="background:{color}">{esc(verdict)}</span>'
        f"{esc(data['summary'].split(' ', 1)[1] if ' ' in data['summary'] else '')}</div>",
        "<h4>Backends</h4>",
        _table(
            ["role", "backend", "device", "kind", "status", "time", "peak memory", "fallback ops"],
            _backend_rows(data),
        ),
        _command_lines(data),
        _emulation_notes(data),
    ]
    errors = [(role, data[role]) for role in ("ref", "target") if data[role].get("error")]
    if errors:
        rows = []
        for _role, run in errors:
            err = run["error"]
            site = err.get("site") or {}
            raised_in = function_at(site) if isinstance(site, dict) and site else ""
            rows.append(
                [
                    esc(run["backend"]["name"]),
                    f"<code>{esc(err['type'])}</code>",
                    f"<pre>{esc(err['message'])}</pre>",
                    esc(err.get("lineno") or ""),
                    f"<code>{esc(err.get('line', ''))}</code>",
                    esc(raised_in),
                ]
            )
        parts += [
            "<h4>Errors</h4>",
            _table(["backend", "type", "message", "line", "source", "raised in"], rows),
        ]
    parts.append(render_compile_section(data))  # empty unless a run compiled
    if data.get("outputs"):
        headers = [
            "output",
            "status",
            "dtype",
            "shape",
            "max |Δ|",
            "max rel",
            "mismatched",
            "rtol / atol",
            "worst element / detail",
        ]
        skipped = [o for o in data["outputs"] if o["status"] == NOT_COMPARED_STATUS]
        # as the verdict judged them: under --judge budget an output's R decides
        failing = [o for o in data["outputs"] if output_fails(o)]
        matching = [
            o for o in data["outputs"] if o["status"] != NOT_COMPARED_STATUS and not output_fails(o)
        ]
        parts.append("<h4>Outputs</h4>")
        if failing:
            parts.append(_table(headers, _output_rows(failing), numeric={4, 5, 6}))
        if skipped:
            parts.append(
                f'<div class="note">{len(skipped)} output{"" if len(skipped) == 1 else "s"} could '
                "not be compared (neither a match nor a failure):</div>"
            )
            parts.append(_table(headers, _output_rows(skipped), numeric={4, 5, 6}))
        if matching:
            # Matching outputs can run to hundreds of parameters: keep them one click away.
            table = _table(headers, _output_rows(matching), numeric={4, 5, 6})
            opened = " open" if not failing and len(matching) <= 12 else ""
            parts.append(
                f"<details{opened}><summary>{len(matching)} matching output"
                f"{'' if len(matching) == 1 else 's'}</summary>{table}</details>"
            )
    elif (
        not errors
        and not data.get("measurements")
        # observed scalars (loss.item()) are compared too: the report checked them
        and not (data.get("scalars") or {}).get("sites")
    ):
        parts.append(
            '<div class="note">The cell bound no outputs to compare, so nothing was checked '
            "(tensors, arrays, numbers, strings, modules, optimizers, their containers and objects "
            "of classes the notebook defines are compared).</div>"
        )
    measurements = data.get("measurements") or []
    if measurements:
        parts += [
            "<h4>Measurements</h4>",
            f'<div class="note">{esc(MEASUREMENTS_NOTE)}</div>',
            _table(MEASUREMENT_HEADERS, measurement_rows(measurements), numeric={2, 3}),
        ]
    parts.append(_budget_section(data.get("budget")))
    first = data.get("first_divergence")
    if first:
        kind = "born" if first.get("born") else "diverged (no single origin found)"
        parts.append(
            f"<h4>First divergence</h4><div>Module <code>{esc(first['module'])}</code> "
            f"(call {esc(first['call'])}, {esc(first['module_type'])}): {esc(kind)} here; its "
            "inputs were within tolerance and its output was not.</div>"
        )
    backward = (data.get("layers") or {}).get("first_backward_divergence")
    if backward:
        parts.append(
            f"<div>Backward: the gradient first diverges in the backward of module "
            f"<code>{esc(backward['module'])}</code> (call {esc(backward['call'])}, "
            f"{esc(backward['module_type'])}): its output gradient matched, its input gradient "
            "did not.</div>"
        )
    layers = (data.get("layers") or {}).get("layers") or []
    diverged = [d for d in layers if d.get("diverged")]
    if layers:
        rows = [
            [
                esc(d["order"]),
                f"<code>{esc(d['module'])}</code>",
                esc(d["call"]),
                esc(d["module_type"]),
                esc(_fmt_float(d["error"])),
                '<span class="bad">born</span>' if d["born"] else esc("propagated"),
            ]
            for d in diverged[:30]
        ]
        parts.append(
            f"<h4>Layers</h4><div class='note'>{len(layers)} module calls compared, "
            f"{len(diverged)} diverged.</div>"
        )
        if rows:
            parts.append(
                _table(["order", "module", "call", "type", "error", "origin"], rows, numeric={0, 4})
            )
    training = data.get("training")
    if training:
        rows = []
        for name, series in training["series"].items():
            for step, (a, b, d) in enumerate(
                zip(series["ref"], series["target"], series["abs_diff"])
            ):
                rows.append(
                    [
                        f"<code>{esc(name)}</code>",
                        esc(step + 1),
                        esc(_fmt_float(a)),
                        esc(_fmt_float(b)),
                        esc(_fmt_float(d)),
                    ]
                )
        parts += [
            "<h4>Training steps</h4>",
            _table(["value", "step", "reference", "target", "|Δ|"], rows, numeric={1, 2, 3, 4}),
        ]
    parts += _scalars_html(data.get("scalars"))
    hinted = [o for o in data.get("outputs", []) if o.get("hints")]
    if hinted:
        items = "".join(
            f"<li><code>{esc(o['path'])}</code>: " + "; ".join(esc(h) for h in o["hints"]) + "</li>"
            for o in hinted[:20]
        )
        parts.append(f"<h4>Likely causes</h4><ul>{items}</ul>")
    events = data["target"].get("fallbacks", [])
    if events:
        parts += [
            f"<h4>CPU fallbacks on {esc(data['target']['backend']['name'])}</h4>",
            _table(
                ["op", "count", "phase", "module", "source", "CPU time"],
                _fallback_rows(events),
                numeric={1},
            ),
        ]
    parts += _profile_parts(data)
    migration = data.get("migration")
    if migration and migration.get("findings"):
        count = len(migration["findings"])
        text = f"<pre>{esc(migration.get('text', ''))}</pre>"
        if migration.get("repeat"):
            # The same cell ran before in this session with the same findings: one line, folded.
            parts.append(
                f"<details><summary>Migration findings ({count}), unchanged since this cell's "
                f"first run</summary>{text}</details>"
            )
        else:
            parts.append(f"<h4>Migration findings ({count})</h4>{text}")
    for warning in data.get("warnings", []):
        parts.append(f'<div class="note">⚠ {esc(warning)}</div>')
    for role in ("ref", "target"):
        run = data[role]
        text = (run.get("stdout") or "") + (run.get("stderr") or "")
        if text:
            parts.append(
                f"<details><summary>printed by the {esc(run['backend']['name'])} run</summary>"
                f"<pre>{esc(text)}</pre></details>"
            )
    parts.append("</div>")
    return "".join(parts)


def _fmt_value(value: Any) -> str:
    """A logged value with enough digits to see where two close ones differ."""
    if value is None:
        return "none (not reached)"
    return f"{value:.8g}" if isinstance(value, float) else str(value)


def _scalars_html(scalars: dict[str, Any] | None) -> list[str]:
    """The observed scalars (loss curves by call site): where they part first, and each site."""
    if not scalars or not (scalars.get("sites") or scalars.get("first")):
        return []
    parts = ["<h4>Observed scalars (by call site and occurrence)</h4>"]
    first = scalars.get("first")
    if first:
        parts.append(
            f"<div class='note'><span class='bad'>First divergence</span> at "
            f"<code>{esc(first['site'])}</code>, occurrence {esc(first['occurrence'])}: "
            f"reference {esc(_fmt_value(first['ref']))}, target {esc(_fmt_value(first['target']))}"
            "</div>"
        )
        if first.get("ratio") is not None:
            parts.append(
                f"<div class='note'>Precision budget there: R {esc(_fmt_float(first['ratio']))} "
                f"({esc(first.get('budget') or '')}) against the float64 oracle's "
                f"{esc(_fmt_value(first.get('oracle')))}</div>"
            )
        if first.get("hints"):
            items = "".join(f"<li>{esc(h)}</li>" for h in first["hints"])
            parts.append(f"<ul>{items}</ul>")
    if scalars.get("max_steps"):
        parts.append(f"<div class='note'>Both runs stopped after {esc(scalars['max_steps'])} steps "
                     "(--max-steps).</div>")  # fmt: skip
    rows = []
    for site in scalars.get("sites") or []:
        counts = f"{site['ref_count']} / {site['target_count']}"
        tol = site.get("tolerance") or {}
        rows.append(
            [
                f"<code>{esc(site['site'])}</code>",
                esc(site.get("how", "")),
                esc(site.get("dtype") or ""),
                esc(counts),
                esc(_fmt_float(largest_difference(site))),
                esc(f"rtol {tol.get('rtol')}, atol {tol.get('atol')}"),
                '<span class="ok">match</span>'
                if site.get("parts_at") is None
                else f'<span class="bad">part at #{esc(site["parts_at"])}</span>',
            ]
        )
    if rows:
        parts.append(
            _table(
                ["call site", "call", "dtype", "occurrences (ref / target)", "max |Δ|",
                 "tolerance", "curves"],
                rows,
                numeric={4},
            )
        )  # fmt: skip
    for key, role in (("only_ref", "reference"), ("only_target", "target")):
        if scalars.get(key):
            sites = ", ".join(f"<code>{esc(s)}</code>" for s in scalars[key])
            parts.append(f"<div class='note'>Reached only on the {role}: {sites}</div>")
    return parts


def _cell_errors_html(cell_errors: Sequence[dict[str, Any]]) -> str:
    """The notebook cells that raised outside ``%%neuron`` (``cell_errors`` of ``run --json``)."""
    if not cell_errors:
        return ""
    rows = [
        [
            esc(f"cell {error.get('cell_index', '')}"),
            f"<code>{esc(error.get('type', ''))}</code>",
            f"<pre>{esc(error.get('message', ''))}</pre>",
        ]
        for error in cell_errors
    ]
    count = len(cell_errors)
    return (
        f"<style>{_STYLE}</style><div class='nw-report'><div>"
        f"<span class='nw-verdict' style='background:{verdict_color('ERROR')}'>ERROR</span>"
        f"{count} cell{'' if count == 1 else 's'} raised outside %%neuron</div>"
        f"{_table(['cell', 'type', 'message'], rows)}</div>"
    )


#: Ops listed per run in the op profile section (the most self time first).
PROFILE_ROWS = 12


def _profile_parts(data: dict[str, Any]) -> list[str]:
    """``--profile``: each run's ops by self time, labelled with the kind of time measured.

    The page had no profile at all where the JSON and the notebook's views have one. An emulated
    run's time is host CPU time, never the device's.
    """
    parts = []
    for role in ("ref", "target"):
        profile = data.get(role, {}).get("profile")
        if not isinstance(profile, dict) or not profile.get("rows"):
            continue
        rows = sorted(profile["rows"], key=lambda r: -(r.get("self_time_s") or 0.0))
        kind = profile.get("time_kind") or "wall time"
        total = profile.get("total_time_s")
        name = data[role].get("label") or data[role]["backend"]["name"]
        parts += [
            f"<h4>Op profile: {esc(name)} ({esc(kind)})</h4>",
            f"<div class='note'>{len(rows)} ops"
            + (f", {_fmt_float(total)} s in all" if isinstance(total, int | float) else "")
            + (f"; the {PROFILE_ROWS} with the most self time" if len(rows) > PROFILE_ROWS else "")
            + "</div>",
            _table(
                ["op", "calls", f"self time (s, {kind})", "shapes", "fell back"],
                [
                    [
                        f"<code>{esc(row.get('op', ''))}</code>",
                        esc(row.get("calls", "")),
                        esc(_fmt_float(row.get("self_time_s"))),
                        esc(row.get("shapes") or ""),
                        "yes" if row.get("fallback") else "",
                    ]
                    for row in rows[:PROFILE_ROWS]
                ],
                numeric={1, 2},
            ),
        ]
    return parts


def render_page(
    reports: Sequence[dict[str, Any]],
    title: str = "neuron-workbench report",
    cell_errors: Sequence[dict[str, Any]] = (),
) -> str:
    """A standalone HTML page with several reports (no network, no scripts).

    Parameters
    ----------
    reports : sequence of dict
        Report data (:meth:`Report.to_dict`), each under its ``label``.
    title : str
        The page's title and heading.
    cell_errors : sequence of dict
        Notebook cells that raised outside ``%%neuron`` (``cell_index``, ``type``, ``message``),
        listed first: they fail the run as the reports' verdicts do.
    """
    body = ""
    if cell_errors:
        body = f"<h3>Cell errors</h3>{_cell_errors_html(cell_errors)}"
    if reports:
        body += "".join(
            f"<h3>{esc(r.get('label', f'report {i + 1}'))}</h3>{render_report_html(r)}"
            for i, r in enumerate(reports)
        )
    else:
        body += "<p>No %%neuron reports were produced.</p>"
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title></head><body style='font-family:system-ui,sans-serif'>"
        f"<h2>{esc(title)}</h2>{body}</body></html>"
    )

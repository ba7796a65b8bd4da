"""HTML fragments of the report views (summary, numerics, layers, ops, fallbacks), from report data.

Every value from the user's code goes through :func:`esc`; the fragments run no script.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from neuron_workbench.report.compile_html import compile_rows
from neuron_workbench.report.display import (
    NOT_COMPARED_STATUS,
    format_bytes,
    largest_difference,
    op_time_kind,
    output_judged_status,
    run_label,
    verdict_color,
)
from neuron_workbench.report.html import (
    MEASUREMENT_HEADERS,
    MEASUREMENTS_NOTE,
    esc,
    measurement_rows,
)
from neuron_workbench.sites import site_label
from neuron_workbench.trace.fallback import fallback_table

__all__ = [
    "COMPILE_TIME_NOTE",
    "STYLE",
    "compile_html",
    "compile_where",
    "compiled_runs",
    "fallbacks_html",
    "layers_html",
    "measurements_html",
    "migration_html",
    "numerics_html",
    "ops_html",
    "sites_html",
    "summary_html",
]

STYLE = """<style>
.nw-view{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.4}
.nw-view table{border-collapse:collapse;margin:4px 0;max-width:100%}
.nw-view code.nw-path{word-break:break-all}
.nw-view th,.nw-view td{border:1px solid #d0d7de;padding:2px 8px;text-align:left;vertical-align:top}
.nw-view th{background:#f6f8fa}
.nw-view td.num{text-align:right;font-variant-numeric:tabular-nums}
.nw-view .bad{color:#cf222e;font-weight:600}
.nw-view .ok{color:#1a7f37}
.nw-view .note{color:#57606a}
.nw-view .na{color:#57606a;font-style:italic}
.nw-view .nw-verdict{display:inline-block;color:#fff;font-weight:600;border-radius:4px;
 padding:1px 8px;margin-right:8px}
.nw-view code{font-size:12px}
</style>"""


def _fmt_ms(seconds: Any) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return ""
    return f"{float(seconds) * 1e3:.3f}"


def _fmt_num(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return esc(value)
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.3g}"
    return esc(value)


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = ()
) -> str:
    """An HTML table; cells are already-escaped HTML, headers are escaped here."""
    num = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=num' if i in num else ''}>{cell}</td>" for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def summary_html(data: dict[str, Any]) -> str:
    """Verdict, both backends (time labelled with its kind, peak memory, fallbacks), warnings."""
    verdict = str(data.get("verdict", "?"))
    color = verdict_color(verdict)
    parts = [
        f'<div class="nw-view nw-summary"><span class="nw-verdict" style="background:{color}">'
        f"{esc(verdict)}</span><b>{esc(data.get('title', ''))}</b>"
        f'<div class="note">{esc(data.get("summary", ""))}</div>'
    ]
    rows = []
    for role in ("ref", "target"):
        run = data.get(role, {})
        backend = run.get("backend", {})
        seconds = run.get("wall_time_s")
        time = (
            f"{seconds * 1e3:.1f} ms ({esc(op_time_kind(run))})" if seconds is not None else "n/a"
        )
        profile = run.get("profile") or {}
        peak = profile.get("peak_memory_bytes")
        if peak is None:
            peak = (run.get("memory") or {}).get("peak_bytes")
        status = "ok" if run.get("ok", True) else "raised"
        ops = {str(e.get("op")) for e in run.get("fallbacks", [])}
        rows.append(
            [esc(role), esc(run_label(run)), esc(backend.get("device", "")), esc(status), time,
             esc(format_bytes(peak)), esc(len(ops))]
        )  # fmt: skip
    parts.append(
        table(["role", "backend", "device", "status", "cell time", "peak memory", "fallback ops"],
              rows, numeric=(4, 5, 6))
    )  # fmt: skip
    counts = data.get("counts") or {}
    if counts:
        # the counts are by the tolerance's status; under --judge budget R judged floating outputs
        judged = [o.get("budget_judged") for o in data.get("outputs", []) if o.get("budget_judged")]
        by_budget = (
            f"; precision budget: {judged.count('beyond')} beyond, {judged.count('within')} within"
            if judged
            else ""
        )
        parts.append(
            "<div>outputs: "
            + ", ".join(f"{esc(k)} {esc(v)}" for k, v in sorted(counts.items()))
            + by_budget
            + "</div>"
        )
    if any(
        r.get("backend", {}).get("emulated") for r in (data.get("ref", {}), data.get("target", {}))
    ):
        parts.append(
            '<div class="note">Emulated devices run on the host CPU: their times are host CPU time,'
            " never Trainium or TPU performance.</div>"
        )
    for warning in data.get("warnings", []):
        parts.append(f'<div class="note">warning: {esc(warning)}</div>')
    parts.append("</div>")
    return "".join(parts)


def measurements_html(data: dict[str, Any]) -> str:
    """Timings, memory figures and device properties of both runs side by side ('' when none)."""
    records = data.get("measurements") or []
    if not records:
        return ""
    return (
        '<div class="nw-view nw-measurements"><b>Measurements</b>'
        f'<div class="note">{esc(MEASUREMENTS_NOTE)}</div>'
        + table(MEASUREMENT_HEADERS, measurement_rows(records), numeric=(2, 3))
        + "</div>"
    )


def numerics_html(data: dict[str, Any]) -> str:
    """One row per output: failures first, then those not compared (with why), then matches."""
    outputs = list(data.get("outputs", []))
    if not outputs:
        why = "a run raised" if data.get("verdict") == "ERROR" else "the cell bound no outputs"
        if data.get("measurements") and data.get("verdict") != "ERROR":
            why = "the cell bound only measurements"
        return f'<div class="nw-view nw-numerics note">No outputs were compared ({why}).</div>'
    order = {"na": 1, "ok": 2}  # "bad" first, as the verdict judged them (--judge budget: by R)
    outputs.sort(key=lambda d: (order.get(output_judged_status(d)[0], 0), str(d.get("path"))))
    skipped = any(d.get("status") == NOT_COMPARED_STATUS for d in outputs)
    last = "tolerance / why not compared" if skipped else "tolerance"
    rows = []
    for d in outputs:
        status = str(d.get("status", ""))
        cls, shown = output_judged_status(d)
        shape = d.get("ref_shape")
        mism = d.get("mismatched")
        numel = d.get("numel")
        tolerance = f"rtol {_fmt_num(d.get('rtol'))}, atol {_fmt_num(d.get('atol'))}"
        if status == NOT_COMPARED_STATUS:
            # no tolerance applied; the reason is what the row has to say
            tolerance, mism = esc(d.get("detail", "")), None
        rows.append(
            [f"<code>{esc(d.get('path'))}</code>", f'<span class="{cls}">{esc(shown)}</span>',
             esc(d.get("kind", "")), esc(d.get("ref_dtype") or ""), esc(d.get("target_dtype") or ""),
             esc(shape if shape is not None else ""), _fmt_num(largest_difference(d)),
             _fmt_num(largest_difference(d, "max_rel")),
             "" if mism is None else f"{esc(mism)} / {esc(numel)}",
             tolerance]
        )  # fmt: skip
    return '<div class="nw-view nw-numerics">' + table(
        ["output", "status", "kind", "ref dtype", "target dtype", "shape", "max |Δ|",
         "max rel", "mismatched", last],
        rows, numeric=(6, 7, 8),
    ) + "</div>"  # fmt: skip


def layers_html(data: dict[str, Any]) -> str:
    """Layer-by-layer divergence when the report has it, else how to get it."""
    layers = data.get("layers")
    if not layers:
        return (
            '<div class="nw-view nw-layers note">No layer-by-layer comparison was recorded for '
            "this cell.</div>"
        )
    entries = layers.get("layers", []) if isinstance(layers, dict) else list(layers)
    first = layers.get("first_divergence") if isinstance(layers, dict) else None
    head = ""
    if first:
        head = (
            f'<div class="bad">first divergence: <code>{esc(first.get("module"))}</code> '
            f"({esc(first.get('module_type', ''))})</div>"
        )
    rows = []
    for entry in entries:
        born = entry.get("born")
        diverged = entry.get("diverged")
        state = "born here" if born else ("diverged" if diverged else "ok")
        cls = "bad" if diverged else "ok"
        rows.append(
            [esc(entry.get("order", "")), f"<code>{esc(entry.get('module', ''))}</code>",
             esc(entry.get("module_type", "")), _fmt_num(entry.get("error")),
             f'<span class="{cls}">{esc(state)}</span>']
        )  # fmt: skip
    return (
        '<div class="nw-view nw-layers">'
        + head
        + table(["#", "module", "type", "error", "state"], rows, numeric=(0, 3))
        + "</div>"
    )


def ops_html(data: dict[str, Any], n: int = 25) -> str:
    """The top ``n`` ops of the joined profiles, with each side's time kind in the header."""
    from neuron_workbench.views.figures import profile_frame

    df = profile_frame(data)
    if df is None:
        return (
            '<div class="nw-view nw-ops note">No op profile: run the cell with '
            "<code>%%neuron --profile</code>.</div>"
        )
    ref, target = data["ref"], data["target"]
    ref_kind, target_kind = op_time_kind(ref), op_time_kind(target)
    rows = []
    for rec in df.head(n).to_dict("records"):
        op = esc(rec["op"])
        rows.append(
            [f"<code>{op}</code>" + (' <span class="bad">CPU fallback</span>' if rec["fallback"] else ""),
             _fmt_ms(rec["ref_time_s"]), _fmt_ms(rec["target_time_s"]), _fmt_num(rec["ratio"]),
             esc(rec["ref_calls"]), esc(rec["target_calls"]), esc(format_bytes(rec["ref_bytes"])),
             esc(format_bytes(rec["target_bytes"])), esc(rec["target_shapes"] or rec["ref_shapes"])]
        )  # fmt: skip
    notes = []
    for role, run in (("ref", ref), ("target", target)):
        profile = run.get("profile") or {}
        total = profile.get("total_time_s")
        steps = profile.get("steps", 1)
        line = f"{esc(role)} {esc(run_label(run))}: {esc(op_time_kind(run))}"
        if total is not None:
            line += f", {_fmt_ms(total)} ms in ops"
        if steps and steps > 1:
            times = profile.get("step_times_s") or []
            first = _fmt_ms(times[0]) if times else "?"
            steady = _fmt_ms(sum(times[1:]) / len(times[1:])) if len(times) > 1 else "?"
            line += (
                f"; {esc(steps)} steps: first call {first} ms, steady state "
                f"{steady} ms per step (table: steady state)"
            )
        notes.append(f"<div>{line}</div>")
    return (
        '<div class="nw-view nw-ops">'
        + "".join(notes)
        + table(
            [
                "op",
                f"ref ms ({ref_kind})",
                f"target ms ({target_kind})",
                "ratio",
                "ref calls",
                "target calls",
                "ref bytes",
                "target bytes",
                "input shapes",
            ],
            rows,
            numeric=(1, 2, 3, 4, 5, 6, 7),
        )  # fmt: skip
        + f'<div class="note">{len(df)} ops in all; showing the {min(n, len(df))} slowest on the '
        "target. Emulated times are host CPU time.</div></div>"
    )


def fallbacks_html(data: dict[str, Any]) -> str:
    """The target's fallback ops: count, host CPU time, shapes, dtypes, source lines, modules."""
    target = data.get("target", {})
    rows = fallback_table(list(target.get("fallbacks", [])))
    label = run_label(target)
    if not rows:
        return f'<div class="nw-view nw-fallbacks ok">No op fell back to CPU on {esc(label)}.</div>'
    body = []
    for row in rows:
        sites = (
            "<br>".join(
                f'<code class="nw-path">{esc(site_label(file, line))}</code> in {esc(func)}'
                for (file, line), func in zip(row.sites, row.functions)
            )
            or '<span class="note">backward / library code</span>'
        )
        modules = ", ".join(f"<code>{esc(m)}</code>" if m else "top level" for m in row.modules)
        if row.module_types:
            modules += f" ({esc(', '.join(row.module_types))})"
        body.append(
            [f"<code>{esc(row.op)}</code>", esc("?" if row.count is None else row.count),
             _fmt_ms(row.cpu_time_s), esc("; ".join(row.shapes)), esc(", ".join(row.dtypes)),
             sites, modules, esc(", ".join(row.phases))]
        )  # fmt: skip
    head = (
        f'<div class="bad">{len(rows)} op{"s" if len(rows) != 1 else ""} fell back to CPU on '
        f"{esc(label)}: {esc(', '.join(r.op for r in rows))}</div>"
    )
    return (
        '<div class="nw-view nw-fallbacks">'
        + head
        + table(
            [
                "op",
                "calls",
                "host CPU ms",
                "input shapes",
                "dtypes",
                "source lines",
                "modules",
                "phase",
            ],
            body,
            numeric=(1, 2),
        )  # fmt: skip
        + "</div>"
    )


def sites_html(op: str, sites: list[dict[str, Any]]) -> str:
    """Call sites of one op (the pane under a clicked bar)."""
    if not sites:
        return (
            f'<div class="nw-view nw-sites note">No user source line recorded for '
            f"<code>{esc(op)}</code> (called from backward or library code).</div>"
        )
    items = "".join(
        f"<li><code>{esc(site_label(s))}</code> in {esc(s.get('function', ''))}"
        + (f" — module <code>{esc(s['module'])}</code>" if s.get("module") else "")
        + f' <span class="note">({esc(s.get("role", ""))}, {esc(s.get("source", ""))})</span></li>'
        for s in sites
    )
    return f'<div class="nw-view nw-sites"><b>Call sites of <code>{esc(op)}</code></b><ul>{items}</ul></div>'


def migration_html(data: dict[str, Any]) -> str:
    """Scanner findings of the cell (what to change for the target), when the report has them."""
    migration = data.get("migration")
    findings = migration.get("findings", []) if isinstance(migration, dict) else migration or []
    if not findings:
        return '<div class="nw-view nw-migration ok">The scanner found nothing to migrate.</div>'
    rows = [
        [esc(f.get("line", "")), esc(f.get("rule_id", f.get("rule", ""))),
         esc(f.get("severity", "")), esc(f.get("message", "")), esc(f.get("suggestion", "")),
         "yes" if f.get("fixable") else ""]
        for f in findings
        if isinstance(f, dict)
    ]  # fmt: skip
    summary = migration.get("summary") if isinstance(migration, dict) else None
    head = f'<div class="note">{esc(summary)}</div>' if isinstance(summary, str) else ""
    return (
        '<div class="nw-view nw-migration">'
        + head
        + table(
            ["line", "rule", "severity", "message", "suggestion", "auto-fix"], rows, numeric=(0,)
        )
        + '<div class="note"><code>%neuron_migrate</code> applies the fixable ones.</div></div>'
    )


def compiled_runs(data: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The runs that compiled something, as ``(role, run, compile record)``, reference first.

    A run compiled when its record (``data[role]["compile"]``) holds a graph, a graph break or a
    failed compile; a cell without ``torch.compile`` gives ``[]``.
    """
    out = []
    for role in ("ref", "target"):
        run = data.get(role) or {}
        record = run.get("compile") or {}
        if record.get("graphs") or record.get("graph_breaks") or record.get("errors"):
            out.append((role, run, record))
    return out


def compile_where(entry: dict[str, Any]) -> str:
    """Where a graph or graph break is: ``cell line 4`` in the cell, else ``path:line``."""
    file, line = entry.get("file") or "", entry.get("line")
    if file == "cell":
        return f"cell line {line}"
    return site_label(file, line) if file else ""


#: What the compile section's times are.
COMPILE_TIME_NOTE = (
    "Compile time is the time torch.compile spent compiling; a graph's run time is the time its "
    "compiled callable ran in the run, over its calls (the forward; a training graph's backward "
    "runs inside autograd's backward and is not in it); run time is the run's time less its "
    "compile time (the graphs running plus the cell's eager code). Emulated devices run on the "
    "host CPU: their times are host CPU time, never Trainium or TPU performance."
)


def compile_html(data: dict[str, Any]) -> str:
    """What ``torch.compile`` did on each backend: graphs, graph breaks, recompiles, times.

    Per backend that compiled: its graphs (where, ops, compile time, the recompile reason, the ops
    its compiler could not take), graph breaks with their reasons and cell lines, recompiles with
    their reasons, warnings and failed compiles. ``""`` when neither run compiled.
    """
    runs = compiled_runs(data)
    if not runs:
        return ""
    labels = {role: run_label(run, role) for role, run, _ in runs}
    overview = [
        [esc(labels[row[0]])] + [esc(cell) for cell in row[1:]] for row in compile_rows(data)
    ]
    parts = [
        '<div class="nw-view nw-compile"><b>torch.compile</b>',
        table(
            ["backend", "compiler", "graphs", "graph breaks", "recompiles", "compile time",
             "compiled graphs ran", "run time", "ops not compiled"],
            overview,
            numeric=(2, 3, 4, 5, 6, 7),
        ),
    ]  # fmt: skip
    graphs, breaks, recompiles, notes = [], [], [], []
    for role, run, record in runs:
        label = esc(labels[role])
        kind = op_time_kind(run)
        for index, graph in enumerate(record.get("graphs", []), start=1):
            missing = graph.get("fallback_ops") or []
            graphs.append(
                [label, esc(index), esc(graph.get("backend", "")),
                 f"<code>{esc(graph.get('function', ''))}</code>",
                 f'<code class="nw-path">{esc(compile_where(graph))}</code>',
                 esc(graph.get("ops", "")),
                 f"{float(graph.get('compile_s') or 0.0) * 1e3:.1f} ({esc(kind)})",
                 esc("" if graph.get("calls") is None else graph["calls"]),
                 "" if graph.get("run_s") is None
                 else f"{float(graph['run_s']) * 1e3:.1f} ({esc(kind)})",
                 esc(graph.get("recompile") or ""),
                 f'<span class="bad">{esc(", ".join(missing))}</span>' if missing else ""]
            )  # fmt: skip
        breaks += [
            [
                label,
                f'<code class="nw-path">{esc(compile_where(b))}</code>',
                esc(b.get("reason", "")),
            ]
            for b in record.get("graph_breaks", [])
        ]
        recompiles += [
            [label, f"<code>{esc(r.get('function', ''))}</code>", esc(r.get("reason", ""))]
            for r in record.get("recompiles", [])
        ]
        notes += [f"{labels[role]}: warning: {w}" for w in record.get("warnings", [])]
        notes += [f"{labels[role]}: compile failed: {e}" for e in record.get("errors", [])]
        random_ops = record.get("random_ops") or {}
        if random_ops:
            notes.append(
                f"{labels[role]}: random functions inside compiled graphs (the compiler draws "
                f"their numbers): {', '.join(sorted(random_ops))}"
            )
    if graphs:
        parts += [
            "<div><b>Graphs</b></div>",
            table(
                ["backend", "#", "compiler", "function", "where", "ops", "compile ms",
                 "calls", "run ms", "recompiled because", "ops not compiled"],
                graphs,
                numeric=(1, 5, 6, 7, 8),
            ),
        ]  # fmt: skip
    if breaks:
        parts += ["<div><b>Graph breaks</b></div>", table(["backend", "where", "reason"], breaks)]
    if recompiles:
        parts += [
            "<div><b>Recompiles</b></div>",
            table(["backend", "function", "reason"], recompiles),
        ]
    parts += [f'<div class="note">{esc(note)}</div>' for note in notes]
    parts.append(f'<div class="note">{esc(COMPILE_TIME_NOTE)}</div></div>')
    return "".join(parts)

"""The report's ``torch.compile`` section: what each run compiled, where graphs broke, recompiles.

Rendered from the report data (``data["ref"]["compile"]``, ``data["target"]["compile"]``, each a
``trace.compile.CompileRecord.to_dict()``); empty when neither run compiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from neuron_workbench.report.html_parts import esc, table

__all__ = ["compile_rows", "render_compile_section"]


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return table(headers, [[esc(cell) for cell in row] for row in rows])


def _where(entry: dict[str, Any]) -> str:
    file, line = entry.get("file") or "", entry.get("line")
    if file == "cell":
        return f"cell line {line}"
    return f"{file}:{line}" if file else ""


def compile_rows(data: dict[str, Any]) -> list[list[Any]]:
    """One row per run that compiled: role, backends, graphs, breaks, recompiles, times, ops.

    Compile and run time are host seconds (host CPU time on an emulated device): the time spent
    compiling, the time the compiled graphs ran (their calls; empty in a record from before it
    was kept), and the run's wall time less its compile time.
    """
    rows = []
    for role in ("ref", "target"):
        run = data.get(role) or {}
        record = run.get("compile") or {}
        if not (record.get("graphs") or record.get("graph_breaks") or record.get("errors")):
            continue
        compile_s = float(record.get("compile_s") or 0.0)
        wall = run.get("wall_time_s")
        kind = run.get("time_kind", "wall time")
        run_s = "" if wall is None else f"{max(0.0, wall - compile_s) * 1000:.1f} ms ({kind})"
        graphs_s = record.get("run_s")
        graphs_ran = "" if graphs_s is None else f"{float(graphs_s) * 1000:.1f} ms ({kind})"
        backends = list(dict.fromkeys(str(g.get("backend")) for g in record.get("graphs", [])))
        missing = sorted({op for g in record.get("graphs", []) for op in g.get("fallback_ops", [])})
        rows.append(
            [
                role,
                ", ".join(backends) or "—",
                len(record.get("graphs", [])),
                len(record.get("graph_breaks", [])),
                len(record.get("recompiles", [])),
                f"{compile_s * 1000:.1f} ms ({kind})",
                graphs_ran,
                run_s,
                ", ".join(missing) or "none",
            ]
        )
    return rows


def render_compile_section(data: dict[str, Any]) -> str:
    """HTML for the ``torch.compile`` section, or ``""`` when nothing compiled."""
    rows = compile_rows(data)
    check = data.get("compile_check")
    if not rows:
        return _check_table(check) if check else ""
    parts = [
        "<h4>torch.compile</h4>",
        _table(
            [
                "role",
                "backend",
                "graphs",
                "graph breaks",
                "recompiles",
                "compile time",
                "compiled graphs ran",
                "run time",
                "ops not compiled",
            ],
            rows,
        ),
    ]
    breaks, recompiles, notes = [], [], []
    for role in ("ref", "target"):
        run = data.get(role) or {}
        record = run.get("compile") or {}
        name = (run.get("backend") or {}).get("name", role)
        breaks += [[name, _where(b), b.get("reason", "")] for b in record.get("graph_breaks", [])]
        recompiles += [
            [name, r.get("function", ""), r.get("reason", "")] for r in record.get("recompiles", [])
        ]
        notes += [f"{name}: {e}" for e in record.get("errors", [])]
    if breaks:
        parts += ["<h5>Graph breaks</h5>", _table(["backend", "where", "reason"], breaks)]
    if recompiles:
        parts += ["<h5>Recompiles</h5>", _table(["backend", "function", "reason"], recompiles)]
    parts += [f'<div class="note">{esc(n)}</div>' for n in notes]
    if check:
        parts.append(_check_table(check, heading="h5"))
    return "".join(parts)


def _check_table(check: dict[str, Any], heading: str = "h4") -> str:
    """``--compile-check``: the verdict as written and with ``torch.compile`` off on both sides."""
    eager = check.get("eager_summary", "")
    return f"<{heading}>Compiled vs eager (--compile-check)</{heading}>" + _table(
        ["cell", "verdict", "summary"],
        [
            ["as written (compiled)", check.get("compiled", ""), ""],
            ["torch.compile off, both sides", check.get("eager", ""), eager],
        ],
    )

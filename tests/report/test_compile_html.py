"""The report's torch.compile section, from report data."""

from neuron_workbench.report.compile_html import compile_rows, render_compile_section


def _run(record, wall=2.0, emulated=False):
    return {
        "backend": {"name": "neuron" if emulated else "cpu"},
        "wall_time_s": wall,
        "time_kind": "host CPU time" if emulated else "wall time",
        "compile": record,
    }


def test_nothing_compiled_renders_nothing():
    empty = {"graphs": [], "graph_breaks": [], "recompiles": [], "errors": [], "compile_s": 0.0}
    assert render_compile_section({"ref": _run(empty), "target": _run(empty)}) == ""


def test_compile_time_is_separated_from_run_time_and_breaks_name_their_line():
    target = {
        "graphs": [
            {
                "backend": "neuron",
                "ops": 3,
                "fallback_ops": ["aten::foo"],
                "calls": 2,
                "run_s": 0.002,
            },
            {"backend": "neuron", "ops": 2, "fallback_ops": [], "calls": 1, "run_s": 0.001},
        ],
        "graph_breaks": [{"file": "cell", "line": 4, "reason": "print is not traceable"}],
        "recompiles": [{"function": "forward", "reason": "new shape for x: (4, 64) → (4, 65)"}],
        "errors": [],
        "compile_s": 0.5,
        "run_s": 0.003,
    }
    data = {"ref": _run({}), "target": _run(target, wall=2.0, emulated=True)}
    assert compile_rows(data) == [
        [
            "target",
            "neuron",
            2,
            1,
            1,
            "500.0 ms (host CPU time)",
            "3.0 ms (host CPU time)",  # the compiled graphs ran
            "1500.0 ms (host CPU time)",  # the run less its compile time
            "aten::foo",
        ]
    ]
    # a record from before graphs' run times were kept: that cell is empty
    del target["run_s"]
    assert compile_rows(data)[0][6] == ""
    page = render_compile_section(data)
    assert "cell line 4" in page and "print is not traceable" in page
    assert "new shape for x: (4, 64) → (4, 65)" in page

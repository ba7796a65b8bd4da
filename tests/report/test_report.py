import dataclasses
import json
import re

import torch

from neuron_workbench.backends import BackendInfo
from neuron_workbench.compare import compare_outputs
from neuron_workbench.report import Report, render_page, render_report_html
from neuron_workbench.run import Run, RunError

CPU = BackendInfo("cpu", "cpu", "host")
NEURON = BackendInfo(
    "neuron",
    "neuron:0",
    "emulated neuron (host CPU)",
    emulated=True,
    details={"profile": "neuron-2026-04"},
)


def make(ref_out, target_out, **kw):
    ref = Run(CPU, outputs=ref_out, wall_time_s=0.01)
    target = Run(NEURON, outputs=target_out, wall_time_s=0.02, **kw)
    return Report(ref, target, compare_outputs(ref_out, target_out), cell_source="x = 1")


def test_pass_summary_has_counts_and_no_timing():
    report = make({"a": torch.ones(2), "b": 1}, {"a": torch.ones(2), "b": 1})
    assert report.summary() == "PASS neuron (emulated) vs cpu — 2 outputs, 2 match"
    assert bool(report)


def test_fail_summary_names_the_first_failure_and_counts_fallbacks():
    events = [{"op": "aten::sort", "count": 2}, {"op": "aten::max_pool2d_with_indices", "count": 1}]
    report = make(
        {"a": torch.zeros(2), "b": torch.zeros(1), "c": 1},
        {"a": torch.full((2,), 3.1e-3), "b": torch.ones(1), "c": 1},
        fallbacks=events,
    )
    assert report.summary() == (
        "FAIL neuron (emulated) vs cpu — 3 outputs, 1 match, 2 differ: a max|Δ| 3.1e-03 > 1.0e-05"
        " (+1 more); 2 ops fell back to CPU"
    )
    assert not report


def test_error_summary_names_backend_error_and_line():
    ref = Run(CPU, outputs={})
    target = Run(NEURON, error=RunError("RuntimeError", "boom\nmore", 4, "x.sort()"))
    report = Report(ref, target, None)
    assert (
        report.summary()
        == "ERROR neuron (emulated) vs cpu — neuron raised RuntimeError: boom (cell line 4)"
    )
    assert report.verdict == "ERROR" and not report


def test_error_summary_of_a_script_names_the_scripts_line():
    # `neuron-workbench run sub/fail.py`: its lines are the script's, not a notebook cell's
    from neuron_workbench.run.script import ScriptContext

    context = ScriptContext(("sub/fail.py",), "/work", "/work/sub")
    error = RunError("ValueError", "boom", 5, "raise ValueError('boom')")
    both = Report(
        Run(CPU, error=error, extras={"script": context}),
        Run(NEURON, error=error, extras={"script": context}),
        None,
    )
    assert both.script == "fail.py"
    assert both.summary() == (
        "ERROR neuron (emulated) vs cpu — cpu raised ValueError: boom (fail.py, line 5); "
        "neuron raised ValueError: boom (fail.py, line 5)"
    )
    # only the reference knows the script (a recording's dict), the target raised
    recorded = Run(CPU, outputs={}, extras={"script": context.to_dict()})
    one = Report(recorded, Run(NEURON, error=error), None)
    assert one.summary().endswith("neuron raised ValueError: boom (fail.py, line 5)")
    # a notebook cell's runs have no script record: its wording stays
    cell = Report(Run(CPU, outputs={}), Run(NEURON, error=error), None)
    assert cell.script is None
    assert cell.summary().endswith("neuron raised ValueError: boom (cell line 5)")


def test_dict_is_json_and_html_escapes_user_strings():
    probe = "<script>alert(1)</script>"
    report = dataclasses.replace(
        make({probe: torch.ones(1)}, {probe: torch.zeros(1)}), cell_source=probe
    )
    report.ref.stdout = probe
    data = json.loads(json.dumps(report.to_dict()))
    assert data["verdict"] == "FAIL" and data["target"]["backend"]["emulated"] is True
    html = render_report_html(data)
    page = render_page([data])
    for text in (html, page):
        assert "<script>" not in text
        assert "&lt;script&gt;" in text
    assert "host CPU time" in html


def test_the_page_shows_each_runs_op_profile_with_its_kind_of_time():
    # --profile's op tables were in the JSON and the notebook's views, not in the HTML page
    from neuron_workbench.backends import get_backend
    from neuron_workbench.cell.pipeline import build_report
    from neuron_workbench.cell.settings import CompareOptions
    from neuron_workbench.run import RunSpec, compile_cell, execute
    from neuron_workbench.trace.profile import op_profiler

    program = compile_cell("x = torch.ones(8, 8)\nfor _ in range(3):\n    y = (x @ x).relu()\n")
    runs = [
        execute(RunSpec(program, {"torch": torch}, instruments={"profile": op_profiler}),
                get_backend("cpu"))
        for _ in range(2)
    ]  # fmt: skip
    data = build_report(*runs, CompareOptions(), cell_source=program.source).to_dict()
    page = render_page([data])
    assert page.count("<h4>Op profile: ") == 2 and "(wall time)</h4>" in page
    assert '<code>aten::mm</code></td><td class="num">3</td>' in page


def test_error_summary_names_where_below_the_cell_it_was_raised():
    error = RunError(
        "RuntimeError",
        "mat1 and mat2 shapes cannot be multiplied",
        2,
        "out = net(x)",
        {"file": "cell [1]", "line": 9, "function": "Net.forward"},
    )
    report = Report(Run(CPU, outputs={}), Run(NEURON, error=error), None)
    assert report.summary() == (
        "ERROR neuron (emulated) vs cpu — neuron raised RuntimeError: mat1 and mat2 shapes "
        "cannot be multiplied (cell line 2, in Net.forward at cell [1], line 9)"
    )


def test_a_notebook_class_raising_in_the_worker_is_named_as_its_cell(ip):
    from neuron_workbench.testing import run_cell

    run_cell(
        ip,
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x @ torch.ones(5, 2, device=x.device)\n"
        "net = Net()",
    )
    run_cell(ip, "%%neuron -o r\nout = net(torch.ones(3, 4, device='cuda'))")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR", report.summary()
    cell = re.search(r"cell \[(\d+)\], line 4", report.summary())
    assert cell is not None, report.summary()
    for run in (report.ref, report.target):  # the worker's frame too, named in the kernel
        assert run.error.raised_in == f"in Net.forward at cell [{cell.group(1)}], line 4"
    assert "<td>Net.forward at cell [" in report._repr_html_()

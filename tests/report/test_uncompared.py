"""A cell that compared nothing is ``UNCOMPARED``, never ``PASS``; outputs that could not be compared
are counted on the verdict line but do not fail it."""

import json
from importlib import resources

import jsonschema
import pytest
import torch

from neuron_workbench.backends import BackendInfo
from neuron_workbench.cli.commands.run import verdict_summary
from neuron_workbench.cli.notebook_runner import InputResult
from neuron_workbench.compare import compare_outputs
from neuron_workbench.report import render_report_html
from neuron_workbench.report.display import NEUTRAL_COLOR, VERDICTS, verdict_color
from neuron_workbench.report.report import UNCOMPARED, Report
from neuron_workbench.run import Run, RunError
from neuron_workbench.run.records import NotCompared

CPU = BackendInfo("cpu", "cpu", "host", details={"stands_in_for": "cuda"})
NEURON = BackendInfo("neuron", "neuron:0", "emulated neuron (host CPU)", emulated=True)
TITLE = "neuron (emulated) vs cpu (as cuda)"
REASON = (
    "could not be sent back from the neuron worker process "
    "(ModuleNotFoundError: No module named 'torch.neuron')"
)


def make(ref_out, target_out, **kw):
    ref = Run(CPU, outputs=ref_out)
    target = Run(NEURON, outputs=target_out, **kw)
    return Report(ref, target, compare_outputs(ref_out, target_out), cell_source="mod = torch.cuda")


def validator():
    text = resources.files("neuron_workbench.report").joinpath("report.schema.json").read_text()
    return jsonschema.Draft202012Validator(json.loads(text))


def test_a_cell_with_no_outputs_is_uncompared_not_pass():
    report = make({}, {})
    assert report.verdict == UNCOMPARED == "UNCOMPARED"
    assert report.summary() == f"UNCOMPARED {TITLE} — 0 outputs compared"
    assert bool(report) is False


def test_a_cell_with_only_skipped_outputs_is_uncompared_and_names_the_first():
    report = make(
        {"mod": torch.cuda, "f": print}, {"mod": NotCompared(REASON), "f": NotCompared("r2")}
    )
    assert report.verdict == UNCOMPARED and bool(report) is False
    assert report.summary() == (
        f"UNCOMPARED {TITLE} — 0 outputs compared; 2 not compared: mod (target: {REASON}) (+1 more)"
    )


def test_compared_and_skipped_outputs_pass_and_count_the_skipped_ones():
    report = make(
        {"x": torch.ones(2), "mod": torch.cuda}, {"x": torch.ones(2), "mod": NotCompared(REASON)}
    )
    assert report.verdict == "PASS" and bool(report) is True
    assert report.summary() == f"PASS {TITLE} — 1 output, 1 match; 1 not compared"


def test_a_failure_beside_a_skipped_output_fails_with_both_counts_before_the_fallbacks():
    report = make(
        {"x": torch.zeros(2), "mod": torch.cuda},
        {"x": torch.ones(2), "mod": NotCompared(REASON)},
        fallbacks=[{"op": "aten::sort", "count": 1}],
    )
    assert report.verdict == "FAIL" and not report
    assert report.summary() == (
        f"FAIL {TITLE} — 1 output, 0 match, 1 differs: x max|Δ| 1.0e+00 > 1.0e-05; "
        "1 not compared; 1 op fell back to CPU"
    )


def test_an_error_stays_an_error():
    ref = Run(CPU)
    target = Run(NEURON, error=RunError("RuntimeError", "boom", 2, "x.sort()"))
    assert Report(ref, target, None).verdict == "ERROR"


@pytest.mark.parametrize(
    "ref_out, target_out, verdict",
    [
        ({}, {}, UNCOMPARED),
        ({"mod": torch.cuda}, {"mod": NotCompared(REASON)}, UNCOMPARED),
        ({"x": 1, "mod": torch.cuda}, {"x": 1, "mod": NotCompared(REASON)}, "PASS"),
    ],
)
def test_report_data_validates_and_renders_the_new_verdict_and_status(ref_out, target_out, verdict):
    data = json.loads(json.dumps(make(ref_out, target_out).to_dict()))
    validator().validate(data)
    assert data["verdict"] == verdict
    html = render_report_html(data)
    if verdict == UNCOMPARED:
        assert f'style="background:{NEUTRAL_COLOR}">UNCOMPARED</span>' in html
    if ref_out:
        [skipped] = [o for o in data["outputs"] if o["status"] == "not-compared"]
        assert skipped["detail"] == f"target: {REASON}" and data["counts"]["not-compared"] == 1
        assert '<span class="na">not-compared</span>' in html
        assert "1 output could not be compared" in html
        assert "No module named &#x27;torch.neuron&#x27;" in html
    else:
        assert "bound no outputs to compare" in html


def test_the_schema_lists_every_verdict():
    schema = json.loads(
        resources.files("neuron_workbench.report").joinpath("report.schema.json").read_text()
    )
    assert schema["properties"]["verdict"]["enum"] == list(VERDICTS)
    assert verdict_color(UNCOMPARED) == NEUTRAL_COLOR


def test_the_cli_counts_uncompared_cells_and_does_not_exit_0_for_them():
    passed, uncompared = {"verdict": "PASS"}, {"verdict": UNCOMPARED}
    fallback = {"verdict": "PASS", "fallback_ops": ["aten::sort"]}
    assert InputResult("x", reports=[passed]).exit_code(strict=False) == 0
    assert InputResult("x", reports=[passed, uncompared]).exit_code(strict=False) == 1
    assert InputResult("x", reports=[uncompared, fallback]).exit_code(strict=True) == 3
    assert verdict_summary({"PASS": 2}) == "2 PASS, 0 FAIL, 0 ERROR"
    assert verdict_summary({"PASS": 1, UNCOMPARED: 1}) == "1 PASS, 0 FAIL, 0 ERROR, 1 UNCOMPARED"

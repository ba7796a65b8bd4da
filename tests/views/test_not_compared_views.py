"""The widget's tables show outputs that could not be compared, and the ``UNCOMPARED`` verdict,
neutrally: not as a match, not as a failure."""

import torch

from neuron_workbench.backends import BackendInfo
from neuron_workbench.compare import compare_outputs
from neuron_workbench.report.display import NEUTRAL_COLOR
from neuron_workbench.report.report import Report
from neuron_workbench.run import Run
from neuron_workbench.run.records import NotCompared
from neuron_workbench.views.tables import numerics_html, summary_html

CPU = BackendInfo("cpu", "cpu", "host")
NEURON = BackendInfo("neuron", "neuron:0", "emulated neuron (host CPU)", emulated=True)


def data(ref_out, target_out):
    report = Report(
        Run(CPU, outputs=ref_out),
        Run(NEURON, outputs=target_out),
        compare_outputs(ref_out, target_out),
    )
    return report.to_dict()


def test_numerics_lists_failures_then_not_compared_with_why_then_matches():
    html = numerics_html(
        data(
            {"a": torch.ones(1), "b": torch.zeros(1), "c": torch.cuda},
            {"a": torch.ones(1), "b": torch.ones(1), "c": NotCompared("no module torch.neuron")},
        )
    )
    assert (
        html.index("<code>b</code>") < html.index("<code>c</code>") < html.index("<code>a</code>")
    )
    assert '<span class="na">not-compared</span>' in html
    assert "target: no module torch.neuron" in html and "tolerance / why not compared" in html
    assert '<span class="bad">differ</span>' in html and '<span class="ok">match</span>' in html


def test_no_outputs_says_why_without_blaming_a_run():
    html = numerics_html(data({}, {}))
    assert "No outputs were compared (the cell bound no outputs)" in html
    assert "a run raised" not in html
    assert numerics_html({"verdict": "ERROR", "outputs": []}).count("a run raised") == 1


def test_the_summary_badge_of_an_uncompared_cell_is_neutral():
    html = summary_html(data({"m": torch.cuda}, {"m": NotCompared("r")}))
    assert f'style="background:{NEUTRAL_COLOR}">UNCOMPARED</span>' in html
    assert "not-compared 1" in html

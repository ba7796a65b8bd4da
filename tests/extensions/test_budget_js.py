"""The JupyterLab view's precision budget (src/charts.js ``budgetRows``/``budgetFigure``), run by
Node.js on the report of a real ``%%neuron --judge budget`` cell."""

from neuron_workbench.testing import run_cell

# A target-only bug: the device path normalises over the wrong dimension.
BUGGY = (
    "x = torch.randn(8, 16, device='cuda')\n"
    "probs = x.softmax(dim=0 if x.device.type != 'cpu' else -1)\n"
    "ok = x * 2"
)


def test_budget_rows_and_error_distribution_of_a_real_report(ip, run_charts_js):
    run_cell(ip, "import torch\ntorch.manual_seed(0)")
    run_cell(ip, "%%neuron --judge budget -o r\n" + BUGGY)
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    out = run_charts_js(
        "const out = {rows: charts.budgetRows(report), figure: charts.budgetFigure(report)};",
        report.to_dict(),
    )
    rows = {r["path"]: r for r in out["rows"]}
    assert rows["probs"]["within"] is False and float(rows["probs"]["ratio"]) > 10
    assert rows["ok"]["within"] is True
    worst = max(report.budget.outputs, key=lambda o: o.ratio)
    figure = out["figure"]
    assert figure["layout"]["title"]["text"].startswith(f"Error distribution of {worst.path}: R ")
    ref_bars, target_bars = figure["data"]
    assert sum(ref_bars["y"]) == sum(target_bars["y"]) == 8 * 16

"""The JupyterLab view's precision budget (src/charts.js ``budgetRows``/``budgetFigure``), run by
Node.js on the report of a real ``%%neuron --judge budget`` cell."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from neuron_workbench.testing import run_cell

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "extensions" / "neuron-workbench-lab" / "src" / "charts.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")

HARNESS = """
import * as charts from './charts.mjs';
const report = JSON.parse(await new Promise(resolve => {
  let text = ''; process.stdin.on('data', d => (text += d)); process.stdin.on('end', () => resolve(text));
}));
process.stdout.write(JSON.stringify({rows: charts.budgetRows(report), figure: charts.budgetFigure(report)}));
"""

# A target-only bug: the device path normalises over the wrong dimension.
BUGGY = (
    "x = torch.randn(8, 16, device='cuda')\n"
    "probs = x.softmax(dim=0 if x.device.type != 'cpu' else -1)\n"
    "ok = x * 2"
)


def test_budget_rows_and_error_distribution_of_a_real_report(ip, tmp_path):
    run_cell(ip, "import torch\ntorch.manual_seed(0)")
    run_cell(ip, "%%neuron --judge budget -o r\n" + BUGGY)
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    shutil.copy(CHARTS, tmp_path / "charts.mjs")
    (tmp_path / "harness.mjs").write_text(HARNESS)
    done = subprocess.run(
        [NODE, str(tmp_path / "harness.mjs")],
        input=json.dumps(report.to_dict()),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    rows = {r["path"]: r for r in out["rows"]}
    assert rows["probs"]["within"] is False and float(rows["probs"]["ratio"]) > 10
    assert rows["ok"]["within"] is True
    worst = max(report.budget.outputs, key=lambda o: o.ratio)
    figure = out["figure"]
    assert figure["layout"]["title"]["text"].startswith(f"Error distribution of {worst.path}: R ")
    ref_bars, target_bars = figure["data"]
    assert sum(ref_bars["y"]) == sum(target_bars["y"]) == 8 * 16

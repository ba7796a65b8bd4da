"""The JupyterLab view's measurement rows (src/charts.js ``measurementRows``), run by Node.js on
report data the workbench produced."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from neuron_workbench.backends import BackendInfo
from neuron_workbench.compare import compare_outputs
from neuron_workbench.report.report import Report
from neuron_workbench.run import Run
from neuron_workbench.run.measurements import Provenance, TaggedFloat, TaggedStr

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "extensions" / "neuron-workbench-lab" / "src" / "charts.js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")

HARNESS = """
import * as charts from './charts.mjs';
const report = JSON.parse(await new Promise(resolve => {
  let text = ''; process.stdin.on('data', d => (text += d)); process.stdin.on('end', () => resolve(text));
}));
process.stdout.write(JSON.stringify(charts.measurementRows(report)));
"""


def test_measurement_rows_show_both_values_with_unit_and_basis(tmp_path):
    ms = Provenance("time", "torch.cuda.Event.elapsed_time", "ms")
    name = Provenance("device", "torch.cuda.get_device_name")
    ref_out = {"step_ms": TaggedFloat(12.25, ms), "gpu": TaggedStr("x86_64", name), "y": 1.0}
    target_out = {"step_ms": TaggedFloat(30.5, ms), "gpu": TaggedStr("neuron:0", name), "y": 1.0}
    cpu = BackendInfo("cpu", "cpu", "host", details={"stands_in_for": "cuda"})
    neuron = BackendInfo("neuron", "neuron:0", "emulated", emulated=True)
    report = Report(Run(cpu, outputs=ref_out), Run(neuron, outputs=target_out), None)
    report.comparison = compare_outputs(ref_out, target_out)
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
    rows = json.loads(done.stdout)
    assert [(r["path"], r["ref"], r["target"]) for r in rows] == [
        ("step_ms", "12.25 ms", "30.5 ms"),
        ("gpu", "x86_64", "neuron:0"),
    ]
    assert rows[0]["basis"] == (
        "reference: host CPU time (cpu standing in for cuda); "
        "target: host CPU time (emulated device)"
    )

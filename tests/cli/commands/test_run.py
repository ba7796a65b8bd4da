"""``neuron-workbench run`` executes a real notebook in a real kernel."""

import json
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

PASS_CELL = "%%neuron\nimport torch\nok = torch.ones(3, device='cuda') * 2"
FAIL_CELL = (
    "%%neuron\nflag = torch.tensor([1.0]) + "
    "(1.0 if torch.zeros(1, device='cuda').device.type != 'cpu' else 0.0)"
)
FALLBACK_CELL = "%%neuron\nvalues, order = torch.sort(torch.tensor([3.0, 1.0, 2.0], device='cuda'))"


def write_notebook(path, *sources):
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "neuron_workbench.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def three_cells(tmp_path_factory):
    path = tmp_path_factory.mktemp("nb") / "three.ipynb"
    write_notebook(path, PASS_CELL, FAIL_CELL, FALLBACK_CELL)
    return path


def test_run_reports_every_cell_and_exits_1_on_a_failure(three_cells, tmp_path):
    json_path, html_path = tmp_path / "r.json", tmp_path / "r.html"
    done = cli(
        "run",
        str(three_cells),
        "--ref",
        "cpu",
        "--target",
        "neuron",
        "--json",
        str(json_path),
        "--html",
        str(html_path),
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cell 1: PASS neuron (emulated) vs cpu")
    assert lines[1].startswith("cell 2: FAIL neuron (emulated) vs cpu")
    assert lines[2].startswith("cell 3: PASS neuron (emulated) vs cpu")
    assert lines[2].endswith("1 op fell back to CPU")
    data = json.loads(json_path.read_text())
    assert [r["verdict"] for r in data["reports"]] == ["PASS", "FAIL", "PASS"]
    assert data["reports"][2]["fallback_ops"] == ["aten::sort"]
    html = html_path.read_text()
    assert html.count('class="nw-report"') == 3 and "aten::sort" in html


def test_strict_exits_3_when_ops_fell_back(three_cells):
    done = cli("run", str(three_cells), "--ref", "cpu", "--strict")
    assert done.returncode == 3, done.stdout + done.stderr


def test_usage_errors_exit_2_with_one_line(tmp_path):
    missing = cli("run", str(tmp_path / "missing.ipynb"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"neuron-workbench: error: no such notebook: {tmp_path / 'missing.ipynb'}"
    ]
    path = tmp_path / "x.ipynb"
    write_notebook(path, "x = 1")
    bad = cli("run", str(path), "--target", "gpu9000")
    assert bad.returncode == 2 and "unknown backend 'gpu9000'" in bad.stderr
    assert "Traceback" not in bad.stderr

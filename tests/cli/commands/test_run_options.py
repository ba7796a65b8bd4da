"""``neuron-workbench run`` takes every cell option of the table, for notebooks and scripts alike."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from neuron_workbench.cli.main import main

CELL = """\
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
x = torch.randn(16, 8, device=device)
loss = torch.nn.functional.dropout(model(x), 0.1).square().mean()
loss.backward()
"""
FLAGS = [
    "--ref", "cpu",
    "--preset", "bf16-autocast",
    "--tol", "loss=1e-2,1e-3",
    "--layers",
    "--steps", "2",
    "--profile",
    "--what-if", "bf16-matmul",
    "--rng", "cpu",
]  # fmt: skip


def _check(report):
    options = report["options"]
    assert options["tolerance"]["preset"] == "bf16-autocast"
    assert options["tolerance"]["per_output"] == {"loss": [1e-2, 1e-3]}
    assert options["layers"] is True and options["steps"] == 2
    assert options["what_if"] == "bf16-matmul" and options["rng"] == "cpu"
    assert report["target"]["facts"]["rng_on_cpu"] is True
    assert report["layers"], "per-module statistics were recorded"
    for role in ("ref", "target"):
        assert report[role]["profile"]["rows"], f"the {role} run was profiled"
    # profiled runs take turns: their timings do not share the cores
    assert not report["target"]["facts"]["shared_host"]


@pytest.mark.slow
def test_a_notebook_run_with_every_kind_of_option(tmp_path, capsys):
    nb = new_notebook(
        cells=[
            new_code_cell("import torch\ndevice = 'cuda'"),
            new_code_cell("%%neuron\n" + CELL),
        ]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path = tmp_path / "options.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "run.json"
    code = main(["run", str(path), *FLAGS, "--json", str(out)])
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert code in (0, 1), printed  # a verdict (bf16 matmuls may fail float32 grads), no error
    (report,) = document["reports"]
    _check(report)
    assert document["options"]["steps"] == 2 and document["options"]["profile"] is True


def test_a_script_run_with_every_kind_of_option(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import torch\ndevice = 'cuda'\n" + CELL)
    out = tmp_path / "run.json"
    code = main(["run", str(script), *FLAGS, "--json", str(out)])
    printed = capsys.readouterr().out
    assert code in (0, 1), printed
    (report,) = json.loads(out.read_text())["reports"]
    _check(report)


def test_a_bad_option_value_is_one_line(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    assert main(["run", str(script), "--steps", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("--steps must be at least 1")

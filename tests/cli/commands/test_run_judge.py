"""``neuron-workbench run --judge``: a script's verdict by its precision budget."""

import json

import pytest

from neuron_workbench.cli.main import main

SCRIPT = (
    "import torch\n"
    "torch.manual_seed(0)\n"
    "x = torch.randn(64, 256, device='cuda')\n"
    "w = torch.randn(256, 128, device='cuda') / 16\n"
    "h = x @ w\n"
    "loss = torch.softmax(h, dim=-1).pow(2).sum()\n"
)


def test_a_tpu_script_fails_by_its_factor_and_passes_at_highest_precision(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.py").write_text(SCRIPT)
    (tmp_path / "mm_highest.py").write_text(
        "import torch\ntorch.set_float32_matmul_precision('highest')\n" + SCRIPT
    )
    args = ["--ref", "cpu", "--target", "tpu", "--judge", "budget"]
    assert main(["run", "mm.py", *args, "--json", "o.json"]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("mm.py: FAIL tpu (emulated) vs cpu (as cuda)")
    assert "x less accurate than the reference (TPU 1-pass bf16 matmuls)" in line
    report = json.loads((tmp_path / "o.json").read_text())["reports"][0]
    assert report["options"]["judge"] == "budget"
    assert {o["path"] for o in report["budget"]["outputs"]} >= {"h", "loss"}
    assert main(["run", "mm_highest.py", *args]) == 0
    assert "PASS tpu (emulated) vs cpu (as cuda) — within precision budget" in (
        capsys.readouterr().out
    )


def test_a_bad_judge_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.py").write_text(SCRIPT)
    with pytest.raises(SystemExit) as exited:  # argparse's choices, as for every flag
        main(["run", "mm.py", "--judge", "strict"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "argument --judge: invalid choice: 'strict'" in line

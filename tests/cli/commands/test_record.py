"""``neuron-workbench record SCRIPT.py --backend B -o PATH`` saves a one-run artifact."""

import json

import pytest
import torch

from neuron_workbench.artifacts import load
from neuron_workbench.cli.main import main

SCRIPT = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(3, 2).to(device)
x = torch.randn(4, 3, device=device)
loss = model(x).square().mean()
loss.backward()
values, order = torch.sort(x[:, 0])
print("loss", round(float(loss), 3))
"""


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path / "train.py"


def test_records_a_reference_run_with_the_cuda_remap(script, capsys):
    assert main(["record", "train.py", "--backend", "cpu", "-o", "out/ref.nwrun.zip"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("loss ")  # the script's print, then the command's line
    assert out.splitlines()[1:] == [
        "recorded cpu (as cuda) run: 9 outputs, 1 scalar at 1 call site -> out/ref.nwrun.zip"
    ]
    artifact = load("out/ref.nwrun.zip")
    assert list(artifact.runs) == ["ref"] and artifact.cell_source == SCRIPT
    run = artifact.runs["ref"]
    assert run.backend.name == "cpu" and not run.backend.emulated and run.ok
    assert run.stdout.startswith("loss ")
    assert set(run.outputs) >= {"model.weight", "model.weight.grad", "x", "loss", "values", "order"}
    # Seeded like %%neuron (seed 0): the same script gives the same bits again.
    torch.manual_seed(0)
    torch.nn.Linear(3, 2)
    expected_x = torch.randn(4, 3)
    assert torch.equal(run.outputs["x"], expected_x)


def test_records_on_the_emulated_target_with_its_fallbacks(script, capsys):
    assert (
        main(["record", "train.py", "--backend", "neuron", "-o", "t.nwrun.zip", "--role", "target"])
        == 0
    )
    printed, line = capsys.readouterr().out.splitlines()
    assert printed.startswith("loss ")  # the script's print, from the run in the worker
    assert (
        line.startswith("recorded neuron (emulated) run: 9 outputs, 1 scalar at 1 call site; ")
        and "fell back to CPU" in line
    )
    run = load("t.nwrun.zip").runs["target"]
    assert run.backend.emulated and "aten::sort" in run.fallback_ops()
    assert run.outputs["x"].device.type == "cpu"


def test_a_script_that_raises_is_recorded_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import torch\nx = torch.ones(2)\nraise ValueError('nope')\n")
    assert main(["record", "bad.py", "--backend", "cpu", "-o", "bad.nwrun.zip"]) == 1
    assert "raised ValueError: nope (line 3)" in capsys.readouterr().out
    run = load("bad.nwrun.zip").runs["ref"]
    assert run.error.type == "ValueError" and run.error.lineno == 3


def test_shows_what_the_script_printed_before_its_line_as_run_does(tmp_path, monkeypatch, capsys):
    # record showed only its `recorded ...` line: the script's own output was hidden
    monkeypatch.chdir(tmp_path)
    (tmp_path / "talk.py").write_text(
        "import sys\nimport torch\nprint('step 1')\nprint('careful', file=sys.stderr)\n"
        "x = torch.ones(2, device='cuda')\nprint('done', end='')\n"
    )
    assert main(["record", "talk.py", "--backend", "cpu", "-o", "talk.nwrun.zip"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "step 1\ndone\nrecorded cpu (as cuda) run: 1 outputs -> talk.nwrun.zip\n"
    assert captured.err == "careful\n"
    # a run that raised shows what it printed before the error too
    (tmp_path / "bad.py").write_text("print('starting')\nraise ValueError('nope')\n")
    assert main(["record", "bad.py", "--backend", "cpu", "-o", "bad.nwrun.zip"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("starting\nrecorded cpu (as cuda) run that raised ValueError: nope")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.py", "--backend", "gpu9000", "-o", "x.zip"], "unknown backend 'gpu9000'"),
        (["missing.py", "-o", "x.zip"], "no such script: missing.py"),
        (["notes.txt", "-o", "x.zip"], "expected a Python script (.py)"),
        (["train.py", "--role", "../x", "-o", "x.zip"], "--role '../x'"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(script, capsys, args, message):
    assert main(["record", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]


def test_an_int_too_large_to_record_is_left_out_with_its_reason(tmp_path, monkeypatch, capsys):
    # n = 10**5000 made the writer's json.dumps exceed Python's int-to-str digit limit: a
    # traceback and no file; the rest of the run is worth keeping
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.py").write_text("n = 10**5000\nm = 2\n")
    assert main(["record", "big.py", "--backend", "cpu", "-o", "big.nwrun.zip"]) == 0
    assert capsys.readouterr().out == "recorded cpu (as cuda) run: 2 outputs -> big.nwrun.zip\n"
    run = load("big.nwrun.zip").runs["ref"]
    assert run.outputs["m"] == 2
    assert run.outputs["n"].reason == "an int of more than 4300 digits is not recorded"
    assert main(["show", "big.nwrun.zip"]) == 0
    assert "1 outputs could not be stored" in capsys.readouterr().out


def test_a_training_scripts_loss_curve_is_counted_not_shown_as_an_empty_run(
    tmp_path, monkeypatch, capsys
):
    # a script whose loop lives in main() has no outputs, only its logged losses: record said
    # "0 outputs" and show "0 outputs (0 tensors, 0 bytes)", as if nothing had been recorded
    monkeypatch.chdir(tmp_path)
    (tmp_path / "curve.py").write_text(
        "import torch\n"
        "def main():\n"
        "    torch.manual_seed(0)\n"
        "    w = torch.randn(3, device='cuda', requires_grad=True)\n"
        "    opt = torch.optim.SGD([w], lr=0.1)\n"
        "    for step in range(3):\n"
        "        loss = w.square().sum()\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        print(f'step {step}: loss {loss.item():.4f}')\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    assert main(["record", "curve.py", "--backend", "cpu", "-q", "-o", "curve.nwrun.zip"]) == 0
    assert capsys.readouterr().out == (
        "recorded cpu (as cuda) run: 0 outputs, 3 scalars at 1 call site -> curve.nwrun.zip\n"
    )
    assert main(["show", "curve.nwrun.zip"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[4].endswith("ran; 0 outputs (0 tensors, 0 bytes)")
    assert lines[5] == "    observed 3 scalars at 1 call site"
    assert main(["show", "curve.nwrun.zip", "--json"]) == 0
    ref = json.loads(capsys.readouterr().out)["runs"]["ref"]
    assert (ref["outputs"], ref["scalars"], ref["scalar_sites"]) == (0, 3, 1)


def test_a_file_missed_from_the_scripts_folder_but_found_here_hints_at_cwd(
    tmp_path, monkeypatch, capsys
):
    # as run does: the recording ran from scripts/ and raised, with no word of --cwd
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "data.txt").write_text("2")
    (tmp_path / "scripts" / "rec.py").write_text(
        "import sys\nimport torch\nscale = float(open(sys.argv[1]).read())\n"
        "x = torch.ones(2, device='cuda') * scale\n"
    )
    args = ["record", "scripts/rec.py", "--backend", "cpu", "-o", "r.nwrun.zip"]
    assert main([*args, "--", "data.txt"]) == 1
    captured = capsys.readouterr()
    assert "run that raised FileNotFoundError" in captured.out
    assert captured.err.endswith(
        "which has no data.txt; this folder has it: add --cwd . to run the script from here, as "
        "python would\n"
    )
    assert main([*args, "--cwd", ".", "--", "data.txt"]) == 0
    assert "hint" not in capsys.readouterr().err


HELP_SCRIPT = """\
import argparse
import torch
parser = argparse.ArgumentParser(prog="ap.py")
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()
print(torch.ones(args.epochs, device="cuda").sum().item())
"""


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_scripts_own_help_is_printed_and_nothing_is_recorded(
    tmp_path, monkeypatch, capsys, flag
):
    # as `run SCRIPT -- --help`: the help and exit 0; an empty artifact was saved ("0 outputs")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ap.py").write_text(HELP_SCRIPT)
    assert main(["record", "ap.py", "--backend", "neuron", "-o", "h.nwrun.zip", "--", flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ap.py [-h] --epochs EPOCHS\n")
    assert "recorded" not in out
    assert not (tmp_path / "h.nwrun.zip").exists()

"""``neuron-workbench show ARTIFACT`` summarizes an artifact without running anything."""

import json

from neuron_workbench.backends import BackendInfo
from neuron_workbench.cli.main import main
from neuron_workbench.run import Run, RunError


def make_artifact(path):
    import torch

    from neuron_workbench.artifacts import save

    ref = Run(BackendInfo("cuda", "cuda:0", "NVIDIA H100"), outputs={"x": torch.ones(4), "n": 2})
    target = Run(
        BackendInfo("neuron", "neuron:0", "emulated neuron (host CPU)", emulated=True),
        error=RunError("RuntimeError", "no kernel", 2, "y = op(x)"),
        fallbacks=[{"op": "aten::sort", "count": 3}],
    )
    return save(
        path,
        runs={"ref": ref, "target": target},
        cell_source="x = 1\ny = op(x)\n",
        report={
            "verdict": "ERROR",
            "summary": "ERROR neuron (emulated) vs cuda — neuron raised RuntimeError: no kernel",
        },
    )


def test_text_summary(tmp_path, capsys):
    path = make_artifact(tmp_path / "a.nwrun.zip")
    assert main(["show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"artifact {path}"
    assert lines[1].startswith("  format 1, neuron-workbench ") and "created 20" in lines[1]
    assert lines[2].startswith("  recorded with torch ")
    assert lines[3].startswith("  cell sha256 ") and lines[3].endswith(", 2 lines")
    assert (
        lines[4]
        == "  run ref: cuda (real) on cuda:0 [NVIDIA H100], ran; 2 outputs (1 tensors, 16 bytes)"
    )
    assert lines[5] == (
        "  run target: neuron (emulated) on neuron:0 [emulated neuron (host CPU)], raised "
        "RuntimeError: no kernel; 0 outputs (0 tensors, 0 bytes)"
    )
    assert lines[6] == "    fell back to CPU: aten::sort"
    assert lines[7].startswith("  report: ERROR neuron (emulated) vs cuda")


def test_json_summary(tmp_path, capsys):
    path = make_artifact(tmp_path / "a.nwrun.zip")
    assert main(["show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format_version"] == 1 and data["cell"]["lines"] == 2
    assert data["runs"]["ref"]["emulated"] is False and data["runs"]["target"]["emulated"] is True
    assert data["runs"]["target"]["fallback_ops"] == ["aten::sort"]
    assert data["runs"]["ref"]["tensor_bytes"] == 16
    assert data["report"]["verdict"] == "ERROR"
    assert data["environment"]["torch"]


def test_not_an_artifact_exits_2(tmp_path, capsys):
    (tmp_path / "x.nwrun.zip").write_text("nope")
    assert main(["show", str(tmp_path / "x.nwrun.zip")]) == 2
    assert capsys.readouterr().err.endswith(
        "is not a neuron-workbench artifact (bad magic bytes)\n"
    )


def test_control_characters_of_an_artifact_are_shown_not_obeyed(tmp_path, capsys):
    # a crafted artifact's strings went to the terminal as they were: escape sequences in a
    # device name could clear the screen or rewrite what it shows
    import torch

    from neuron_workbench.artifacts import save

    ref = Run(
        BackendInfo("cuda", "cuda:0", "H100\x1b[2J\x1b[31mfake"), outputs={"x": torch.ones(2)}
    )
    path = save(tmp_path / "a.nwrun.zip", runs={"ref": ref}, cell_source="x = 1\n")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "[H100\\x1b[2J\\x1b[31mfake]" in out

"""``neuron-workbench compare A B``: a recorded reference against a recorded target."""

import json
import xml.etree.ElementTree as ET

import pytest

from neuron_workbench.artifacts import load
from neuron_workbench.cli.main import main

SCRIPT = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(3, 2).to(device)
x = torch.randn(4, 3, device=device)
loss = model(x).square().mean()
loss.backward()
"""
SORTS = SCRIPT + "values, order = torch.sort(x[:, 0])\n"
DRIFTS = SCRIPT + "flag = loss.detach().cpu() + (1.0 if x.device.type != 'cpu' else 0.0)\n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Artifacts recorded on the 'GPU host' (cpu here) and on the 'Trainium host' (emulated)."""
    folder = tmp_path_factory.mktemp("rec")
    made = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        for name, source in {"plain": SCRIPT, "sorts": SORTS, "drifts": DRIFTS}.items():
            (folder / f"{name}.py").write_text(source)
            for backend in ("cpu", "neuron"):
                out = folder / f"{name}-{backend}.nwrun.zip"
                assert main(["record", f"{name}.py", "--backend", backend, "-o", str(out)]) == 0
                made[name, backend] = out
    return made


def test_pass_prints_the_verdict_and_writes_reports(recorded, tmp_path, capsys):
    a, b = recorded["plain", "cpu"], recorded["plain", "neuron"]
    j, h, x = tmp_path / "c.json", tmp_path / "c.html", tmp_path / "c.xml"
    code = main(["compare", str(a), str(b), "--json", str(j), "--html", str(h), "--junit", str(x)])
    out = capsys.readouterr()
    assert code == 0 and out.err == ""
    assert out.out.startswith("PASS neuron (emulated) vs cpu (as cuda) — 7 outputs, 7 match")
    data = json.loads(j.read_text())
    assert data["summary"] == out.out.strip() and data["verdict"] == "PASS"
    assert data["artifacts"] == {"ref": str(a), "target": str(b)} and data["warnings"] == []
    assert data["ref"]["backend"]["emulated"] is False and data["target"]["backend"]["emulated"]
    assert 'class="nw-report"' in h.read_text()
    case = ET.parse(x).getroot().find("testsuite/testcase")
    assert case.get("name") == "cell 1" and case.find("failure") is None


def test_fallbacks_and_strict(recorded, capsys):
    a, b = recorded["sorts", "cpu"], recorded["sorts", "neuron"]
    assert main(["compare", str(a), str(b)]) == 0
    assert "fell back to CPU" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--strict"]) == 3
    # which ops, as `run --strict` says (the exit code alone left a CI log reading PASS)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"{a.name} vs {b.name}: --strict: on neuron these ops fell back to CPU: "
    )
    ops = line.split("fell back to CPU: ")[1].split(" (")[0].split(", ")
    assert main(["compare", str(a), str(b), "--strict", "--allow-fallback", ",".join(ops)]) == 0


def test_a_one_run_artifact_compared_with_itself_is_refused(recorded, capsys):
    # its one run stood for both sides: `compare ref.zip ref.zip` PASSed, a green CI job that
    # checked nothing
    a = recorded["plain", "cpu"]
    assert main(["compare", str(a), str(a)]) == 2
    assert capsys.readouterr().err == (
        f"neuron-workbench: error: {a} holds one run: comparing it with itself checks nothing; "
        "give the artifact of the other side as B\n"
    )


def test_numeric_failure_exits_1(recorded, capsys):
    assert main(["compare", str(recorded["drifts", "cpu"]), str(recorded["drifts", "neuron"])]) == 1
    assert capsys.readouterr().out.startswith("FAIL neuron (emulated) vs cpu (as cuda)")


def test_a_different_cell_source_is_a_warning_in_the_report(recorded, tmp_path, capsys):
    j = tmp_path / "w.json"
    code = main(
        [
            "compare",
            str(recorded["plain", "cpu"]),
            str(recorded["sorts", "neuron"]),
            "--json",
            str(j),
        ]
    )
    out = capsys.readouterr()
    assert code == 1  # the extra outputs are missing on the reference
    assert out.err.startswith(
        "warning: the recording plain-cpu.nwrun.zip ran a different cell source"
    )
    assert json.loads(j.read_text())["warnings"][0] == out.err.removeprefix("warning: ").strip()


def test_compare_matches_the_live_verdict_of_run_record(recorded, tmp_path, monkeypatch, capsys):
    # `run --record` keeps both runs; comparing that artifact with itself (A's ref vs B's target)
    # reproduces the live report exactly.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drifts.py").write_text(DRIFTS)
    assert main(["run", "drifts.py", "--ref", "cpu", "--record", "rec", "--json", "live.json"]) == 1
    both = tmp_path / "rec" / "drifts.nwrun.zip"
    assert main(["compare", str(both), str(both), "--json", "again.json"]) == 1
    live = json.loads((tmp_path / "live.json").read_text())["reports"][0]
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["summary"] == live["summary"]
    assert again["outputs"] == live["outputs"]
    capsys.readouterr()


def test_role_choice_and_bad_input(recorded, tmp_path, capsys):
    a = recorded["plain", "cpu"]
    assert main(["compare", str(a), str(a), "--rtol", "1e-3"]) == 2
    assert "give --rtol and --atol together" in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "none.zip")]) == 2
    assert (
        capsys.readouterr().err
        == f"neuron-workbench: error: no such artifact: {tmp_path / 'none.zip'}\n"
    )
    # An artifact with roles other than ref/target and more than one run is ambiguous.
    from neuron_workbench.artifacts import save

    runs = load(a).runs
    odd = save(
        tmp_path / "odd.nwrun.zip", runs={"x": runs["ref"], "y": runs["ref"]}, cell_source=""
    )
    assert main(["compare", str(odd), str(a)]) == 2
    assert "holds runs x, y and none is 'ref'" in capsys.readouterr().err

"""A live ``%%neuron`` cell and ``neuron-workbench compare`` of its recording give one report."""

import json

from neuron_workbench import testing
from neuron_workbench.cli.main import main

CELL = """\
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
model.to("cuda")
x = torch.randn(32, 8, device="cuda")
loss = model(x).square().mean()
loss.backward()
values, order = torch.sort(x[:, 0])
"""

#: Host timings differ between any two reports of the same runs; nothing else may.
TIMINGS = {"wall_time_s", "label", "cell_index", "artifacts"}


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def test_compare_of_a_recording_gives_the_live_report(tmp_path, capsys):
    artifact = tmp_path / "cell.nwrun.zip"
    shell = testing.testing_shell()
    testing.run_cell(shell, "import torch")
    flags = (
        f"--ref cpu --preset fp32-accelerator --tol loss=1e-3,1e-4 --no-scan --record {artifact}"
    )
    testing.run_cell(shell, f"%%neuron {flags} -o report\n{CELL}")
    live = shell.user_ns["report"].to_dict()
    assert live["verdict"] == "PASS" and live["target"]["fallbacks"]
    out = tmp_path / "compared.json"
    assert main(["compare", str(artifact), str(artifact), "--json", str(out)]) == 0
    capsys.readouterr()
    compared = json.loads(out.read_text())
    assert compared["options"]["tolerance"]["preset"] == "fp32-accelerator"
    # the one thing compare adds: which of the recording's settings judged it (an edited
    # recording's tolerances turned a FAIL into a PASS without a word)
    recorded = "judged with the tolerances the recording was made with: "
    assert (
        compared["notes"].pop()
        == recorded + "preset fp32-accelerator; per_output loss=0.001,0.0001"
    )
    assert _without_timings(compared) == _without_timings(json.loads(json.dumps(live)))


def test_the_migration_tab_sees_what_earlier_cells_imported():
    # `nn.DataParallel(...)` in a cell whose `nn` (or `DataParallel`) an earlier cell imported
    import torch
    from torch.nn import DataParallel

    from neuron_workbench.cell.session import migration_findings

    def rules(source, namespace):
        found = migration_findings(source, "neuron", namespace=namespace)
        return {f["rule_id"] for f in found["findings"]}

    assert rules("m = nn.DataParallel(model)", {}) == set()
    assert rules("m = nn.DataParallel(model)", {"nn": torch.nn}) == {"NW141"}
    assert rules("m = DataParallel(model)", {"DataParallel": DataParallel}) == {"NW141"}
    assert rules("m = DataParallel(model)", {"DataParallel": object}) == set()  # not torch's


def test_a_recording_of_only_target_runs_is_no_reference(tmp_path, monkeypatch, capsys):
    # `run train.py --against trn.nwrun.zip` with the Trainium recording (role target) compared
    # the neuron run with itself: 'PASS neuron (emulated) vs neuron (emulated)', exit 0.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("import torch\ny = torch.ones(3, device='cuda') * 2\n")
    for role in ("target", "ref"):
        made = ["record", "s.py", "--backend", "neuron", "--role", role, "-o", f"{role}.nwrun.zip"]
        assert main(made) == 0
    capsys.readouterr()
    assert main(["run", "s.py", "--against", "target.nwrun.zip"]) == 2
    assert "target.nwrun.zip holds no reference run (its runs: target)" in capsys.readouterr().err
    assert main(["run", "s.py", "--against", "ref.nwrun.zip"]) == 0  # any other role still is


def test_a_cell_recording_over_the_recording_it_runs_against_is_refused(tmp_path):
    # `%%neuron --against X --record X` saved its target-only artifact over X: the reference gone
    from neuron_workbench.artifacts import load

    path = tmp_path / "cell.nwrun.zip"
    shell = testing.testing_shell()
    testing.run_cell(shell, "import torch")
    cell = "x = torch.ones(3, device='cuda') * 2"
    testing.run_cell(shell, f"%%neuron --record {path}\n{cell}")
    same = f"%%neuron --against {path} --record {tmp_path / '.' / path.name}\n{cell}"
    result = testing.run_cell(shell, same, allow_error=True)
    assert "is the recording --against reads" in str(result.error_in_exec)
    assert set(load(path).runs) == {"ref", "target"}

"""%%neuron options that hand off to other packages: --profile, --strict, --record/--against."""

from IPython.core.error import UsageError

from neuron_workbench.testing import run_cell

FALLBACK_CELL = """import torch
values, order = torch.sort(torch.tensor([3.0, 1.0, 2.0], device="cuda"))
pooled = torch.nn.functional.max_pool2d(torch.ones(1, 1, 4, 4, device="cuda"), 2)
"""


def test_profile_adds_op_rows_for_both_runs(ip):
    run_cell(ip, f"%%neuron --ref cpu --target neuron --profile -o r\n{FALLBACK_CELL}")
    data = ip.user_ns["r"].to_dict()
    for role in ("ref", "target"):
        ops = {row["op"] for row in data[role]["profile"]["rows"]}
        assert "aten::sort" in ops
    assert data["target"]["profile"]["time_kind"] == "host CPU time"


def test_strict_fails_the_cell_and_allow_fallback_exempts_ops(ip):
    result = run_cell(
        ip, f"%%neuron --ref cpu --target neuron --strict -o r\n{FALLBACK_CELL}", allow_error=True
    )
    assert isinstance(result.error_in_exec, UsageError)
    message = str(result.error_in_exec)
    assert message.startswith("strict mode: 2 ops fell back to CPU on neuron: ")
    assert "aten::sort" in message and "aten::max_pool2d_with_indices" in message
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --strict "
        f"--allow-fallback aten::sort,max_pool2d_with_indices -o r\n{FALLBACK_CELL}",
    )
    assert ip.user_ns["r"].verdict == "PASS"


def test_a_quoted_layers_full_glob_and_allow_fallback_op_match_as_in_a_shell(ip):
    # IPython keeps the quotes a shell strips: --layers-full "blocks.*" kept nothing (the pattern
    # held the quotes, and no module name does) and --allow-fallback 'aten::sort' exempted nothing
    run_cell(
        ip,
        "import torch\ntorch.manual_seed(0)\n"
        "blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())\n"
        "x = torch.randn(2, 4)",
    )
    run_cell(ip, '%%neuron --layers-full "1" -o r\ny = blocks.cuda()(x.cuda())')
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert [d.path for d in report.layers.full_diffs] == ["<1 output>"]
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --strict --allow-fallback 'aten::sort' "
        '--allow-fallback "max_pool2d_with_indices" -o r\n' + FALLBACK_CELL,
    )
    assert ip.user_ns["r"].verdict == "PASS"


def test_record_then_against_reproduces_the_verdict(ip, tmp_path):
    cell = (
        "import torch\nx = torch.linspace(0, 1, 5, device='cuda')\n"
        "shifted = x + (0.0 if x.device.type == 'cpu' else 1e-3)\nsame = x * 2"
    )
    path = tmp_path / "run.nwrun.zip"
    run_cell(ip, f"%%neuron --ref cpu --target neuron --record {path} -o live\n{cell}")
    assert path.is_file()
    run_cell(ip, f"%%neuron --target neuron --against {path} -o replay\n{cell}")
    live, replay = ip.user_ns["live"], ip.user_ns["replay"]
    assert live.verdict == replay.verdict == "FAIL"
    assert [d.status for d in live.comparison.diffs] == [d.status for d in replay.comparison.diffs]
    assert replay.ref.backend.name == "cpu" and not replay.warnings
    run_cell(ip, f"%%neuron --target neuron --against {path} -o changed\n{cell}\nextra = 1")
    assert any("source" in w for w in ip.user_ns["changed"].warnings)


def test_a_recording_path_with_spaces_is_given_in_quotes(ip, tmp_path):
    # IPython splits the line keeping quotes: the file went to a folder named `"my runs`
    path = tmp_path / "my runs" / "a b.nwrun.zip"
    cell = "import torch\nx = torch.ones(2, device='cuda')"
    run_cell(ip, f'%%neuron --record "{path}" -o live\n{cell}')
    assert path.is_file()
    run_cell(ip, f"%%neuron --against '{path}' -o replay\n{cell}")
    assert ip.user_ns["replay"].verdict == "PASS"


def test_against_a_recording_a_class_changes_as_the_target_run_changed_it(ip, tmp_path):
    # With --against the target's is the only run: the class change it made is the cell's. (The
    # kernel keeps its own class when its reference run is live, and that run changed it.)
    path = tmp_path / "run.nwrun.zip"
    setup = "import torch\nclass C:\n    n = 0\n    def get(self):\n        return C.n"
    cell = "obj = C()\nC.n += 1\nx = torch.ones(2).cuda()"
    for option in (f"--record {path}", f"--against {path}"):
        run_cell(ip, setup)
        run_cell(ip, f"%%neuron {option} -o r\n{cell}")
        assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()
        assert (ip.user_ns["C"].n, ip.user_ns["obj"].get()) == (1, 1), option
        assert type(ip.user_ns["obj"]) is ip.user_ns["C"]


def test_against_a_missing_file_is_a_one_line_usage_error(ip, tmp_path):
    result = run_cell(ip, f"%%neuron --against {tmp_path / 'nope.zip'}\nx = 1", allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert "\n" not in str(result.error_in_exec)


def test_layer_statistics_do_not_show_up_in_the_op_profile(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --profile --layers -o r\nimport torch\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).cuda()\n"
        "out = net(torch.ones(2, 4, device='cuda'))",
    )
    data = ip.user_ns["r"].to_dict()
    assert len(data["layers"]["layers"]) == 3
    for role in ("ref", "target"):
        ops = {row["op"] for row in data[role]["profile"]["rows"]}
        assert "aten::addmm" in ops
        assert not ops & {"aten::linalg_vector_norm", "aten::aminmax"}


def test_record_dir_names_the_file_after_the_running_cell(ip, tmp_path):
    ip.run_cell(f"%config NeuronMagics.record_dir = {str(tmp_path)!r}")
    count = ip.execution_count  # the number this cell runs as (In[count])
    ip.run_cell("%%neuron\nimport torch\nx = torch.ones(2).cuda() * 2", store_history=True)
    assert [p.name for p in tmp_path.iterdir()] == [f"cell-{count}.nwrun.zip"]
    ip.run_cell("%config NeuronMagics.record_dir = ''")


def test_a_cells_own_recording_named_as_the_folders_is_saved_once(ip, tmp_path):
    # --record PATH naming the file record_dir writes for the cell: copying it onto itself raised
    # SameFileError, and the cell's report was lost
    run_cell(ip, "import torch")
    run_cell(ip, f"%config NeuronMagics.record_dir = {str(tmp_path)!r}")
    count = ip.execution_count
    path = tmp_path / f"cell-{count}.nwrun.zip"
    run_cell(ip, f"%%neuron --record {path} -o r\nx = torch.ones(2, device='cuda')")
    assert ip.user_ns["r"].verdict == "PASS" and path.is_file()


def test_a_preset_with_rtol_and_atol_is_a_one_line_usage_error(ip):
    # --rtol/--atol set every output's tolerance: the preset given beside them was silently ignored
    # (`--preset strict --rtol 1e-3 --atol 1e-3` judged at 1e-3, not bitwise). A session's preset
    # (%config) with a cell's pair stays allowed: the cell's own flags win there.
    run_cell(ip, "import torch\nx = torch.ones(3)")
    result = run_cell(
        ip, "%%neuron --preset strict --rtol 1e-3 --atol 1e-3\ny = x.cuda()", allow_error=True
    )
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == (
        "--rtol and --atol set every output's tolerance, which replaces --preset: "
        "give one or the other"
    )
    run_cell(ip, "%config NeuronMagics.preset = 'strict'")
    try:
        run_cell(ip, "%%neuron --rtol 1e-3 --atol 1e-3 -o r\ny = x.cuda() * 1.0001")
        assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()
    finally:
        run_cell(ip, "%config NeuronMagics.preset = 'default'")

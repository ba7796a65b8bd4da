"""Scanning source text: positions, wording per target, errors, IPython syntax, imports."""

import textwrap

import pytest

from neuron_workbench.scan import RULES, Finding, scan_source


def ids(source):
    return [f.rule_id for f in scan_source(textwrap.dedent(source), "snippet.py")]


def test_findings_carry_rule_data_and_linter_position():
    source = 'import torch\n\nx = torch.ones(1, device="cuda")  # comment with cuda\n'
    (finding,) = scan_source(source, "train.py")
    assert isinstance(finding, Finding)
    assert (finding.line, finding.col) == (3, 26)  # 1-based, at the string
    assert finding.format() == (
        'train.py:3:26: NW101 [*] device string "cuda" names a CUDA GPU (`device=`)'
    )
    assert finding.format(suggestion=True).endswith('\n    help: use "neuron"')
    assert finding.to_dict()["rule_id"] == "NW101" and finding.to_dict()["cell"] is None
    assert finding.source == RULES["NW101"].source


def test_columns_count_characters_not_bytes():
    (finding,) = scan_source('s = "é"; x = t.cuda()', "u.py")
    assert finding.col == 16  # byte offset would be 17


def test_method_call_position_points_at_cuda():
    (finding,) = scan_source("model = Net(\n    3\n).cuda()", "m.py")
    assert (finding.line, finding.col) == (3, 3)


def test_tpu_target_wording_and_mappings():
    found = scan_source(
        'import torch\ntorch.cuda.set_device(0)\ntorch.cuda.manual_seed(1)\nx = t.to("cuda")\n',
        "t.py",
        target="tpu",
    )
    by_rule = {(f.line, f.rule_id): f for f in found}
    assert "torch.accelerator.set_device_index" in by_rule[(2, "NW103")].suggestion
    assert by_rule[(2, "NW103")].fixable
    assert not by_rule[(3, "NW103")].fixable  # no torch.accelerator seeding API
    assert by_rule[(4, "NW101")].suggestion == 'use "tpu"'


def test_unknown_target_is_a_usage_error():
    from neuron_workbench.errors import WorkbenchUsageError

    with pytest.raises(WorkbenchUsageError):
        scan_source("x = 1", target="gpu")


def test_syntax_error_names_path_and_line():
    from neuron_workbench.scan import ScanSyntaxError

    with pytest.raises(ScanSyntaxError, match=r"^bad\.py:2:\d+: cannot parse"):
        scan_source("x = 1\ny = (\n", "bad.py")


def test_ipython_lines_are_skipped_in_cells_but_not_in_files():
    # (a shell line is read for the command it runs: NW131)
    cell = "%matplotlib inline\n!nvidia-smi\nfiles = !ls\nx = t.cuda()\nobj?\n"
    assert [(f.rule_id, f.line) for f in scan_source(cell)] == [("NW131", 2), ("NW102", 4)]
    from neuron_workbench.scan import ScanSyntaxError

    with pytest.raises(ScanSyntaxError):
        scan_source(cell, "script.py")


def test_percent_continuation_line_in_a_cell_is_python():
    cell = 'msg = ("%s"\n       % name)\nx = t.cuda()\n'
    assert [f.line for f in scan_source(cell)] == [3]


def test_cell_magics():
    assert [f.line for f in scan_source("%%neuron --target neuron\nx = t.cuda()\n")] == [2]
    assert [f.line for f in scan_source("%%time\nx = t.cuda()\n")] == [2]
    assert scan_source("%%bash\necho x.cuda()\n") == []
    assert [f.line for f in scan_source("%%writefile train.py\nx = t.cuda()\n")] == [2]
    assert scan_source("%%writefile notes.txt\nnot python (\n") == []


def test_namespace_imports_resolve_aliases_from_other_cells():
    src = "T.cuda.synchronize()\nwith autocast():\n    pass\n"
    assert ids(src) == []
    found = scan_source(src, imports={"T": "torch", "autocast": "torch.cuda.amp.autocast"})
    assert {f.rule_id for f in found} == {"NW103", "NW110", "NW111"}


def test_targets_are_the_emulated_devices():
    # Two spellings of one idea until a torch-free module holds it (scan must not import torch).
    from neuron_workbench.emulator.profiles import DEVICES
    from neuron_workbench.scan import TARGETS

    assert TARGETS == DEVICES

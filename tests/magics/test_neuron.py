"""%%neuron end to end in a real IPython shell, against the emulated neuron device."""

import json

import pytest
import torch
from IPython.core.error import UsageError

from neuron_workbench.report import Report
from neuron_workbench.testing import run_cell, user_ns_snapshot

SETUP = """
import torch
import torch.nn as nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
"""


def report_of(ip, name="r") -> Report:
    report = ip.user_ns[name]
    assert isinstance(report, Report)
    return report


def test_matching_cuda_cell_passes_and_keeps_reference_results(ip):
    run_cell(ip, SETUP)
    run_cell(
        ip,
        """%%neuron --ref cpu --target neuron -o r
device = "cuda" if torch.cuda.is_available() else "cpu"
model = Tiny().to(device)
x = torch.randn(5, 4, device=device)
out = model(x)
out.sum().backward()
out.shape[0]
""",
    )
    report = report_of(ip)
    assert report.verdict == "PASS" and bool(report)
    assert report.target.backend.name == "neuron" and report.target.backend.emulated
    assert report.ref.backend.name == "cpu"
    summary = report.summary()
    assert summary.startswith("PASS neuron (emulated) vs cpu (as cuda) — ")
    paths = [d.path for d in report.comparison.diffs]
    for expected in ("device", "x", "out", "model.fc1.weight", "model.fc1.weight.grad", "Out"):
        assert expected in paths
    assert f"{len(paths)} outputs, {len(paths)} match" in summary
    # the namespace holds the reference run's results, on the reference device
    assert ip.user_ns["out"].device.type == "cpu"
    assert ip.user_ns["model"].fc1.weight.grad is not None
    # the trailing expression is the cell's value, as without the magic
    assert ip.user_ns["_"] == 5


@pytest.mark.inprocess_device
def test_keep_target_leaves_target_results(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --keep target --executor inprocess\n"
        "import torch\ny = torch.ones(3, device='cuda') * 2",
    )
    assert ip.user_ns["y"].device.type == "neuron"
    assert torch.equal(ip.user_ns["y"].cpu(), torch.full((3,), 2.0))


@pytest.mark.inprocess_device
@pytest.mark.parametrize("keep", ["ref", "target"])
def test_in_process_a_notebook_file_gets_the_kept_runs_lines_once(ip, tmp_path, keep):
    # Both runs here wrote every line to the notebook's open file, and the target's run after a
    # reference that closed it raised "I/O operation on closed file".
    path = tmp_path / "train.log"
    run_cell(ip, f"import torch\nlog = open({str(path)!r}, 'w')")
    for line in ("first", "second"):
        run_cell(
            ip,
            f"%%neuron --executor inprocess --keep {keep} -o r\n"
            f"print({line!r}, file=log)\nn = torch.ones(1, device='cuda').sum().item()",
        )
        assert report_of(ip).verdict == "PASS", report_of(ip).summary()
    run_cell(ip, "%%neuron --executor inprocess -o r\nlog.close()\nn = 2")
    assert report_of(ip).verdict == "PASS", report_of(ip).summary()
    assert ip.user_ns["log"].closed
    assert path.read_text() == "first\nsecond\n"


def test_cell_whose_result_depends_on_backend_fails_with_the_output_named(ip):
    run_cell(
        ip,
        """%%neuron --ref cpu --target neuron -o r
import torch
on_accelerator = torch.zeros(1, device="cuda").device.type != "cpu"
score = torch.tensor([1.0, 2.0]) + (0.5 if on_accelerator else 0.0)
same = torch.arange(4)
""",
    )
    report = report_of(ip)
    assert report.verdict == "FAIL" and not report
    failed = {d.path: d for d in report.comparison.failures}
    assert set(failed) == {"on_accelerator", "score"}
    assert failed["score"].max_abs == pytest.approx(0.5)
    summary = report.summary()
    assert summary.startswith(
        "FAIL neuron (emulated) vs cpu (as cuda) — 3 outputs, 1 match, 2 differ: "
    )
    # a failed comparison still commits the reference run
    assert ip.user_ns["on_accelerator"] is False


def test_python_ints_of_any_size_compare_exactly(ip):
    # `n = 10**400` read "ValueError: Overflow when unpacking long long" (an int64 tensor cannot
    # hold it), an error that failed the cell; a recorded artifact compares the same way
    run_cell(
        ip,
        """%%neuron --ref cpu --target neuron -o r
import torch
same = 10**400
drifts = 10**400 + (1 if torch.zeros(1, device="cuda").device.type != "cpu" else 0)
""",
    )
    report = report_of(ip)
    assert report.summary() == (
        "FAIL neuron (emulated) vs cpu (as cuda) — 2 outputs, 1 match, 1 differs: "
        "drifts max|Δ| 1.0e+00 > 0.0e+00"
    )
    assert json.dumps(report.to_dict(), allow_nan=False)
    assert ip.user_ns["same"] == 10**400 and ip.user_ns["drifts"] == 10**400


def test_raise_on_target_only_reports_it_and_leaves_namespace_unchanged(ip):
    run_cell(ip, "import torch\nkept = torch.zeros(2)\ncounter = 1")
    before = user_ns_snapshot(ip)
    kept_before = ip.user_ns["kept"].clone()
    run_cell(
        ip,
        """%%neuron --ref cpu --target neuron -o r
kept.add_(1)
counter = counter + 1
fresh = 3
if torch.zeros(1, device="cuda").device.type == "neuron":
    raise ValueError("only on the accelerator")
""",
    )
    report = report_of(ip)
    assert report.verdict == "ERROR"
    assert report.ref.ok and not report.target.ok
    assert report.target.error.type == "ValueError"
    assert report.target.error.message == "only on the accelerator"
    assert report.target.error.lineno == 6  # counted as the editor does: %%neuron is line 1
    assert "raise ValueError" in report.target.error.line
    assert "neuron raised ValueError: only on the accelerator (cell line 6)" in report.summary()
    after = user_ns_snapshot(ip)
    after.pop("r")
    assert after == before
    assert "fresh" not in ip.user_ns and ip.user_ns["counter"] == 1
    assert torch.equal(ip.user_ns["kept"], kept_before)


def test_raise_on_both_backends(ip):
    run_cell(ip, "import torch\nz = 1")
    before = user_ns_snapshot(ip)
    run_cell(ip, "%%neuron --ref cpu --target neuron -o r\nz = 2\n1 / 0")
    report = report_of(ip)
    assert report.verdict == "ERROR"
    assert report.ref.error.type == report.target.error.type == "ZeroDivisionError"
    assert report.summary().count("raised ZeroDivisionError") == 2
    after = user_ns_snapshot(ip)
    after.pop("r")
    assert after == before and ip.user_ns["z"] == 1


def test_an_error_whose_message_cannot_be_made_is_an_error_report(ip):
    # str() of the cell's exception raised in turn: a traceback through the workbench's records
    # instead of the ERROR report (Python's own traceback says "<exception str() failed>")
    run_cell(
        ip,
        "import torch\n"
        "class ShapeError(Exception):\n"
        "    def __str__(self):\n"
        "        return f'expected {self.expected}'  # never set: its __str__ fails\n",
    )
    run_cell(ip, "%%neuron -o r\ny = torch.ones(2, device='cuda')\nraise ShapeError()")
    report = report_of(ip)
    assert report.verdict == "ERROR"
    assert report.summary().count("raised ShapeError: <exception str() failed> (cell line 3)") == 2
    assert "y" not in ip.user_ns


def test_keyboard_interrupt_leaves_namespace_unchanged(ip):
    run_cell(ip, "import torch\nmodel_state = torch.ones(2)")
    before = user_ns_snapshot(ip)
    result = run_cell(
        ip,
        """%%neuron --ref cpu --target neuron
model_state.mul_(3)
created = 1
if torch.zeros(1, device="cuda").device.type == "neuron":
    raise KeyboardInterrupt
""",
        allow_error=True,
    )
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert user_ns_snapshot(ip) == before
    assert torch.equal(ip.user_ns["model_state"], torch.ones(2))


def test_unknown_backend_is_a_one_line_usage_error(ip):
    result = run_cell(ip, "%%neuron --target gpu9000\nx = 1", allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert (
        str(result.error_in_exec)
        == "unknown backend 'gpu9000'; choose one of: cpu, cuda, neuron, tpu"
    )
    assert "x" not in ip.user_ns


def test_bad_flag_is_a_usage_error(ip):
    result = run_cell(ip, "%%neuron --no-such-flag\nx = 1", allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert "x" not in ip.user_ns
    result = run_cell(ip, "%%neuron --rtol 0.1\nx = 1", allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert "together" in str(result.error_in_exec)


@pytest.mark.parametrize(
    "source",
    [
        "%%neuron --record 'runs/a b.nwrun.zip -o r\nx = 1",
        "%neuron_scan 'train.py",
        '%neuron_migrate "train.py',
    ],
)
def test_an_unclosed_quote_in_a_magics_line_is_one_usage_line(ip, source):
    # IPython's splitter raised shlex's ValueError: a traceback through shlex.py, not a line
    result = run_cell(ip, source, allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    options = source.split("\n")[0].split(" ", 1)[1]
    assert str(result.error_in_exec) == f"No closing quotation in the options: {options}"
    assert "x" not in ip.user_ns


@pytest.mark.parametrize(
    ("source", "first_line"),
    [
        ("%%neuron -h\nx = 1", "Run the cell on a reference and a target backend"),
        ("%%neuron --target tpu --help\nx = 1", "Run the cell on a reference and a target"),
        ("%neuron_scan -h", "Scan code for CUDA-only constructs"),
        ("%neuron_migrate --help", "Rewrite the mechanically safe CUDA-isms"),
    ],
)
def test_help_on_a_magics_line_prints_its_help_and_runs_nothing(ip, capsys, source, first_line):
    # argparse's -h is off in IPython's magic parsers: it was "unrecognized arguments: -h"
    result = run_cell(ip, source)
    assert result.error_in_exec is None and result.result is None
    shown = capsys.readouterr().out
    assert first_line in shown and "--target" in shown and "x" not in ip.user_ns


def test_syntax_error_in_cell_is_a_usage_error(ip):
    result = run_cell(ip, "%%neuron\nx = (", allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    # line 1 is the %%neuron line; the unclosed bracket is on line 2, as the editor counts
    assert "syntax error in the cell, line 2" in str(result.error_in_exec)


@pytest.mark.parametrize(
    "body, says",
    [
        ("async def f():\n    return 1\nx = await f()", "line 4: 'await' outside function"),
        ("x = 1\nreturn x", "line 3: 'return' outside function"),
    ],
)
def test_what_only_the_whole_cell_shows_is_a_syntax_error_of_one_line(ip, body, says):
    # compile() of the whole cell raised these after the parse: a raw traceback
    result = run_cell(ip, f"%%neuron\n{body}", allow_error=True)
    assert isinstance(result.error_in_exec, UsageError)
    assert f"syntax error in the cell, {says}" in str(result.error_in_exec)


def test_a_cell_run_again_after_an_input_transformer_was_added_is_transformed_by_it(ip):
    # The magic remembers the Python IPython made of a cell; a transformer the notebook adds (as
    # an extension does) applies to the same cell run again.
    cell = "%%neuron -o r\ny = torch.ones(2).cuda() * SCALE"
    run_cell(ip, "import torch\nSCALE = 2")
    run_cell(ip, cell)
    assert ip.user_ns["y"].tolist() == [2.0, 2.0]

    def scale_by_three(lines):
        # (the cell body's own first line: IPython's pass over the whole cell leaves it alone)
        if not lines or not lines[0].startswith("y ="):
            return lines
        return [line.replace("SCALE", "3") for line in lines]

    ip.input_transformers_cleanup.append(scale_by_three)
    try:
        run_cell(ip, cell)
    finally:
        ip.input_transformers_cleanup.remove(scale_by_three)
    assert ip.user_ns["y"].tolist() == [3.0, 3.0]
    run_cell(ip, cell)
    assert ip.user_ns["y"].tolist() == [2.0, 2.0]


def test_functions_from_earlier_cells_see_each_runs_own_copy(ip):
    run_cell(ip, SETUP)
    run_cell(
        ip,
        """
model = Tiny()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
original = model.fc1.weight.detach().clone()

def train_step(batch):
    opt.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    opt.step()
    return loss
""",
    )
    run_cell(
        ip,
        """%%neuron --ref cpu --target neuron -o r
batch = torch.randn(3, 4).to("cuda")
model.to("cuda")
loss = train_step(batch)
""",
    )
    report = report_of(ip)
    assert report.verdict == "PASS", report.summary()
    paths = {d.path for d in report.comparison.diffs}
    # the model was changed in place by the optimizer, so it is compared though never rebound
    assert "model.fc1.weight" in paths and "model.fc1.weight.grad" in paths
    assert "opt.state[0]['momentum_buffer']" not in paths  # plain SGD keeps no state
    # one optimizer step happened, not two: both runs started from their own copy
    model = ip.user_ns["model"]
    assert not torch.equal(model.fc1.weight.detach(), ip.user_ns["original"])
    steps = (ip.user_ns["original"] - model.fc1.weight.detach()).abs().max()
    assert steps < 0.1 * 2  # lr * one gradient
    assert ip.user_ns["opt"].param_groups[0]["params"][0] is model.fc1.weight


def test_tensors_put_on_cuda_by_a_previous_cell_follow_each_run(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron\nimport torch\nw = torch.ones(3, device='cuda')\nhost = torch.ones(3)",
    )
    run_cell(
        ip,
        """%%neuron --ref cpu --target neuron -o r
where_w = w.device.type
where_host = host.device.type
""",
    )
    report = report_of(ip)
    # each run's name for the cell's cuda: the same device as each run sees it
    assert report.verdict == "PASS", report.summary()
    assert report.target.outputs["where_w"] == "neuron"
    assert report.ref.outputs["where_w"] == "cpu"
    assert report.target.outputs["where_host"] == "cpu"
    diffs = {d.path: d for d in report.comparison.diffs}
    assert diffs["where_w"].detail == "the runs' devices: 'cpu' and 'neuron'"
    assert diffs["where_host"].detail == ""


def test_printed_output_is_shown_once_and_recorded_per_run(ip, capsys):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron -o r\nimport torch\nprint('hello from', torch.zeros(1, device='cuda').device.type)",
    )
    report = report_of(ip)
    assert report.ref.stdout == "hello from cpu\n"
    assert report.target.stdout == "hello from neuron\n"
    out = capsys.readouterr().out
    assert out.count("hello from") == 1 and "hello from cpu" in out


def test_config_sets_defaults(ip):
    run_cell(ip, "%config NeuronMagics.target = 'cpu'")
    try:
        run_cell(ip, "%%neuron --ref cpu -o r\nimport torch\nv = torch.ones(2, device='cuda')")
        assert report_of(ip).target.backend.name == "cpu"
    finally:
        run_cell(ip, "%config NeuronMagics.target = 'neuron'")


def test_help_is_generated_from_the_arguments(ip):
    magic = ip.find_cell_magic("neuron")
    doc = magic.__doc__
    assert "Run the cell on a reference and a target backend" in doc
    for flag in ("--ref", "--target", "--rtol", "--atol", "--seed", "--keep", "-o"):
        assert flag in doc


def test_report_renders_text_and_html(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron -o r\nimport torch\nv = torch.ones(2, device='cuda')",
    )
    bundle = report_of(ip)._repr_mimebundle_()
    assert bundle["text/plain"] == report_of(ip).summary()
    assert "emulated" in bundle["text/html"]
    assert "application/vnd.neuron-workbench.report+json" in bundle


def test_neuron_backends_lists_every_backend(ip):
    result = run_cell(ip, "%neuron_backends")
    lines = repr(result.result).splitlines()
    assert [line.split()[0] for line in lines] == ["cpu", "cuda", "neuron", "tpu"]
    assert "available" in lines[0]


def test_load_ext_registers_the_scan_magics_too(ip):
    assert ip.find_line_magic("neuron_scan") is not None
    assert ip.find_cell_magic("neuron_migrate") is not None

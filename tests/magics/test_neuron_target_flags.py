"""%%neuron --list-fallbacks (tpu) and --track-per-op (neuron): the adapters' options, per cell.

The pytest process emulates neuron, so tpu cells run in a worker process: the options travel with
each request and reach an adapter that was started without them.
"""

import pytest
from IPython.core.error import UsageError

from neuron_workbench.backends.tpu import LIST_FALLBACKS_ENV
from neuron_workbench.testing import run_cell

TPU_CELL = """
x = torch.arange(8.0).cuda().reshape(2, 4)
a = torch.special.i0(x)
b = x.kthvalue(2).values
for _ in range(2):
    c = torch.special.i0(x + 1)
"""


def _report(ip, line, cell=TPU_CELL):
    run_cell(ip, f"%%neuron {line} -o r\n{cell}")
    return ip.user_ns["r"]


def _ops(report):
    counts = {}
    for event in report.target.fallbacks:
        counts[event["op"]] = counts.get(event["op"], 0) + event["count"]
    return counts


def test_list_fallbacks_lists_every_missing_tpu_op_in_one_run(ip, monkeypatch):
    monkeypatch.delenv(LIST_FALLBACKS_ENV, raising=False)
    run_cell(ip, "import torch")
    first = _report(ip, "--target tpu --ref cpu")
    assert first.verdict == "ERROR"
    assert first.target.error.message == (
        "operator 'aten::i0.out' is not implemented for TPU. Please file a feature request"
    )
    full = _report(ip, "--target tpu --ref cpu --list-fallbacks")
    assert full.verdict == "PASS", full.summary()
    assert _ops(full) == {"aten::i0": 3, "aten::kthvalue": 1}
    assert full.options["list_fallbacks"] is True
    assert full.target.backend.details["fallback_mode"].startswith("full list")
    # the same worker goes back to TorchTPU's default for the next cell
    assert _report(ip, "--target tpu --ref cpu").verdict == "ERROR"


def test_list_fallbacks_from_the_config_and_the_variable(ip, monkeypatch):
    monkeypatch.delenv(LIST_FALLBACKS_ENV, raising=False)
    run_cell(ip, "import torch")
    ip.run_line_magic("config", "NeuronMagics.list_fallbacks = True")
    try:
        assert _ops(_report(ip, "--target tpu --ref cpu")) == {"aten::i0": 3, "aten::kthvalue": 1}
    finally:
        ip.run_line_magic("config", "NeuronMagics.list_fallbacks = False")
    # the variable set in the kernel reaches a worker started without it
    monkeypatch.setenv(LIST_FALLBACKS_ENV, "1")
    assert _report(ip, "--target tpu --ref cpu").verdict == "PASS"


def test_track_per_op_is_recorded_and_both_flags_apply_to_their_own_targets(ip, monkeypatch):
    monkeypatch.delenv(LIST_FALLBACKS_ENV, raising=False)
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron --target neuron,tpu --ref cpu --list-fallbacks --track-per-op -o both\n"
        + TPU_CELL,
    )
    neuron, tpu = ip.user_ns["both"]
    assert neuron.options["track_per_op"] is True and tpu.options["list_fallbacks"] is True
    assert tpu.verdict == "PASS" and _ops(tpu) == {"aten::i0": 3, "aten::kthvalue": 1}
    assert neuron.verdict == "PASS"
    # emulated neuron tracks every fallback per call anyway; the mode is named only when real
    assert "fallback_tracking" not in neuron.target.backend.details


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--target neuron --list-fallbacks", "--list-fallbacks applies to a tpu target"),
        ("--target tpu --track-per-op", "--track-per-op applies to a neuron target"),
        ("--target tpu --on 10.0.0.1:10001", "--on takes ray://HOST:PORT"),
    ],
)
def test_a_flag_for_another_target_is_a_one_line_usage_error(ip, line, message):
    with pytest.raises(UsageError) as info:
        run_cell(ip, f"%%neuron {line}\nx = 1")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


SCALED_STEP = """
net.cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.float16):
    loss = net(inputs.cuda()).float().pow(2).mean()
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
"""


def test_a_missing_tpu_op_error_says_what_to_do_next(ip):
    # A float16 GradScaler step on tpu stopped at TorchTPU's first missing op (its CPU fallback is
    # off by default) with only "Please file a feature request": the report named no way on.
    run_cell(ip, "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(8, 4)")
    run_cell(ip, "inputs = torch.randn(4, 8)")
    report = _report(ip, "--target tpu", SCALED_STEP)
    assert report.verdict == "ERROR" and report.ref.ok, report.summary()
    [note] = [n for n in report.notes if n.startswith("tpu (emulated) error: ")]
    assert "TorchTPU has no kernel for aten::_amp_foreach_non_finite_check_and_unscale_" in note
    assert "--list-fallbacks" in note and "GradScaler's" in note
    # the way it names: with the fallback on, the step runs and the cell passes
    assert _report(ip, "--target tpu --list-fallbacks", SCALED_STEP).verdict == "PASS"

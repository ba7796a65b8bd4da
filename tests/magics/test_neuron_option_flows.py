"""%%neuron options as users combine them, on the default path (the target in its worker process).

Each test is a flow a user met with a realistic small model: a training step of an MLP under an
option that must not change what is compared, or a sequence of cells where one option's effect
must hold (or not) for the next.
"""

import pytest
from backward_bug_cells import GRAD_CLIP
from IPython.core.error import UsageError

from neuron_workbench.testing import run_cell

MLP_SETUP = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))

torch.manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(8, 16)
y = torch.randint(0, 4, (8,))
"""

MLP_STEP = """
device = torch.device("cuda")
model.to(device)
loss = F.cross_entropy(model(x.to(device)), y.to(device))
loss.backward()
opt.step()
opt.zero_grad()
"""


def _outputs(report):
    return [output["path"] for output in report.to_dict()["outputs"]]


@pytest.mark.parametrize("flags", ["", "--profile", "--target neuron,tpu --profile"])
def test_a_profiled_training_step_compares_the_trained_weights(ip, flags):
    # A foreach optimizer step (the cpu reference's default, as on CUDA) under the op profiler's
    # dispatch mode bumped no version counter: the weights it changed were no outputs, so a
    # profiled cell compared the optimizer's state and not the model it trained.
    run_cell(ip, MLP_SETUP)
    run_cell(ip, f"%%neuron {flags} -o r\n{MLP_STEP}")
    reports = ip.user_ns["r"]
    for report in reports if isinstance(reports, list) else [reports]:
        assert "model.fc1.weight" in _outputs(report), report.summary()
        assert "model.fc2.bias" in _outputs(report), report.summary()


@pytest.mark.parametrize("seed", [3, 5])
def test_judge_budget_judges_an_item_as_the_tensor_it_came_from(ip, seed):
    # `v = s.item()` had its own R against the float64 oracle, counted from float64's ulp instead
    # of float32's: the target 4x "less accurate" at v (a FAIL) where s, the same number as a
    # tensor, was as accurate as the reference (R 1.0).
    run_cell(ip, "import torch")
    run_cell(
        ip,
        f"%%neuron --judge budget --seed {seed} -o r\n"
        'x = torch.randn(4000, device="cuda") * 1000\n'
        'if x.device.type == "cpu":\n'
        "    s = x.sum()\n"
        "else:\n"
        "    s = x.flip(0).cumsum(0)[-1]\n"
        "v = s.item()\n",
    )
    report = ip.user_ns["r"]
    assert report.budget.get("v").ratio == report.budget.get("s").ratio
    assert report.verdict == "PASS", report.summary()


def test_a_float64_loss_that_parts_on_neuron_has_a_finite_error_ratio(ip):
    # A float64 loss the reference computed exactly as the float64 oracle did read "R inf" in the
    # verdict line: the observed scalar's floor was the oracle's rounding to float64 (zero), not
    # one ulp, as every output's floor is.
    run_cell(ip, "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F")
    run_cell(
        ip,
        "%%neuron -o r\n"
        'dev = torch.device("cuda")\n'
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dev).double()\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
        "xs = torch.randn(64, 16, device=dev).double() * 100\n"
        "ys = torch.randint(0, 4, (64,), device=dev)\n"
        "for step in range(2):\n"
        "    loss = F.cross_entropy(model(xs), ys)\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    print(loss.item())\n",
    )
    report = ip.user_ns["r"]
    first = report.scalars.first
    assert first is not None and first.ratio is not None, report.summary()
    assert first.ratio != float("inf") and first.ratio > 2, report.summary()
    assert "R inf" not in report.summary()
    # ... and the two values shown differ (they part in the eighth digit: "15.49 vs 15.49")
    shown = first.headline().split(": ", 1)[1].split(" vs ")
    assert shown[0] != shown[1], first.headline()


SGD_SETUP = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16)
"""

SGD_STEP = """
device = torch.device("cuda")
model.to(device)
loss = model(x.to(device)).square().mean()
loss.backward()
opt.step()
opt.zero_grad()
loss.item()
"""


def test_an_sgd_step_against_its_recording_compares_the_trained_weights(ip, tmp_path):
    # The emulated device's foreach SGD step changed the weights without bumping their version
    # counters, so the target's run did not list them as changed. Live, the reference's outputs
    # stood in; against a recording (whose outputs are leaves, model.weight) the cell FAILed:
    # "model.weight missing on the target".
    recording = tmp_path / "step.nwrun.zip"
    run_cell(ip, SGD_SETUP)
    run_cell(ip, f"%%neuron --record {recording} -o r\n{SGD_STEP}")
    assert ip.user_ns["r"].verdict == "PASS", ip.user_ns["r"].summary()
    run_cell(ip, SGD_SETUP)  # the notebook as it was when the recording was made
    run_cell(ip, f"%%neuron --against {recording} -o r\n{SGD_STEP}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert "model.weight" in _outputs(report)


def test_judge_budget_judges_a_printed_loss_by_its_error_ratio(ip):
    # A sum with heavy cancellation, in another order on the target: both runs are as far from
    # the float64 oracle (every output within budget), but the value printed with .item() parts
    # by float32's tolerance. The verdict was FAIL, its own line saying "(R 0.327, as accurate as
    # the reference)".
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron --judge budget --seed 0 -o r\n"
        'a = torch.randn(4000, device="cuda") * 1e4\n'
        'x = torch.cat([a, -a.flip(0)]) + torch.randn(8000, device="cuda")\n'
        'if x.device.type == "cpu":\n'
        "    s = x.sum()\n"
        "else:\n"
        "    s = x.flip(0).cumsum(0)[-1]\n"
        'print(f"sum {s.item():.4f}")\n',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    (site,) = report.scalars.sites
    assert site.within_budget == 1 and site.parts_at is None
    assert "1 value within precision budget" in report.scalars.summary()


def test_what_if_applies_to_the_neuron_target_of_several(ip):
    # --what-if bf16-matmul with --target neuron,tpu stopped the cell, after the reference had
    # run, with the emulator's API error: "bf16_matmul is the neuron what-if policy; on tpu use
    # matmul_precision" (neither is an option of the cell). It is neuron's policy, as
    # --list-fallbacks is tpu's: it applies to the neuron target, and a tpu-only cell is refused
    # before anything runs.
    run_cell(ip, MLP_SETUP)
    run_cell(ip, f"%%neuron --what-if bf16-matmul --target neuron,tpu -o r\n{MLP_STEP}")
    neuron, tpu = ip.user_ns["r"]
    assert [neuron.options.get("what_if"), tpu.options.get("what_if")] == ["bf16-matmul", None]
    assert neuron.verdict == tpu.verdict == "FAIL"  # both round float32 matmul inputs to bf16
    with pytest.raises(UsageError, match="^--what-if bf16-matmul applies to a neuron target"):
        ip.run_cell_magic("neuron", "--what-if bf16-matmul --target tpu", MLP_STEP)


@pytest.mark.parametrize("name", ["1abc", "r.x", "class"])
def test_o_names_a_variable_or_the_cell_is_refused_before_it_runs(ip, name):
    # `-o 1abc` ran both runs and stored the report under a key no code can read
    run_cell(ip, "import torch\nx = torch.ones(2)")
    with pytest.raises(UsageError, match="^-o NAME must be a Python variable name"):
        ip.run_cell_magic("neuron", f"-o {name}", "y = x.cuda() + 1")
    assert name not in ip.user_ns and "y" not in ip.user_ns


def test_o_takes_a_quoted_name(ip):
    run_cell(ip, "import torch\nx = torch.ones(2)")
    run_cell(ip, '%%neuron -o "rep"\ny = x.cuda() + 1')
    assert ip.user_ns["rep"].verdict == "PASS"


def test_layers_full_keeps_a_quoted_glob_and_warns_of_a_name_no_module_has(ip):
    # `--layers-full "fc*"` kept its quotes (IPython's split of the line), so it matched nothing,
    # and a name no module has (`model.fc1`: names are the model's own) kept nothing, silently.
    run_cell(ip, MLP_SETUP)
    run_cell(ip, f'%%neuron -o r --layers-full "fc*" --layers-full model.fc1\n{MLP_STEP}')
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    kept = sorted(diff.path for diff in report.layers.full_diffs)
    assert kept == ["<fc1 output>", "<fc2 output>"]
    assert all(diff.status == "match" for diff in report.layers.full_diffs)
    assert report.warnings == [
        "--layers-full 'model.fc1' matched no module call (this run's modules: 'fc1', 'fc2', 'MLP')"
    ]
    assert "matched no module call" in report._repr_html_()


@pytest.mark.parametrize("targets", ["neuron,tpu", "tpu,neuron"])
def test_a_cell_one_of_two_targets_raises_in_leaves_the_namespace_as_it_was(ip, targets):
    # With tpu second, the reference's results were committed (the trained weights, `w`, the
    # cell's value) although the tpu report was an ERROR; with tpu first they were not.
    run_cell(ip, MLP_SETUP)
    before = ip.user_ns["model"].fc1.weight.clone()
    result = run_cell(
        ip,
        f"%%neuron --target {targets} -o r\n{MLP_STEP}"
        "w = x.cuda() * 2\n"
        'if w.device.type == "tpu":\n'
        '    raise ValueError("not on this device")\n'
        "w\n",
    )
    verdicts = {report.target.backend.name: report.verdict for report in ip.user_ns["r"]}
    assert verdicts == {"neuron": "PASS", "tpu": "ERROR"}
    assert "w" not in ip.user_ns and "loss" not in ip.user_ns
    assert result.result is None
    assert ip.user_ns["model"].fc1.weight.equal(before)


def test_o_naming_a_variable_the_cell_binds_is_refused_before_it_runs(ip):
    # `-o x` over a cell binding x replaced the cell's tensor with the report, silently
    run_cell(ip, "import torch\nx = torch.ones(2)")
    with pytest.raises(UsageError, match="^-o x names a variable the cell binds"):
        ip.run_cell_magic("neuron", "-o x", "x = torch.ones(2, device='cuda') * 3\ny = x + 1")
    assert ip.user_ns["x"].tolist() == [1.0, 1.0] and "y" not in ip.user_ns


BACKWARD_BUG_SETUP = (
    "import torch\nimport torch.nn as nn\n"
    + GRAD_CLIP
    + """
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), GradClip(), nn.Linear(8, 1))
x = torch.randn(4, 8)
"""
)

BACKWARD_BUG_STEP = """
net = net.cuda()
net(x.cuda()).sum().backward()
"""


def test_layers_against_a_recording_names_where_backward_diverged(ip, tmp_path):
    # The recording kept each module call's statistics but not the gradient summaries nor which
    # call produced each input: live the report named `2 (backward)`, against the recording of the
    # same cell it named no module at all.
    recording = tmp_path / "backward.nwrun.zip"
    run_cell(ip, BACKWARD_BUG_SETUP)
    run_cell(ip, f"%%neuron --layers --record {recording} -o r\n{BACKWARD_BUG_STEP}")
    live = ip.user_ns["r"]
    assert live.layers.first_backward.module == "2", live.summary()
    run_cell(ip, BACKWARD_BUG_SETUP)
    run_cell(ip, f"%%neuron --layers --against {recording} -o r\n{BACKWARD_BUG_STEP}")
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL"
    assert report.summary().endswith("first divergence at 2 (backward)"), report.summary()
    backward = report.to_dict()["layers"]["first_backward_divergence"]
    assert backward is not None and backward["module"] == "2"


def test_steps_keeps_the_loss_curve_of_a_model_output_holding_the_loss(ip):
    # `out = model(batch, labels=batch); out.loss.backward()` binds no loss of its own: under
    # --steps 3 the report's per-step series (its loss curves) were empty.
    pytest.importorskip("transformers")
    run_cell(
        ip,
        "import torch\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "torch.manual_seed(0)\n"
        "model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50,\n"
        "                                   n_positions=16))\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "ids = torch.randint(0, 50, (2, 8))\n",
    )
    run_cell(
        ip,
        "%%neuron --steps 3 -o r\n"
        'device = torch.device("cuda")\n'
        "model.to(device)\n"
        "out = model(ids.to(device), labels=ids.to(device))\n"
        "out.loss.backward()\n"
        "opt.step()\n"
        "opt.zero_grad()\n",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    curve = report.to_dict()["training"]["series"]["out.loss"]
    assert len(curve["ref"]) == len(curve["target"]) == 3
    assert curve["ref"][-1] == pytest.approx(float(ip.user_ns["out"].loss))
    assert curve["ref"][0] > curve["ref"][-1]  # three steps, each one's loss

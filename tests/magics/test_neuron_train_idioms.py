"""Training-loop idioms written for CUDA, through %%neuron on the default path (a worker target).

Each test is a bug a user met with a training step cell run again and again: what the step changed
must be compared, whatever kernel changed it.
"""

import os

import pytest
import torch

from neuron_workbench.testing import run_cell

#: A model on the device and an optimizer over it, built in a %%neuron cell as a notebook does.
FUSED_SETUP = """%%neuron -o setup
device = torch.device("cuda")
model = nn.Linear(16, 8).to(device)
opt = {optimizer}
X = torch.randn(32, 16, device=device)
"""

#: The step cell: backward, step, zero_grad(set_to_none=True) last, so the gradients are None
#: before and after the cell, as in most training loops.
STEP = """%%neuron -o r
for i in range(2):
    model(X).tanh().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def _compared(report):
    return {d.path for d in report.comparison.compared}


@pytest.mark.parametrize(
    "optimizer, state",
    [
        ("torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)", "exp_avg"),
        (
            "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)",
            "momentum_buffer",
        ),
    ],
)
def test_a_fused_optimizer_step_is_compared(ip, optimizer, state):
    # `fused=True` (nanoGPT's choice on CUDA) updates the weights with one kernel that leaves the
    # tensors' version counters alone: the weights and the optimizer state looked unchanged, so a
    # step cell compared only its loop variable (PASS, 1 output) whatever the target computed.
    run_cell(ip, "import torch\nimport torch.nn as nn\ntorch.manual_seed(0)")
    run_cell(ip, FUSED_SETUP.format(optimizer=optimizer))
    run_cell(ip, STEP)  # the optimizer's state is made here: it was compared already
    run_cell(ip, STEP)
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    compared = _compared(report)
    assert {"model.weight", "model.bias"} <= compared, compared
    assert f"opt.state[0]['{state}']" in compared, compared


def test_a_fused_step_that_differs_fails(ip):
    # float64 is computed as float32 on neuron: the weights a fused AdamW trains differ, and the
    # report says so where it said PASS for the loop variable alone.
    run_cell(ip, "import torch\nimport torch.nn as nn\ntorch.manual_seed(0)")
    run_cell(
        ip,
        "%%neuron -o setup\n"
        'device = torch.device("cuda")\n'
        "model = nn.Linear(64, 64).to(device).double()\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)\n"
        "X = torch.randn(32, 64, device=device, dtype=torch.float64)",
    )
    run_cell(ip, STEP.replace("range(2)", "range(3)"))
    report = ip.user_ns["r"]
    assert "model.weight" in _compared(report), report.summary()
    assert report.verdict == "FAIL", report.summary()
    failed = {d.path: d for d in report.comparison.failures}
    assert "model.weight" in failed, report.summary()
    assert any("float64" in hint for hint in failed["model.weight"].hints)


def test_a_graph_that_saved_weights_before_a_fused_step_runs_its_backward_after_it(ip):
    # A GAN's generator loss goes back through the discriminator its fused step just changed: the
    # fused kernel bumps no version on a GPU (nor on the CPU), so the backward pass runs there;
    # the workbench's dispatch modes and the emulated device bumped them, and both runs raised
    # "modified by an inplace operation" (ERROR) where the plain notebook runs the cell.
    run_cell(ip, "import torch\nimport torch.nn as nn\ntorch.manual_seed(0)")
    run_cell(
        ip,
        "%%neuron -o setup\n"
        'device = torch.device("cuda")\n'
        "model = nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4)).to(device)\n"
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)\n"
        "X = torch.randn(32, 16, device=device)",
    )
    run_cell(
        ip,
        "%%neuron -o r\n"
        "out = model(X).tanh().sum()\n"
        "out.backward(retain_graph=True)\n"
        "opt.step()\n"
        "out.backward()",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"model.0.weight", "model.1.weight"} <= _compared(report), report.summary()


#: A hand-written EMA of a model's weights and WGAN's weight clipping, through ``.data``.
THROUGH_DATA = {
    "ema": (
        "with torch.no_grad():\n"
        "    for p_ema, p in zip(ema.parameters(), model.parameters()):\n"
        "        p_ema.data.mul_(0.9).add_(p.data, alpha=0.1)\n"
        "del p_ema, p"
    ),
    "clip": "for p in ema.parameters():\n    p.data.clamp_(-0.01, 0.01)\ndel p",
    "assign": "ema.bias.data = ema.bias.data * 2",
}


@pytest.mark.parametrize("idiom", sorted(THROUGH_DATA))
def test_a_change_through_data_is_compared(ip, idiom):
    # `p.data` is an alias with a version counter of its own: writing through it left `p`'s
    # counter as it was, so the EMA model looked unchanged (UNCOMPARED, 0 outputs compared).
    run_cell(ip, "import torch\nimport torch.nn as nn\ntorch.manual_seed(0)")
    run_cell(
        ip,
        "%%neuron -o setup\n"
        'device = torch.device("cuda")\n'
        "model = nn.Linear(16, 8).to(device)\n"
        "ema = nn.Linear(16, 8).to(device)",
    )
    before = ip.user_ns["ema"].bias.detach().clone()
    run_cell(ip, f"%%neuron -o r\n{THROUGH_DATA[idiom]}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"ema.weight", "ema.bias"} <= _compared(report), report.summary()
    assert not torch.equal(ip.user_ns["ema"].bias, before)  # the kept run's change is kept


def test_reading_through_data_changes_nothing(ip):
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(ip, '%%neuron -o setup\nmodel = nn.Linear(16, 8).to("cuda")')
    run_cell(ip, "%%neuron -o r\nnorms = [p.data.norm() for p in model.parameters()]")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert _compared(report) == {"norms[0]", "norms[1]"}


def test_a_model_converted_to_another_dtype_is_compared_and_a_move_is_not(ip):
    # model.half() swaps each parameter's data, which bumps no version counter: a cell converting
    # the model read UNCOMPARED, though each run had rounded the weights its own way
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(ip, '%%neuron -o setup\nmodel = nn.Linear(16, 8).to("cuda")')
    run_cell(ip, "%%neuron -o r\nmodel.cuda()\nmoved = True")
    assert _compared(ip.user_ns["r"]) == {"moved"}  # on the device already: no change
    run_cell(ip, "%%neuron -o r\nmodel.half()\nconverted = True")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert _compared(report) == {"model.weight", "model.bias", "converted"}, report.summary()
    assert ip.user_ns["model"].weight.dtype == torch.float16


@pytest.mark.parametrize("keep", ["ref", "target"])
def test_a_scaled_accumulation_stepped_in_the_next_cell(ip, keep):
    # Gradient accumulation split over cells: the micro-batch cell scales and runs backward, the
    # next cell steps. GradScaler's own copies drop the scale it made, so both runs stopped at
    # `step` ("Attempted step but _scale is None ... did not use scaler.scale(loss)"), where the
    # plain notebook steps.
    run_cell(ip, "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F")
    run_cell(
        ip,
        "%%neuron -o setup\n"
        "torch.manual_seed(0)\n"
        "model = nn.Linear(16, 4).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        'scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)\n'
        "X = torch.randn(32, 16).cuda()\n"
        "Y = torch.randint(0, 4, (32,)).cuda()",
    )
    run_cell(
        ip,
        f"%%neuron -o micro --keep {keep}\n"
        "for k in range(2):\n"
        '    with torch.autocast("cuda", dtype=torch.float16):\n'
        "        loss = F.cross_entropy(model(X[k * 16:(k + 1) * 16]), Y[k * 16:(k + 1) * 16]) / 2\n"
        "    scaler.scale(loss).backward()",
    )
    assert ip.user_ns["micro"].verdict == "PASS", ip.user_ns["micro"].summary()
    grad = ip.user_ns["model"].weight.grad.clone()
    weight = ip.user_ns["model"].weight.detach().clone()
    run_cell(ip, "%%neuron -o r\nscaler.step(opt)\nscaler.update()\nopt.zero_grad()")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert "model.weight" in _compared(report)
    # the step unscaled the accumulated gradients by the scale the first cell made
    expected = weight - 0.1 * grad / 1024.0
    torch.testing.assert_close(ip.user_ns["model"].weight.detach(), expected)
    assert ip.user_ns["scaler"].get_scale() == 1024.0


def test_a_scaler_that_never_scaled_still_says_so(ip):
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(
        ip,
        "%%neuron -o setup\n"
        "model = nn.Linear(4, 2).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        'scaler = torch.amp.GradScaler("cuda")',
    )
    run_cell(ip, "%%neuron -o r\nmodel(torch.ones(1, 4).cuda()).sum().backward()\nscaler.step(opt)")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR", report.summary()
    assert "did not use scaler.scale" in report.summary()


@pytest.mark.parametrize("optimizer", ["AdamW", "RMSprop", "NAdam"])
def test_a_capturable_optimizer_steps_on_the_cpu_reference(ip, optimizer):
    # `capturable=True` (CUDA graphs' requirement, TorchTPU's advice for compiled steps) steps
    # CUDA tensors; the cpu reference standing in for cuda raised "If capturable=True, params and
    # state_steps must be on supported devices" where a GPU and the target step.
    run_cell(ip, "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "torch.manual_seed(0)\n"
        "model = nn.Linear(8, 2).cuda()\n"
        f"opt = torch.optim.{optimizer}(model.parameters(), lr=1e-2, capturable=True)\n"
        "X = torch.randn(16, 8).cuda()\n"
        "Y = torch.randint(0, 2, (16,)).cuda()\n"
        "for _ in range(2):\n"
        "    F.cross_entropy(model(X), Y).backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert "opt.state[0]['step']" in _compared(report)


@pytest.mark.parametrize(
    "map_location, on_cuda",
    [
        ("lambda storage, loc: storage.cuda(0)", True),
        ("lambda storage, loc: storage.cuda()", True),
        ("lambda storage, loc: storage", False),
    ],
)
def test_a_checkpoint_mapped_by_a_function_resumes_as_on_a_gpu(ip, tmp_path, map_location, on_cuda):
    # Older scripts resume with map_location=lambda storage, loc: storage.cuda(0). On a GPU (and on
    # the target) the loaded state is on the device, so the optimizer keeps the checkpoint's own
    # tensors and training changes `ck`; the cpu reference copied them, leaving `ck` as loaded:
    # FAIL at ck['opt']['state'][0]['exp_avg'], cause not identified.
    run_cell(
        ip,
        f"import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\npath = {str(tmp_path / 'ck.pt')!r}",
    )
    run_cell(
        ip,
        "%%neuron -o setup\n"
        "torch.manual_seed(0)\n"
        "model = nn.Linear(8, 2).cuda()\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-2)\n"
        "X = torch.randn(16, 8).cuda()\n"
        "Y = torch.randint(0, 2, (16,)).cuda()\n"
        "F.cross_entropy(model(X), Y).backward()\n"
        "opt.step()\n"
        'torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)',
    )
    run_cell(
        ip,
        "%%neuron -o r\n"
        f"ck = torch.load(path, map_location={map_location})\n"
        "m2 = nn.Linear(8, 2).cuda()\n"
        'm2.load_state_dict(ck["model"])\n'
        "o2 = torch.optim.Adam(m2.parameters(), lr=1e-2)\n"
        'o2.load_state_dict(ck["opt"])\n'
        "F.cross_entropy(m2(X), Y).backward()\n"
        "o2.step()",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    loaded = ip.user_ns["ck"]["opt"]["state"][0]["exp_avg"]
    trained = ip.user_ns["o2"].state[ip.user_ns["m2"].weight]["exp_avg"]
    assert (loaded is trained) == on_cuda


def test_a_tensor_learning_rate_a_scheduler_fills_is_compared(ip):
    # A capturable optimizer's learning rate may be a tensor, which an LR scheduler fills in
    # place: the schedule was neither seen as changed nor compared (floats only).
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(
        ip,
        "%%neuron -o setup\n"
        "model = nn.Linear(8, 2).cuda()\n"
        "opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), capturable=True)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)",
    )
    run_cell(ip, "%%neuron -o r\nsched.step()")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert "opt.param_groups[0]['lr']" in _compared(report), report.summary()
    assert float(ip.user_ns["opt"].param_groups[0]["lr"]) == pytest.approx(0.005)


NET = """
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x)
"""


def test_a_whole_model_saved_with_torch_save_loads_on_the_target(ip, tmp_path):
    # `torch.save(model, path)` then `torch.load(path, weights_only=False)`: pickle finds the
    # notebook's class on __main__ by name, and the worker's __main__ held only the names the
    # cell reads: "neuron raised AttributeError: Can't get attribute 'Net' on <module '__main__'>".
    run_cell(ip, NET + f"path = {str(tmp_path / 'full.pt')!r}")
    run_cell(ip, "%%neuron -o saved\nmodel = Net().cuda()\ntorch.save(model, path)")
    run_cell(
        ip,
        "%%neuron -o r\n"
        'm = torch.load(path, weights_only=False, map_location="cuda")\n'
        'y = m(torch.ones(1, 8, device="cuda"))',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"y", "m.fc.weight"} <= _compared(report)
    assert type(ip.user_ns["m"]) is ip.user_ns["Net"]


@pytest.mark.parametrize(
    "make_ema",
    [
        "ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))",
        "ema = torch.optim.swa_utils.AveragedModel(model)",
    ],
)
def test_an_averaged_model_made_in_a_plain_cell_is_on_the_device(ip, make_ema):
    # AveragedModel(model) deep-copies a model the notebook has on cuda: on a GPU the EMA model is
    # there too. The target's run found it on the CPU and refused it next to the device's tensors
    # ("Expected all tensors to be on the same device ... neuron:0 and cpu").
    run_cell(
        ip,
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        "from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn",
    )
    run_cell(
        ip,
        "%%neuron -o setup\n"
        'device = torch.device("cuda")\n'
        "model = nn.Linear(8, 2).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "X = torch.randn(16, 8, device=device)\n"
        "Y = torch.randint(0, 2, (16,), device=device)",
    )
    run_cell(ip, make_ema)
    run_cell(
        ip,
        "%%neuron -o r\n"
        "F.cross_entropy(model(X), Y).backward()\n"
        "opt.step()\n"
        "opt.zero_grad()\n"
        "ema.update_parameters(model)\n"
        "val = F.cross_entropy(ema(X), Y)",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"val", "ema.module.weight"} <= _compared(report)


def test_a_checkpoint_in_a_temporary_folder_the_cell_made_passes(ip):
    # Checkpoints saved to a TemporaryDirectory the cell makes: each run drew its own random
    # folder name, so the path the cell kept differed between the runs, and the cell failed
    # ("ckpt '/tmp/tmpj2bgmeim/model.pt' != '/tmp/tmpn9wiz7kx/model.pt'", cause not identified)
    # where the same code ran on both sides.
    run_cell(ip, "import os, tempfile\nimport torch\nimport torch.nn as nn")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "model = nn.Linear(4, 2).cuda()\n"
        "tmp = tempfile.TemporaryDirectory()\n"
        'ckpt = os.path.join(tmp.name, "model.pt")\n'
        "torch.save(model.state_dict(), ckpt)\n"
        'paths = {"best": ckpt, "folder": tmp.name, "other": tempfile.mkdtemp(prefix="run-")}',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"ckpt", "paths['best']", "paths['other']"} <= _compared(report), report.summary()
    run_cell(
        ip,
        "%%neuron -o r\n"
        "m2 = nn.Linear(4, 2).cuda()\n"
        'm2.load_state_dict(torch.load(ckpt, map_location="cuda"))\n'
        "files = os.listdir(tmp.name)",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert ip.user_ns["files"] == ["model.pt"]


def test_paths_of_temporary_folders_paired_otherwise_still_differ(ip):
    # The names each run drew must pair one to one: a path the reference built on its first
    # folder and the target on its second is no longer the same code's.
    run_cell(ip, "import tempfile\nimport torch")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "a, b = tempfile.mkdtemp(), tempfile.mkdtemp()\n"
        'x = torch.ones(1, device="cuda")\n'
        'pick = a if x.device.type == "cpu" else b\n'
        "both = (a, b)",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    assert {d.path for d in report.comparison.failures} == {"pick"}, report.summary()


#: A step split after unscale_: the scaler's own pickling refuses it (README's known limits).
UNSCALED = (
    "%%neuron -o unscaled{flags}\n"
    'scaler.scale(model(torch.ones(1, 4, device="cuda")).sum()).backward()\n'
    "scaler.unscale_(opt)"
)
SCALER_SETUP = (
    "%%neuron -o setup\n"
    "model = nn.Linear(4, 1, bias=False).cuda()\n"
    "with torch.no_grad():\n"
    "    model.weight.fill_(1.0)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=1.0)\n"
    'scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)'
)


def test_a_step_split_after_unscale_says_to_keep_them_together(ip):
    # The line told the user to run the cell with --executor inprocess, where the scaler, which
    # cannot be copied, was shared by both runs: the second unscaled the gradients again.
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(ip, SCALER_SETUP)
    run_cell(ip, UNSCALED.format(flags=""))
    result = run_cell(ip, "%%neuron -o r\nscaler.step(opt)\nscaler.update()", allow_error=True)
    message = str(result.error_in_exec)
    assert "between unscale_ and step" in message
    assert "in one %%neuron cell" in message
    assert "--executor inprocess" not in message


@pytest.mark.inprocess_device
def test_a_step_split_after_unscale_is_no_pass_in_process(ip):
    # In process, the scaler that cannot be copied was shared by the two runs: the second run's
    # step unscaled the already unscaled gradients again, and the cell passed (weight 0.999
    # where the plain notebook's step gives 0).
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(ip, SCALER_SETUP)
    run_cell(ip, UNSCALED.format(flags=" --executor inprocess"))
    run_cell(ip, "%%neuron -o r --executor inprocess\nscaler.step(opt)\nscaler.update()")
    report = ip.user_ns["r"]
    assert report.verdict == "ERROR", report.summary()
    assert "between unscale_ and step" in report.summary()
    torch.testing.assert_close(ip.user_ns["model"].weight.detach(), torch.ones(1, 4))


def test_autocast_on_the_tpus_own_device_type_defaults_to_bfloat16(ip):
    # `torch.autocast(device_type=x.device.type)` with no dtype takes the device's default, which
    # TorchTPU's device module makes bfloat16 (shared/notes/updates-2026-12.md). The emulated tpu
    # kept PyTorch's float16 for PrivateUse1, and its report's numerics said "autocast_default:
    # float16": the target computed what no TPU computes.
    run_cell(ip, "import torch\nimport torch.nn as nn")
    run_cell(
        ip,
        "%%neuron --target tpu -o r\n"
        'device = torch.device("cuda")\n'
        "model = nn.Linear(16, 4).to(device)\n"
        "X = torch.randn(8, 16, device=device)\n"
        "with torch.autocast(device_type=X.device.type):\n"
        "    h = model(X)",
    )
    target = ip.user_ns["r"].target
    assert target.error is None, ip.user_ns["r"].summary()
    assert target.outputs["h"].dtype == torch.bfloat16
    assert target.backend.details["numerics"]["autocast_default"] == "bfloat16"
    # the cell's own torch.autocast("cuda") is still CUDA's float16 on the target
    run_cell(
        ip,
        '%%neuron --target tpu -o r\nwith torch.autocast("cuda"):\n    h = model(X)',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert report.target.outputs["h"].dtype == torch.float16


def test_a_draw_inside_fork_rng_leaves_the_cuda_stream_as_it_was(ip):
    # `torch.random.fork_rng()` (a validation pass that must not move the training's random
    # stream) forks the module of "cuda": on the cpu reference the cell's cuda device is a cpu
    # one, whose module (torch.cpu) has no get_rng_state, and the reference alone raised
    # AttributeError (ERROR) where a GPU forks torch.cuda's state.
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "torch.manual_seed(0)\n"
        "with torch.random.fork_rng(devices=[0]):\n"
        '    forked = torch.rand(3, device="cuda")\n'
        "with torch.random.fork_rng():\n"
        '    again = torch.rand(3, device="cuda")\n'
        'after = torch.rand(3, device="cuda")',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"forked", "again", "after"} <= _compared(report)
    assert torch.equal(ip.user_ns["forked"], ip.user_ns["after"])
    assert torch.equal(ip.user_ns["again"], ip.user_ns["after"])


def test_the_cuda_random_state_saved_and_restored_through_torch_cuda_random_draws_again(ip):
    # transformers' Trainer saves `torch.cuda.random.get_rng_state()` with each checkpoint and
    # restores it on resume: the submodule was the real one, which asks for a CUDA build, and both
    # runs raised "Torch not compiled with CUDA enabled" (ERROR); its `_all` forms saved an empty
    # list, so restoring drew other numbers than a GPU draws.
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "torch.manual_seed(0)\n"
        'rng = {"cpu": torch.random.get_rng_state(), "cuda": torch.cuda.random.get_rng_state()}\n'
        'first = torch.rand(3, device="cuda")\n'
        'torch.cuda.random.set_rng_state(rng["cuda"])\n'
        'again = torch.rand(3, device="cuda")\n'
        "states = torch.cuda.random.get_rng_state_all()\n"
        'drawn = torch.rand(3, device="cuda")\n'
        "torch.cuda.set_rng_state_all(states)\n"
        'redrawn = torch.rand(3, device="cuda")',
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"first", "again", "drawn", "redrawn"} <= _compared(report)
    assert torch.equal(ip.user_ns["first"], ip.user_ns["again"])
    assert torch.equal(ip.user_ns["drawn"], ip.user_ns["redrawn"])
    assert not torch.equal(ip.user_ns["first"], ip.user_ns["drawn"])


def test_a_profiled_training_loop_leaves_one_trace_the_kept_runs(ip, tmp_path):
    # `tensorboard_trace_handler(folder)` has Kineto write each trace in C++, below Python's open:
    # the target's worker wrote its trace into the notebook's folder too, and TensorBoard showed
    # two runs of a loop a GPU profiles once.
    run_cell(ip, f"import os\nimport torch\nimport torch.nn as nn\nlogdir = {str(tmp_path)!r}")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "model = nn.Linear(8, 2).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "with torch.profiler.profile(\n"
        "    schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),\n"
        "    on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir),\n"
        ") as prof:\n"
        "    for step in range(2):\n"
        '        model(torch.ones(4, 8, device="cuda")).sum().backward()\n'
        "        opt.step()\n"
        "        prof.step()\n"
        "traces = len(os.listdir(logdir))",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert "traces" in _compared(report)
    assert ip.user_ns["traces"] == 1
    (trace,) = os.listdir(tmp_path)
    assert f"_{os.getpid()}." in trace  # the reference's, run in the kernel's process


def test_seeding_the_cuda_default_generator_draws_as_torch_cuda_manual_seed_does(ip):
    # Lightning's and older repos' seeding reach `torch.cuda.default_generators[0]`, the one
    # generator of a one-GPU machine, the one `torch.cuda.manual_seed` seeds: the tuple was the
    # real module's, empty without a CUDA build, and both runs raised IndexError (ERROR).
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "torch.cuda.default_generators[0].manual_seed(1)\n"
        'x = torch.rand(3, device="cuda")\n'
        "torch.cuda.manual_seed(1)\n"
        'y = torch.rand(3, device="cuda")\n'
        "count = len(torch.cuda.default_generators)",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"x", "y"} <= _compared(report)
    assert torch.equal(ip.user_ns["x"], ip.user_ns["y"])
    assert ip.user_ns["count"] == 1

"""%%neuron's numerics options end to end: layers, training parity, what-if, rng, tolerances."""

import pytest
from backward_bug_cells import GRAD_CLIP

from neuron_workbench.testing import run_cell

MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class Float64Sensitive(nn.Module):
    def forward(self, x):
        return ((x.double() + 1e8) - 1e8).float()

def deep_model(k):
    layers = [Float64Sensitive() if i == k else (nn.Linear(8, 8) if i % 2 == 0 else nn.Tanh())
              for i in range(20)]
    return nn.Sequential(*layers)

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))
"""

TRAIN_SETUP = """
torch.manual_seed(0)
model = SmallCNN()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
images = torch.randn(8, 3, 8, 8)
labels = torch.randint(0, 10, (8,))
"""

TRAIN_STEP = """
model.to("cuda")
optimizer.zero_grad()
loss = F.cross_entropy(model(images.cuda()), labels.cuda())
loss.backward()
optimizer.step()
"""


def test_layers_name_the_module_where_the_difference_is_born(ip):
    run_cell(ip, MODEL)
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --layers -o r\n"
        "torch.manual_seed(0)\nnet = deep_model(7).cuda()\nout = net(torch.randn(4, 8, device='cuda') * 3)",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL"
    assert report.first_divergence.module == "7" and report.first_divergence.born
    assert report.summary().endswith("first divergence at 7")
    layers = report.to_dict()["layers"]["layers"]
    born = [d["module"] for d in layers if d["born"]]
    propagated = [d["module"] for d in layers if d["diverged"] and not d["born"]]
    assert born == ["7"]
    assert set(propagated) == {str(i) for i in range(8, 20)} | {"Sequential"}
    # `out` is float32, taken from the float64 values module 7 computed: the counted float64 ops
    # are the evidence for the float64 hint, though the output's dtype is not float64
    out = next(d for d in report.comparison.failures if d.path == "out")
    assert any("a float32 output taken from float64 values" in h for h in out.hints), out.hints


def test_float64_output_gets_the_neuron_float64_hint(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron -o r\nimport torch\n"
        "total = (torch.full((3,), 0.3, dtype=torch.float64, device='cuda') + 1e8) - 1e8",
    )
    diff = ip.user_ns["r"].comparison.failures[0]
    assert diff.path == "total"
    assert any(h.startswith("float64 is computed as float32 on neuron") for h in diff.hints)


def test_an_index_taken_from_float64_values_gets_the_float64_hint(ip):
    """argmax over float64 values that float32 rounds to a tie: small int64 indices, no wrap."""
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron -o r\nimport torch\n"
        "v = torch.tensor([1e8 + 1, 1e8 + 2, 1e8], dtype=torch.float64, device='cuda')\n"
        "m = v.argmax()",
    )
    diff = ip.user_ns["r"].comparison.failures[0]
    assert diff.path == "m" and diff.ref_dtype == "int64"
    assert any(
        h.startswith("float64 is computed as float32 on neuron") and "argmax" in h
        for h in diff.hints
    ), diff.hints
    assert diff.tight_atol is not None and diff.tight_atol > 0


#: An AMP training step as CUDA code writes it, with TF32 on for the float32 head: a GPU computes
#: the head in TF32, neuron in float32, so the step's outputs differ. GradScaler's unscale_ takes
#: the reciprocal of its scale in float64 (a float64 op on neuron), on values float32 holds.
AMP_STEP = """
import torch
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))
head = nn.Linear(10, 10)
opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)
x = torch.randn(32, 64)
"""

AMP_CELL = """
torch.backends.cuda.matmul.allow_tf32 = True
model, head = model.cuda(), head.cuda()
scaler = torch.amp.GradScaler("cuda")
for _ in range(3):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.{dtype}):
        h = model(x.cuda())
    loss = {loss}
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_grad_scaler_step_is_not_blamed_on_float64(ip, dtype):
    # GradScaler's float64 reciprocal of its power-of-two scale computes on neuron what it
    # computes on CUDA: every output the TF32 head made differ was tagged "float64 computed as
    # float32", though the cell's own tensors are float32 and float16/bfloat16.
    run_cell(ip, AMP_STEP)
    loss = "head(h.float()).pow(2).mean()"
    run_cell(
        ip, "%%neuron --ref cpu --target neuron -o r\n" + AMP_CELL.format(dtype=dtype, loss=loss)
    )
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    assert report.comparison.failures
    for diff in report.comparison.failures:
        assert diff.hints[0].startswith("TF32:"), diff.hints
        assert not any("float64" in h for h in diff.hints), (diff.path, diff.hints)
    assert "float64" not in report.summary()
    rule_ops = report.target.facts.rule_ops
    assert rule_ops["fp64"] >= 1 and rule_ops["fp64-rounded"] == 0  # the scaler's op did run


def test_a_grad_scaler_step_with_float64_math_keeps_the_float64_hint(ip):
    # The same step with a loss the cell computes in float64: float32 rounds its values on
    # neuron, and the outputs it feeds keep the hint.
    run_cell(ip, AMP_STEP)
    loss = "(head(h.float()).double() * 1.1).pow(2).mean().float()"
    cell = AMP_CELL.format(dtype="float16", loss=loss)
    run_cell(ip, "%%neuron --ref cpu --target neuron -o r\n" + cell)
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL", report.summary()
    assert report.comparison.failures
    for diff in report.comparison.failures:
        assert any(
            h.startswith("float64 is computed as float32 on neuron")
            and "float64 ops rounded a value float32 cannot hold in this run" in h
            for h in diff.hints
        ), (diff.path, diff.hints)
    assert report.target.facts.rule_ops["fp64-rounded"] >= 1


def test_training_parity_three_steps_fp32_passes(ip):
    run_cell(ip, MODEL)
    run_cell(ip, TRAIN_SETUP)
    run_cell(ip, f"%%neuron --ref cpu --target neuron --steps 3 -o r\n{TRAIN_STEP}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    training = report.to_dict()["training"]
    assert training["steps"] == 3 and training["series"]["loss"]["abs_diff"] == [0.0, 0.0, 0.0]
    losses = training["series"]["loss"]["ref"]
    assert losses[2] < losses[0]  # three real optimizer steps happened
    assert "model.fc.weight" in {d.path for d in report.comparison.diffs}


def test_training_parity_with_bf16_what_if_fails_at_the_first_conv_with_the_bf16_hint(ip):
    run_cell(ip, MODEL)
    run_cell(ip, TRAIN_SETUP)
    run_cell(
        ip,
        f"%%neuron --ref cpu --target neuron --steps 3 --layers --what-if bf16-matmul -o r\n{TRAIN_STEP}",
    )
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL"
    assert report.first_divergence.module == "conv1"
    assert report.summary().endswith("first divergence at conv1")
    hints = [h for d in report.comparison.failures for h in d.hints]
    assert any("bf16 what-if policy" in h for h in hints)
    series = report.to_dict()["training"]["series"]["loss"]["abs_diff"]
    assert series[0] > 0
    # the policy is switched off again after the run
    run_cell(ip, f"%%neuron --ref cpu --target neuron -o r2\n{TRAIN_STEP}")
    assert ip.user_ns["r2"].verdict == "PASS"


def test_per_output_tolerance_and_presets(ip):
    cell = (
        "import torch\nclose = torch.ones(3, device='cuda') * "
        "(1.0 if torch.zeros(1, device='cuda').device.type == 'cpu' else 1.0001)\nexact = torch.ones(2)"
    )
    run_cell(ip, f"%%neuron --ref cpu --target neuron -o r\n{cell}")
    assert ip.user_ns["r"].verdict == "FAIL"
    run_cell(ip, f"%%neuron --ref cpu --target neuron --tol close=1e-3,0 -o r\n{cell}")
    assert ip.user_ns["r"].verdict == "PASS"
    run_cell(ip, f"%%neuron --ref cpu --target neuron --preset fp32-accelerator -o r\n{cell}")
    assert ip.user_ns["r"].verdict == "PASS"
    assert ip.user_ns["r"].to_dict()["options"]["tolerance"]["preset"] == "fp32-accelerator"


def test_dropout_hint_only_when_the_masks_differed(ip):
    # The target adds 1e-3 on purpose: the masks are the same on both runs (same seed, and the
    # emulator draws with the CPU generator), so dropout is not the cause and no hint blames it.
    cell = (
        "import torch\nx = torch.ones(64, device='cuda')\n"
        "y = torch.nn.functional.dropout(x, 0.5, training=True) "
        "+ (0.0 if torch.zeros(1, device='cuda').device.type == 'cpu' else 1e-3)"
    )
    run_cell(ip, f"%%neuron --ref cpu --target neuron -o r\n{cell}")
    diff = ip.user_ns["r"].comparison.failures[0]
    assert not any("random numbers drawn" in h for h in diff.hints)
    # Masks drawn from differently seeded generators (each run seeds by where it runs): now they
    # differ, and the hint says so with the way out.
    cell = (
        "import torch\n"
        "torch.manual_seed(1 if torch.zeros(1, device='cuda').device.type == 'cpu' else 2)\n"
        "x = torch.ones(64, device='cuda')\n"
        "y = torch.nn.functional.dropout(x, 0.5, training=True)"
    )
    run_cell(ip, f"%%neuron --ref cpu --target neuron -o r\n{cell}")
    diff = ip.user_ns["r"].comparison.failures[0]
    assert any("differed between the runs" in h and "model.eval()" in h for h in diff.hints)
    run_cell(ip, f"%%neuron --ref cpu --target neuron --rng cpu -o r\n{cell}")
    assert ip.user_ns["r"].to_dict()["target"]["facts"]["rng_on_cpu"] is True


# A boolean attn_mask with dropout (HF BERT / GPT-2 in train mode with a padded attention_mask);
# the last query row is masked out entirely. TPU's float32 matmuls are 1-pass bfloat16 unless asked
# for full precision, which is not what this test is about.
MASKED_ATTENTION = """
torch.set_float32_matmul_precision("highest")
torch.manual_seed(0)
q, k, v = (torch.randn(2, 2, 5, 8, device="cuda", requires_grad=True) for _ in range(3))
m = torch.ones(2, 1, 5, 5, dtype=torch.bool, device="cuda")
m[..., 3:] = False
m[..., 4, :] = False
o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.5)
o.sum().backward()
gq, gk, gv = q.grad, k.grad, v.grad
"""


@pytest.mark.parametrize("target", ["neuron", "tpu"])
def test_attention_with_a_boolean_mask_and_dropout_passes(ip, target, fresh_tpu_worker):
    # The emulator handed the boolean mask to SDPA's math kernel as it was, which adds it to the
    # scores (0 or 1) where public SDPA adds 0 or -inf: o and every gradient differed.
    run_cell(ip, "import torch\nimport torch.nn.functional as F")
    run_cell(ip, f"%%neuron --ref cpu --target {target} -o r\n{MASKED_ATTENTION}")
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    assert {"o", "gq", "gk", "gv"} <= {d.path for d in report.comparison.diffs}


def test_migration_findings_are_attached(ip):
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron -o r\nimport torch\nt = torch.ones(2).cuda()\ntorch.cuda.synchronize()",
    )
    migration = ip.user_ns["r"].to_dict()["migration"]
    rules = {f["rule_id"] for f in migration["findings"]}
    assert {"NW102", "NW103"} <= rules


def test_autocast_on_a_tensors_device_type_names_the_dtypes_not_the_op_lists(ip):
    # torch.autocast(device_type=x.device.type) is CPU autocast on the cpu reference (bfloat16)
    # and float16 on neuron, as on a GPU: the FAIL was hinted "autocast op lists differ", which
    # sent the user to the lists; the runs' autocast dtypes differ, and the hint now says why.
    run_cell(ip, "import torch\ntorch.manual_seed(0)")
    run_cell(
        ip,
        "%%neuron -o r\n"
        'device = torch.device("cuda")\n'
        "layer = torch.nn.Linear(16, 4).to(device)\n"
        "with torch.autocast(device_type=device.type):\n"
        "    h = layer(torch.randn(8, 16, device=device))\n",
    )
    report = ip.user_ns["r"]
    [diff] = report.comparison.failures
    assert (diff.path, diff.ref_dtype, diff.target_dtype) == ("h", "bfloat16", "float16")
    [hint] = diff.hints
    assert hint.startswith(
        "the runs autocast to different dtypes: cpu (as cuda) to bfloat16, neuron (emulated) to "
        "float16; an autocast whose device type the cell reads from a tensor"
    ), hint


RESIDUAL_BACKWARD_BUG = (
    "import torch\nimport torch.nn as nn\n"
    + GRAD_CLIP
    + """
class Block(nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.clip = GradClip() if bug else nn.Identity()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc(self.clip(torch.tanh(self.ln(x))))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([Block(bug=False), Block(bug=True), Block(bug=False)])
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

torch.manual_seed(0)
net = Net()
x = torch.randn(4, 8)
"""
)


def test_layers_name_the_module_whose_backward_differs_between_functional_ops(ip):
    # The culprit's input came from `tanh(ln(x))`, not from a module as it is, so it had no
    # producer and could not be where backward diverged; its block, whose input was the previous
    # block's output, was named instead: "first divergence at blocks.1 (backward)".
    run_cell(ip, RESIDUAL_BACKWARD_BUG)
    run_cell(ip, "%%neuron --layers -o r\nnet = net.cuda()\nnet(x.cuda()).sum().backward()")
    report = ip.user_ns["r"]
    assert report.verdict == "FAIL"
    assert report.first_divergence is None  # the forward pass matches
    assert report.summary().endswith("first divergence at blocks.1.clip (backward)"), (
        report.summary()
    )
    born = [d.label for d in report.layers.layers if d.grad_born]
    assert born == ["blocks.1.clip"]
    # the JSON report says the same per layer (it held the forward figures only): the gradient
    # w.r.t. the culprit's output still matches, the one upstream of it (its input's) does not
    rows = {row["module"]: row for row in report.to_dict()["layers"]["layers"]}
    assert [m for m, row in rows.items() if row["grad_born"]] == ["blocks.1.clip"]
    assert (rows["blocks.1.clip"]["grad_diverged"], rows["blocks.1.clip"]["grad_error"]) == (
        False,
        0.0,
    )
    assert rows["blocks.1.ln"]["grad_diverged"] and rows["blocks.1.ln"]["grad_error"] > 0.1
    assert not rows["blocks.2.fc"]["grad_diverged"]

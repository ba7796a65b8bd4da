"""``torch.compile`` in ``%%neuron`` cells on the default path (target in its worker).

Each test is a failure a user met (issue 23): every compiled cell was an ERROR, the cpu reference's
compile errors hid their cause, SDPA could not be traced on the emulated device.
"""

import pytest

from neuron_workbench.run.records import RunError
from neuron_workbench.testing import run_cell

MLP = (
    "import torch\n"
    "import torch.nn as nn\n"
    "torch.manual_seed(0)\n"
    "mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
    "x = torch.randn(4, 8)"
)

ATTENTION = (
    "import torch\n"
    "import torch.nn as nn\n"
    "import torch.nn.functional as F\n"
    "class Attention(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.qkv = nn.Linear(16, 48)\n"
    "    def forward(self, x):\n"
    "        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)\n"
    "        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()\n"
    "torch.manual_seed(0)\n"
    "attn = Attention()\n"
    "x = torch.randn(2, 8, 16)"
)


def _report(ip):
    return ip.user_ns["r"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # The reference runs in this process: each test compiles afresh, as a new kernel would.
    import torch._dynamo

    torch._dynamo.reset()


@pytest.mark.parametrize("target", ["neuron", "tpu"])
def test_a_compiled_mlp_is_compared_not_an_error(ip, target):
    run_cell(ip, MLP)
    run_cell(
        ip,
        f"%%neuron --target {target} --rtol 1e-2 --atol 1e-2 -o r\n"
        "m = mlp.cuda()\n"
        "cm = torch.compile(m)\n"
        "y = cm(x.cuda())",
    )
    report = _report(ip)
    assert report.verdict == "PASS", report.summary()
    data = report.to_dict()
    # the reference compiled with Inductor's CPU code path; its record came with the report
    ref = data["ref"]["compile"]
    assert ref["graphs"] and {g["backend"] for g in ref["graphs"]} == {"inductor"}
    assert "compile" in data["target"]


def test_mode_max_autotune_on_neuron_warns_and_gives_a_verdict(ip):
    run_cell(ip, MLP)
    run_cell(
        ip,
        "%%neuron -o r\n"
        "m = mlp.cuda()\n"
        "y = torch.compile(m, mode='max-autotune-no-cudagraphs')(x.cuda())",
    )
    report = _report(ip)
    assert report.verdict == "PASS", report.summary()
    assert any("mode='max-autotune-no-cudagraphs'" in w for w in report.warnings), report.warnings


def test_sdpa_compiles_with_aot_eager_on_the_emulated_device(ip):
    run_cell(ip, ATTENTION)
    run_cell(
        ip,
        "%%neuron -o r\n"
        "a = attn.cuda()\n"
        "loss = torch.compile(a, backend='aot_eager')(x.cuda())\n"
        "loss.backward()\n"
        "grad = a.qkv.weight.grad",
    )
    report = _report(ip)
    assert report.verdict == "PASS", report.summary()


def test_a_graph_break_is_recorded_with_its_cell_line(ip):
    run_cell(ip, "import torch")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "def f(t):\n"
        "    t = t.sin()\n"
        "    print('inside')\n"
        "    return t.cos()\n"
        "y = torch.compile(f)(torch.ones(3).cuda())",
    )
    report = _report(ip)
    assert report.verdict == "PASS", report.summary()
    breaks = report.to_dict()["ref"]["compile"]["graph_breaks"]
    # cell lines count the %%neuron line, as error lines do
    assert [(b["file"], b["line"]) for b in breaks] == [("cell", 4)], breaks
    assert "print" in breaks[0]["reason"]


def test_a_compiler_error_names_its_cause_on_the_line():
    wrapped = RunError(
        "BackendCompilerFailed",
        "backend='tpu' raised:\nRuntimeError: operator 'aten::foo' is not implemented for TPU. "
        "Please file a feature request\n\nSet TORCHDYNAMO_VERBOSE=1 ...",
    )
    assert wrapped.summary == (
        "BackendCompilerFailed: backend='tpu' raised: RuntimeError: operator 'aten::foo' is not "
        "implemented for TPU. Please file a feature request"
    )

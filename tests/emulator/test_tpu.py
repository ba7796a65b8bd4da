"""Emulated tpu, in a subprocess (the pytest process emulates neuron; one backend per process)."""

from __future__ import annotations

import json

import pytest

TPU_SCRIPT = r"""
import json, sys, torch
import neuron_workbench.emulator as E
from neuron_workbench.errors import BackendUnavailable
out = {}
st = E.emulate("tpu")
out["status"] = st.to_dict()
out["describe"] = st.describe()
x = torch.randn(4, 8, device="tpu")
try:
    x.kthvalue(2)
    out["kthvalue_default"] = "ran"
except RuntimeError as e:
    out["kthvalue_default"] = str(e)
try:
    torch.special.i0(x)
    out["i0_default"] = "ran"
except RuntimeError as e:
    out["i0_default"] = str(e)
# native ops (incl. structured in-place family) still run
y = x.clone(); y.abs_(); y.add_(1); y.sqrt_()
out["native_ok"] = bool(torch.equal(y.cpu(), x.cpu().abs().add(1).sqrt()))
m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                        torch.nn.Flatten(), torch.nn.Linear(36, 2)).to("tpu")
out["cnn_shape"] = list(m(torch.randn(1, 3, 8, 8, device="tpu")).shape)
# enable the CPU fallback the way TorchTPU does (execution_mode.enable_cpu_fallback)
torch.tpu.execution_mode.enable_cpu_fallback = True
with E.record_fallbacks() as log:
    v = x.kthvalue(2).values
    w = torch.special.i0(x)
out["fallback_ops"] = log.ops()
out["fallback_values_ok"] = bool(torch.equal(v.cpu(), x.cpu().kthvalue(2).values)
                                 and torch.equal(w.cpu(), torch.special.i0(x.cpu())))
out["status_fallback"] = E.status().cpu_fallback
torch.tpu.execution_mode.enable_cpu_fallback = False
# precision modes
torch.manual_seed(0)
a, b = torch.randn(64, 64), torch.randn(64, 64)
exact = a.double() @ b.double()
err = {}
for mode in ("DEFAULT", "HIGH", "HIGHEST"):
    torch.tpu.set_precision(torch.tpu.Precision[mode])
    r = (a.to("tpu") @ b.to("tpu")).cpu()
    err[mode] = (r.double() - exact).abs().max().item()
    if mode == "DEFAULT":
        out["default_is_1pass"] = bool(torch.equal(r, a.bfloat16().float() @ b.bfloat16().float()))
out["err"] = err
out["fp32_err"] = ((a @ b).double() - exact).abs().max().item()
torch.set_float32_matmul_precision("highest")
out["mapped_highest"] = torch.tpu.get_precision().name
torch.set_float32_matmul_precision("medium")
out["mapped_medium"] = torch.tpu.get_precision().name
out["get_fp32_prec"] = torch.get_float32_matmul_precision()
with torch.tpu.precision(torch.tpu.Precision.HIGH):
    out["ctx"] = E.status().numerics["matmul_precision"]
out["after_ctx"] = E.status().numerics["matmul_precision"]
try:
    E.emulate("neuron")
except BackendUnavailable as e:
    out["neuron_refused"] = str(e)
out["accelerator"] = str(torch.accelerator.current_accelerator())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tpu_result(run_py):
    proc = run_py(TPU_SCRIPT, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_tpu_status(tpu_result):
    out, _ = tpu_result
    st = out["status"]
    assert (st["device"], st["profile"], st["cpu_fallback"], st["emulated"]) == (
        "tpu",
        "tpu-0.2.0",
        False,
        True,
    )
    assert st["native_ops"] == 483 and "torch-tpu 0.2.0" in st["provenance"]
    assert st["numerics"]["matmul_precision"] == "DEFAULT (1-pass bf16)"
    assert out["describe"] == "emulated tpu (profile tpu-0.2.0; timings are host CPU time)"
    assert out["accelerator"] == "tpu"


def test_unsupported_op_raises_torchtpu_error_text(tpu_result):
    out, _ = tpu_result
    # kthvalue's composite runs on the device; its out= kernel is missing on TPU
    assert out["kthvalue_default"] == (
        "operator 'aten::kthvalue.values' is not implemented for TPU. Please file a feature request"
    )
    # i0 is structured: its CompositeExplicitAutogradNonFunctional kernel runs on the device and
    # calls i0.out, which is what reaches the backend's fallback (as on TorchTPU itself)
    assert out["i0_default"] == (
        "operator 'aten::i0.out' is not implemented for TPU. Please file a feature request"
    )
    assert out["native_ok"] is True and out["cnn_shape"] == [1, 2]


def test_fallback_enabled_runs_on_cpu_and_warns(tpu_result):
    out, stderr = tpu_result
    assert out["fallback_ops"] == ["aten::i0", "aten::kthvalue"]
    assert out["fallback_values_ok"] is True and out["status_fallback"] is True
    assert "operator 'aten::i0.out' is not implemented for TPU. Falling back to CPU" in stderr


def test_precision_modes(tpu_result):
    out, _ = tpu_result
    err = out["err"]
    assert out["default_is_1pass"] is True
    assert err["DEFAULT"] > 10 * err["HIGH"] > 0
    assert err["HIGH"] > err["HIGHEST"]
    assert err["HIGHEST"] < 10 * out["fp32_err"] + 1e-5
    assert out["mapped_highest"] == "HIGHEST" and out["mapped_medium"] == "DEFAULT"
    assert out["get_fp32_prec"] == "medium"
    assert out["ctx"] == "HIGH (3-pass bf16)" and out["after_ctx"] == "DEFAULT (1-pass bf16)"


def test_neuron_refused_in_tpu_process(tpu_result):
    out, _ = tpu_result
    assert out["neuron_refused"] == (
        "emulated neuron is not available: this process already emulates tpu (one PrivateUse1 "
        "backend per process); restart the kernel"
    )

"""CUDA dtypes the CPU kernel lacks (OpInfo's table), computed wider by the device's own kernel."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from neuron_workbench.emulator import record_fallbacks

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(
    importlib.util.find_spec("expecttest") is None,
    reason="torch.testing._internal (op_db) needs the expecttest package",
)
def test_the_packaged_table_is_current_for_this_torch():
    # Derived from OpInfo (dtypesIfCUDA vs dtypes) and the CPU kernels' own errors.
    r = subprocess.run(
        [sys.executable, str(HERE / "cuda_dtype_gaps.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_histc_on_int32_as_a_moe_router_calls_it():
    # Mixtral's router counts tokens per expert with histc on int32 off CPU, as on CUDA.
    experts = torch.tensor([[0, 3], [3, 1], [7, 3]], dtype=torch.int32)
    with record_fallbacks() as log:
        counts = torch.histc(experts.to("neuron"), bins=8, min=0, max=7)
    assert counts.device.type == "neuron" and counts.dtype == torch.int32
    want = torch.histc(experts.double(), bins=8, min=0, max=7).int()
    assert torch.equal(counts.cpu(), want) and want.tolist() == [1, 1, 0, 3, 0, 0, 0, 1]
    assert log.events == []  # native on neuron: the device's kernel, not a fallback
    with pytest.raises(NotImplementedError, match="not implemented for 'Int'"):
        torch.histc(experts, bins=8, min=0, max=7)  # the CPU kernel itself still lacks it


def test_abs_of_bool_keeps_cudas_result_dtype():
    m = torch.tensor([[True, False], [False, True]])
    assert torch.abs(m.to("neuron")).dtype == torch.bool
    assert torch.equal(torch.abs(m.to("neuron")).cpu(), m)


def test_widened_ops_run_under_inference_mode():
    # The widened copies made under torch.inference_mode() have no version counter, which the
    # emulator read to find the ones the kernel changed: a DBRX model's evaluation (its router's
    # histc on int32) ERRORed on the target ("Inference tensors do not track version counter.")
    from neuron_workbench.emulator._policy import run_widened

    experts = torch.tensor([[0, 3], [3, 1], [7, 3]], dtype=torch.int32)
    with torch.inference_mode():
        counts = torch.histc(experts.to("neuron"), bins=8, min=0, max=7)
        assert torch.abs(experts.to("neuron") > 2).dtype == torch.bool
    assert counts.cpu().tolist() == [1, 1, 0, 3, 0, 0, 0, 1]

    def fill(noise, value):  # a kernel writing into an argument, as rrelu_with_noise's noise
        return noise.fill_(value).sum()

    gaps = {torch.float16: torch.float32}
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            noise, untouched = (
                torch.zeros(3, dtype=torch.float16),
                torch.ones(3, dtype=torch.float16),
            )
            run_widened(fill, gaps, [noise, 2.0], {})
            run_widened(lambda t: t.sum(), gaps, [untouched], {})
        assert noise.tolist() == [2.0, 2.0, 2.0] and untouched.tolist() == [1.0, 1.0, 1.0]


def test_other_dtypes_take_the_ordinary_path():
    x = torch.tensor([0.5, 1.5, 1.5, 3.0])
    assert torch.equal(
        torch.histc(x.to("neuron"), bins=3, min=0, max=3).cpu(), torch.histc(x, 3, 0, 3)
    )


def test_an_op_outside_the_coverage_fails_as_the_cpu_fallback_does():
    # avg_pool3d is not a TorchNeuron op: its CPU fallback meets the CPU kernel's gap, as on Trainium.
    x = torch.randn(1, 1, 4, 4, 4, dtype=torch.float16, device="neuron")
    with pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        F.avg_pool3d(x, 2)
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        torch.trace(torch.eye(2, dtype=torch.bool, device="neuron"))  # trace: on no profile


TPU = r"""
import json, torch
import torch.nn.functional as F
from neuron_workbench import emulator as E
E.emulate("tpu")
x = torch.randn(1, 1, 4, 4, 4, generator=torch.Generator().manual_seed(0))
want = F.avg_pool3d(x.half().float().requires_grad_(), 2)
want.sum().backward()
d = x.half().to("tpu").requires_grad_()
got = F.avg_pool3d(d, 2)
got.sum().backward()
i = torch.tensor([2, 2, 5], dtype=torch.int32)
print(json.dumps({
    "core": E.status().core,
    "dtype": str(got.dtype), "grad_dtype": str(d.grad.dtype),
    "fwd": torch.equal(got.cpu(), want.detach().half()),
    "bwd": torch.equal(d.grad.cpu(), torch.full_like(d.grad.cpu(), 0.125)),
    "histc": torch.histc(i.to("tpu"), bins=3, min=2, max=5).cpu().tolist(),
}))
"""


@pytest.mark.parametrize("core", ["auto", "python"])
def test_half_pooling_forward_and_backward_on_tpu(run_py, core):
    r = run_py(TPU, env={"NEURON_WORKBENCH_EMULATOR_CORE": core})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["core"] == ("python" if core == "python" else "native")
    assert out == {
        "core": out["core"],
        "dtype": "torch.float16",
        "grad_dtype": "torch.float16",
        "fwd": True,
        "bwd": True,
        "histc": [2, 0, 1],
    }


def test_a_mixtral_moe_training_step_runs_its_int32_histc_on_the_device():
    transformers = pytest.importorskip("transformers")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Histc(TorchDispatchMode):
        dtypes: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.histc.default:
                self.dtypes.append((args[0].device.type, args[0].dtype))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.MixtralForCausalLM(config)
    ids = torch.randint(0, 64, (2, 8))
    want = model(ids, labels=ids).loss.item()
    model.to("neuron")
    mode = Histc()
    with mode:
        loss = model(ids.to("neuron"), labels=ids.to("neuron")).loss
    loss.backward()
    assert ("neuron", torch.int32) in mode.dtypes  # the router's call, as on CUDA
    assert loss.item() == pytest.approx(want, rel=1e-5)

"""Sparse layouts on the emulated devices: a clear one-line error that names layout, op and vendor;
memory formats neuron refuses.

This process emulates neuron (conftest); tpu runs in a subprocess.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

LAYOUT_SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
import neuron_workbench
dev = sys.argv[1]
neuron_workbench.emulate(dev)
i = torch.tensor([[0, 1], [1, 0]]); v = torch.tensor([1.0, 2.0])
coo = torch.sparse_coo_tensor(i, v, (2, 2))
csr = coo.to_sparse_csr()
cases = {
    "coo_to": lambda: coo.to(dev),
    "csr_to": lambda: csr.to(dev),
    "coo_factory": lambda: torch.sparse_coo_tensor(i, v, (2, 2), device=dev),
    "coo_layout_factory": lambda: torch.zeros(2, 2, layout=torch.sparse_coo, device=dev),
    "dense_to_sparse": lambda: torch.ones(2, 2, device=dev).to_sparse(),
    "dense_to_csr": lambda: torch.ones(2, 2, device=dev).to_sparse_csr(),
}
out = {}
for name, fn in cases.items():
    try:
        r = fn()
        out[name] = ["no error", str(r.layout), str(r.device)]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
out["dense_still_works"] = torch.ones(2, device=dev).add(1).sum().item()
print(json.dumps(out))
"""


def _check(out: dict, device: str, behaviour: str) -> None:
    expected_layout = {
        "coo_to": "torch.sparse_coo",
        "csr_to": "torch.sparse_csr",
        "coo_factory": "torch.sparse_coo",
        "coo_layout_factory": "torch.sparse_coo",
        "dense_to_sparse": "torch.sparse_coo",
        "dense_to_csr": "torch.sparse_csr",
    }
    for name, layout in expected_layout.items():
        kind, msg = out[name][0], out[name][-1]
        assert kind == "NotImplementedError", (name, out[name])
        assert "\n" not in msg, msg
        assert "same device" not in msg, msg
        assert f"emulated {device}" in msg and layout in msg and behaviour in msg, msg
        assert "aten::" in msg, msg  # names the op
    assert out["dense_still_works"] == 4.0


def test_sparse_on_emulated_neuron_names_layout_op_and_coverage(run_py):
    # In a subprocess too, so both devices run the very same script.
    r = run_py(LAYOUT_SCRIPT, args=["neuron"])
    assert r.returncode == 0, r.stderr
    _check(
        json.loads(r.stdout.splitlines()[-1]), "neuron", "registered coverage has no op for sparse"
    )


def test_sparse_on_emulated_tpu_quotes_torchtpu(run_py):
    r = run_py(LAYOUT_SCRIPT, args=["tpu"])
    assert r.returncode == 0, r.stderr
    _check(
        json.loads(r.stdout.splitlines()[-1]),
        "tpu",
        "sparse operators are not supported on TPU yet",
    )


@pytest.mark.parametrize("to_layout", ["to_sparse", "to_sparse_csr"])
def test_sparse_in_process_neuron(to_layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu_sparse = getattr(torch.eye(3), to_layout)()
    with pytest.raises(
        NotImplementedError, match=r"emulated neuron: a torch\.sparse_(coo|csr) tensor"
    ):
        cpu_sparse.to("neuron")
    # the CPU tensor is untouched and still usable; dense copies move fine
    assert torch.equal(cpu_sparse.to_dense().to("neuron").cpu(), torch.eye(3))


MEMORY_FORMAT_SCRIPT = r"""
import json, sys
import torch
import neuron_workbench
dev = sys.argv[1]
neuron_workbench.emulate(dev)
x = torch.randn(2, 3, 4, 5, device=dev)
cases = {
    "contiguous": lambda: x.contiguous(memory_format=torch.channels_last),
    "to": lambda: x.to(memory_format=torch.channels_last),
    "host_to": lambda: torch.randn(2, 3, 4, 5).to(dev, memory_format=torch.channels_last),
    "module_to": lambda: torch.nn.Conv2d(3, 4, 3).to(dev, memory_format=torch.channels_last),
    "3d": lambda: x[None].contiguous(memory_format=torch.channels_last_3d),
}
out = {}
for name, fn in cases.items():
    try:
        fn()
        out[name] = "no error"
    except RuntimeError as e:
        out[name] = str(e)
# what the device takes: contiguous, preserve, a channels_last copy to the host, and a structured
# op's output allocated in its input's layout (a permuted NHWC view), which the cell asked nothing of
nhwc = torch.randn(2, 8, 8, 4, device=dev).permute(0, 3, 1, 2)
out["kept"] = [
    x.contiguous(memory_format=torch.contiguous_format).is_contiguous(),
    torch.empty_like(x.transpose(1, 2)).shape == (2, 4, 3, 5),
    x.to("cpu", memory_format=torch.channels_last).is_contiguous(memory_format=torch.channels_last),
    torch.nn.functional.max_pool2d(nhwc, 2).shape == (2, 4, 4, 4),
]
print(json.dumps(out))
"""


@pytest.mark.parametrize("core", ["native", "python"])
def test_channels_last_on_emulated_neuron_is_refused_as_torchneuron_does(run_py, core):
    # TorchNeuron: "Neuron tensors only support contiguous or preserve memory format"
    # (shared/notes/torchneuron.md §10); the emulated neuron made such tensors.
    r = run_py(MEMORY_FORMAT_SCRIPT, args=["neuron"], env={"NEURON_WORKBENCH_EMULATOR_CORE": core})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out.pop("kept") == [True, True, True, True]
    for name, message in out.items():
        assert message.endswith(
            ": Neuron tensors only support contiguous or preserve memory format"
        )
        assert message.startswith("aten::"), (name, message)  # names the op


def test_channels_last_on_emulated_tpu_is_kept(run_py):
    # TorchTPU's answer is not known: the host's behaviour
    r = run_py(MEMORY_FORMAT_SCRIPT, args=["tpu"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out.pop("kept") == [True, True, True, True]
    assert set(out.values()) == {"no error"}, out

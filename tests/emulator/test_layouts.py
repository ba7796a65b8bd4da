"""Sparse layouts on the emulated devices: a clear one-line error that names layout, op and vendor.

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

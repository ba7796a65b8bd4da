"""The emulated `neuron` device: creation, movement, API surface, serialization, limits, memory."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn

import neuron_workbench
from neuron_workbench.emulator import (
    EmulatorStatus,
    can_emulate,
    configure,
    emulate,
    memory_stats,
    status,
)
from neuron_workbench.errors import BackendUnavailable


def test_status_names_profile_and_provenance():
    st = emulate("neuron")  # idempotent second call
    assert isinstance(st, EmulatorStatus) and st == status()
    assert (st.device, st.profile, st.emulated, st.cpu_fallback) == (
        "neuron",
        "neuron-2026-04",
        True,
        True,
    )
    assert st.native_ops == 195 and "torch-neuronx" in st.provenance
    assert st.numerics["float64"] == "computed as float32"
    assert st.numerics["autocast_default"] == "float16" and st.numerics["bf16_matmul"] is False
    assert st.describe() == "emulated neuron (profile neuron-2026-04; timings are host CPU time)"
    assert neuron_workbench.emulate("neuron") == st


def test_other_device_is_refused_in_this_process():
    ok, reason = can_emulate("tpu")
    assert not ok and "already emulates neuron" in reason
    with pytest.raises(BackendUnavailable, match="one PrivateUse1 backend per process"):
        emulate("tpu")
    assert can_emulate("neuron") == (True, "")
    assert can_emulate("cuda")[0] is False


def test_factories_and_movement():
    torch.manual_seed(0)
    a = torch.randn(3, 4, device="neuron")
    torch.manual_seed(0)
    assert torch.equal(a.cpu(), torch.randn(3, 4))  # shared CPU generator
    assert a.device == torch.device("neuron", 0) and a.is_neuron
    assert type(a.cpu()) is torch.Tensor
    for t in (
        torch.zeros(2, device="neuron"),
        torch.ones(2, 2, device="neuron"),
        torch.full((2,), 7.0, device="neuron"),
        torch.arange(5, device="neuron"),
        torch.eye(3, device="neuron"),
        torch.linspace(0, 1, 4, device="neuron"),
        torch.tensor([1.0, 2.0], device="neuron"),
        torch.empty(3, device="neuron"),
        torch.ones(2).to("neuron"),
        torch.ones(2).neuron(),
    ):
        assert t.device.type == "neuron"
    assert torch.arange(5, device="neuron").tolist() == [0, 1, 2, 3, 4]
    assert torch.eye(3, device="neuron").cpu().trace().item() == 3.0
    y = torch.ones(2).to("neuron")
    assert y.to("neuron") is y
    assert y.to("neuron", torch.float64).dtype == torch.float64


def test_default_device_and_device_context():
    torch.set_default_device("neuron")
    try:
        assert torch.zeros(2).device.type == "neuron"
    finally:
        torch.set_default_device(None)
    with torch.device("neuron"):
        assert torch.ones(1).device.type == "neuron"
    assert torch.ones(1).device.type == "cpu"


def test_module_to_and_parameters():
    m = nn.Linear(3, 2).to("neuron")
    assert isinstance(m.weight, nn.Parameter) and m.weight.device.type == "neuron"
    out = m(torch.ones(4, 3, device="neuron"))
    out.sum().backward()
    assert m.weight.grad.device.type == "neuron"
    torch.testing.assert_close(m.weight.grad.cpu(), torch.full((2, 3), 4.0))
    assert m.cpu().weight.device.type == "cpu"


def test_mixing_devices_raises_cuda_style_error():
    a = torch.ones(3, device="neuron")
    with pytest.raises(
        RuntimeError, match=r"same device, but found at least two devices, neuron:0 and cpu!"
    ):
        a + torch.ones(3)
    assert (a * torch.tensor(2.0)).cpu().tolist() == [2.0, 2.0, 2.0]  # 0-dim CPU is fine
    idx = torch.tensor([0, 2])
    assert a[idx].device.type == "neuron"  # CPU indices are allowed, as on CUDA
    a[1:] = torch.tensor([5.0, 6.0])
    assert a.tolist() == [1.0, 5.0, 6.0]


def test_printing_item_numpy():
    t = torch.tensor([1.5, 2.5], device="neuron", requires_grad=True)
    assert repr(t) == "tensor([1.5000, 2.5000], device='neuron:0', requires_grad=True)"
    assert "grad_fn=<MulBackward0>" in repr(t * 2)
    assert "dtype=torch.float64" in repr(t.detach().double())
    assert (t.sum()).item() == 4.0 and f"{t.sum():.1f}" == "4.0"
    with pytest.raises(TypeError, match="can't convert neuron:0 device type tensor to numpy"):
        t.detach().numpy()
    assert t.tolist() == [1.5, 2.5]


def test_state_dict_save_load_deepcopy(tmp_path):
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).to("neuron")
    path = tmp_path / "ck.pt"
    torch.save(m.state_dict(), path)
    sd = torch.load(path)  # weights_only=True is the default
    assert all(v.device.type == "neuron" for v in sd.values())
    sd_cpu = torch.load(path, map_location="cpu")
    assert all(type(v) is torch.Tensor for v in sd_cpu.values())
    m2 = copy.deepcopy(m)
    assert m2[0].weight.device.type == "neuron" and isinstance(m2[0].weight, nn.Parameter)
    assert m2[0].weight is not m[0].weight
    torch.testing.assert_close(m2[0].weight.cpu(), m[0].weight.cpu())
    fresh = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).to("neuron")
    fresh.load_state_dict(sd_cpu)  # from a CPU state dict
    torch.testing.assert_close(fresh[2].bias.cpu(), sd_cpu["2.bias"])
    buf = io.BytesIO()
    torch.save(torch.arange(3, device="neuron"), buf)
    buf.seek(0)
    assert torch.load(buf).device.type == "neuron"


def test_torch_neuron_module():
    n = torch.neuron
    assert n.is_available() and n.device_count() == 1 and n.is_emulated()
    assert n.get_device_name() == "neuron:0" and n.current_device() == 0
    assert n.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert n.is_bf16_supported()
    n.synchronize()
    n.manual_seed(3)
    a = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(a, torch.rand(2))
    s = n.memory_stats()
    assert set(s["allocated_bytes"]) == {"current", "peak", "allocated", "freed"}
    for key in (
        "reserved_bytes",
        "active_bytes",
        "num_ooms",
        "num_tensor_frees",
        "allocation_requests",
    ):
        assert key in s
    with n.device(0), n.stream(n.current_stream()):
        pass


def test_torch_accelerator_basics():
    acc = torch.accelerator
    assert acc.current_accelerator() == torch.device("neuron")
    assert acc.is_available() and acc.device_count() == 1
    acc.synchronize()  # routed to torch.neuron.synchronize (C++ cannot sync a Python backend)
    assert acc.memory_allocated() == torch.neuron.memory_allocated()


def test_memory_accounting_current_peak_and_views():
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    t = torch.empty(1000, 250, device="neuron")  # 1,000,000 bytes
    assert torch.neuron.memory_allocated() - base == 1_000_000
    v = t[:10]  # a view shares the storage: no new bytes
    assert torch.neuron.memory_allocated() - base == 1_000_000
    del t
    assert torch.neuron.memory_allocated() - base == 1_000_000  # the view keeps it alive
    del v
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_allocated() - base == 1_000_000
    assert memory_stats()["peak_bytes"] == torch.neuron.max_memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base


def test_capacity_raises_out_of_memory():
    keep = torch.ones(10, device="neuron")
    configure(capacity_bytes=torch.neuron.memory_allocated() + 4096)
    ooms = torch.neuron.memory_stats()["num_ooms"]
    torch.ones(1000, device="neuron")  # 4000 bytes fit
    with pytest.raises(torch.OutOfMemoryError, match="emulated neuron out of memory"):
        torch.ones(2000, device="neuron")
    with pytest.raises(torch.OutOfMemoryError):
        keep.repeat(1000)
    assert torch.neuron.memory_stats()["num_ooms"] == ooms + 2
    assert status().capacity_bytes is not None


@pytest.mark.parametrize(
    "action,error,match",
    [
        (lambda: torch.Generator(device="neuron"), NotImplementedError, "per-device generators"),
        (lambda: torch.ones(2, device="neuron", pin_memory=True), RuntimeError, "dense CPU"),
        (lambda: torch.ones(2, device="neuron:1"), RuntimeError, "single device"),
        (lambda: torch.ones(2).to("neuron:1"), RuntimeError, "single device"),
    ],
    ids=["generator", "pin-device-factory", "factory-index", "to-index"],
)
def test_impossible_features_raise_clear_errors(action, error, match):
    with pytest.raises(error, match=match):
        action()


def test_cpu_generator_still_works_and_is_instance():
    g = torch.Generator().manual_seed(1)
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    assert torch.randn(2, generator=g).shape == (2,)


def test_inplace_restride_and_shrink_resync():
    t = torch.ones(2, 3, device="neuron")
    t.t_()
    assert t.shape == (3, 2) and t.cpu().shape == (3, 2)
    u = torch.ones(3, device="neuron").unsqueeze_(0)
    assert u.shape == (1, 3) and u.cpu().shape == (1, 3)
    s = torch.arange(6.0, device="neuron")
    s.resize_(2)
    assert s.tolist() == [0.0, 1.0]
    grown = torch.ones(2, device="neuron")
    grown.resize_(5)  # real storage: grows as on CPU, the old elements kept
    assert grown.shape == (5,) and grown[:2].tolist() == [1.0, 1.0]


def test_dynamic_shape_ops_and_complex():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="neuron")
    assert x.nonzero().flatten().tolist() == [1, 3]
    assert x[x > 0].tolist() == [1.0, 2.0]
    assert torch.unique(x).tolist() == [0.0, 1.0, 2.0]
    c = torch.tensor([1 + 2j], device="neuron")
    assert (c * c).cpu().item() == (1 + 2j) ** 2


def test_repeated_emulate_changes_only_given_options():
    configure(bf16_matmul=True, capacity_bytes=10**12)
    st = emulate("neuron")  # e.g. a magic making sure the device exists
    assert st.numerics["bf16_matmul"] is True and st.capacity_bytes == 10**12
    st = emulate("neuron", bf16_matmul=False, capacity_bytes=None)
    assert st.numerics["bf16_matmul"] is False and st.capacity_bytes is None


def test_autoload_is_a_noop_without_the_env_var(monkeypatch):
    from neuron_workbench.emulator.autoload import autoload

    monkeypatch.delenv("NEURON_WORKBENCH_EMULATE", raising=False)
    assert autoload() is None
    monkeypatch.setenv("NEURON_WORKBENCH_EMULATE", "neuron")
    assert autoload() is None and status().device == "neuron"  # idempotent here


def test_a_forked_child_is_refused_the_device_as_torchneurons_runtime_refuses_it():
    # torchneuron.md §2: re-initialising the runtime in a forked child raises. The emulated device
    # made tensors there, which a DataLoader worker could not send back (its loader hung).
    import os

    emulate("neuron")
    assert not torch.neuron._is_in_bad_fork()
    torch.ones(2, device="neuron")  # the device is in use before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: each way onto the device is refused
        answers = [str(torch.neuron._is_in_bad_fork())]
        for make in (lambda: torch.ones(2, device="neuron"), lambda: torch.zeros(2).to("neuron")):
            try:
                make()
                answers.append("made")
            except RuntimeError as exc:
                answers.append(str(exc))
        os.write(write, "\n".join(answers).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        bad_fork, *refusals = answer.read().split("\n")
    assert bad_fork == "True"
    assert (
        refusals
        == [
            "Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron with "
            "multiprocessing, use the 'spawn' start method"
        ]
        * 2
    )
    assert torch.ones(2, device="neuron").device.type == "neuron"  # the parent goes on

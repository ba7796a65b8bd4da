"""Real device storage (the native core): pointers, sharing, growth and memory from the allocator.

Each behaviour is compared with the same code on CPU, which is what real model code assumes of a
device (tied-weight detection, in-place growth, ``out=`` resizing, checkpoints).
"""

from __future__ import annotations

import copy
import gc
import io
import warnings

import pytest
import torch

from neuron_workbench.emulator import _core, status


@pytest.fixture(autouse=True)
def _native_core(emulated_neuron):
    # decided once the device is installed (by the fixture), not at collection
    if status() is None or status().core != "native":
        pytest.skip("needs the emulator's native core (python -m neuron_workbench.emulator.native)")


def test_status_reports_the_native_core():
    st = status()
    assert st.core == "native" and st.core_note == ""
    assert st.to_dict()["core"] == "native"


def test_storage_pointer_is_real_and_views_share_it():
    t = torch.arange(12.0, device="neuron").reshape(3, 4)
    ptr = t.untyped_storage().data_ptr()
    assert ptr != 0 and t.data_ptr() == ptr
    row = t[1]
    col = t[:, 2]
    assert row.untyped_storage().data_ptr() == ptr == col.untyped_storage().data_ptr()
    assert row.data_ptr() == ptr + 4 * t.element_size()
    assert t.untyped_storage().nbytes() == 12 * 4
    # a write through a view is seen through the base, as on any device
    row.zero_()
    assert t.cpu()[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert t.clone().untyped_storage().data_ptr() != ptr


def test_tied_weights_are_detected_by_storage():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # weight tying, as GPT-2 does
    model = torch.nn.ModuleDict({"emb": emb, "head": head}).to("neuron")
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(ptrs) == 1
    assert model["emb"].weight is model["head"].weight


def _both(fn):
    """Run ``fn(device)`` on cpu and neuron; return both results on CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
        return fn("cpu"), fn("neuron")


def test_resize_to_a_larger_size_behaves_as_on_cpu():
    def grow(dev):
        t = torch.arange(4.0, device=dev)
        view = t[:2]
        t.resize_(3, 5)
        t.view(-1)[4:].fill_(7.0)
        return t.shape, t.view(-1)[:4].cpu().tolist(), t.view(-1)[4:].cpu().tolist(), view.cpu()

    (cpu_shape, cpu_kept, cpu_new, cpu_view), (shape, kept, new, view) = _both(grow)
    assert shape == cpu_shape == (3, 5)
    assert kept == cpu_kept == [0.0, 1.0, 2.0, 3.0]
    assert new == cpu_new
    assert torch.equal(view, cpu_view)


def test_storage_resize_grows_the_bytes():
    t = torch.ones(4, device="neuron")
    t.untyped_storage().resize_(64)
    assert t.untyped_storage().nbytes() == 64
    assert t.cpu().tolist() == [1.0, 1.0, 1.0, 1.0]


def test_set_shares_storage_and_takes_its_geometry():
    def set_to(dev):
        src = torch.arange(6.0, device=dev)
        t = torch.empty(0, device=dev)
        t.set_(src.untyped_storage(), 1, (2, 2), (2, 1))
        same = t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
        t.mul_(10)
        other = torch.empty(0, device=dev).set_(src)
        return t.cpu(), src.cpu(), same, other.shape

    (c_t, c_src, c_same, c_other), (t, src, same, other) = _both(set_to)
    assert same and c_same
    assert torch.equal(t, c_t) and torch.equal(src, c_src)
    assert other == c_other == (6,)


@pytest.mark.parametrize(
    "op",
    [
        lambda dev, out: torch.add(torch.ones(3, 4, device=dev), 2, out=out),
        lambda dev, out: torch.mm(
            torch.ones(3, 2, device=dev), torch.ones(2, 5, device=dev), out=out
        ),
        lambda dev, out: torch.cat(
            [torch.ones(2, device=dev), torch.zeros(3, device=dev)], out=out
        ),
        lambda dev, out: torch.sort(
            torch.tensor([3.0, 1.0, 2.0], device=dev),
            out=(out, torch.empty(0, dtype=torch.long, device=dev)),
        )[0],
        lambda dev, out: torch.arange(7, dtype=torch.float32, device=dev, out=out),
    ],
    ids=["add", "mm", "cat", "sort", "arange"],
)
@pytest.mark.parametrize("start", [0, 1], ids=["empty-out", "too-small-out"])
def test_out_larger_than_the_given_tensor_behaves_as_on_cpu(op, start):
    def run(dev):
        out = torch.empty(start, device=dev)
        res = op(dev, out)
        return res is out, out.shape, out.cpu()

    (c_same, c_shape, c_val), (same, shape, val) = _both(run)
    assert same and c_same
    assert shape == c_shape
    assert torch.equal(val, c_val)


def test_logit_backward_at_negative_zero_matches_cpu():
    grads = {}
    for dev in ("cpu", "neuron"):
        x = torch.tensor([-0.0, 0.0, 0.25, 1e-8, 1.0], device=dev, requires_grad=True)
        for eps in (None, 1e-6):
            (g,) = torch.autograd.grad(torch.logit(x, eps).sum(), x)
            grads[dev, eps] = g.cpu()
    for eps in (None, 1e-6):
        a, b = grads["cpu", eps], grads["neuron", eps]
        assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b)), eps


def test_memory_is_counted_by_the_allocator():
    gc.collect()  # tensors of earlier tests, freed now rather than in the middle of this one
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    t = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_allocated() == before + (1 << 20)
    view = t[10:]
    assert torch.neuron.memory_allocated() == before + (1 << 20)  # a view allocates nothing
    y = t.float()  # a result made by the CPU kernel is device memory too
    assert torch.neuron.memory_allocated() == before + (1 << 20) * 5
    t.resize_(1 << 21)  # growth: the new block counted, the old one freed
    assert torch.neuron.memory_allocated() == before + (1 << 21) + (1 << 22)
    assert torch.neuron.max_memory_allocated() >= before + (1 << 21) + (1 << 22)
    del t, view, y
    assert torch.neuron.memory_allocated() == before


def test_accelerator_apis_report_the_device():
    gc.collect()
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "neuron"
    assert torch.accelerator.device_count() == 1
    before = torch.accelerator.memory_allocated()
    keep = torch.ones(1024, device="neuron")
    assert torch.accelerator.memory_allocated() == before + 4096
    torch.accelerator.synchronize()
    del keep


def test_capacity_limit_raises_out_of_memory_from_the_allocator():
    from neuron_workbench.emulator import configure

    before = torch.neuron.memory_allocated()
    configure(capacity_bytes=before + 1000)
    try:
        with pytest.raises(torch.OutOfMemoryError, match="emulated neuron out of memory"):
            torch.empty(2000, dtype=torch.uint8, device="neuron")
        small = torch.empty(500, dtype=torch.uint8, device="neuron")
        with pytest.raises(torch.OutOfMemoryError):
            small.resize_(5000)
        assert small.untyped_storage().nbytes() == 500  # the storage was not replaced
    finally:
        configure(capacity_bytes=None)


def test_checkpoint_round_trip_and_deepcopy_keep_storage_sharing():
    base = torch.arange(6.0, device="neuron")
    state = {"a": base, "b": base[2:]}
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert loaded["a"].device.type == "neuron"
    assert loaded["b"].untyped_storage().data_ptr() == loaded["a"].untyped_storage().data_ptr()
    assert loaded["b"].cpu().tolist() == [2.0, 3.0, 4.0, 5.0]
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu", weights_only=True)
    assert on_cpu["a"].device.type == "cpu" and on_cpu["a"].tolist() == base.cpu().tolist()
    twin = copy.deepcopy(state)
    assert twin["b"].untyped_storage().data_ptr() == twin["a"].untyped_storage().data_ptr()
    assert twin["a"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()


def test_cpu_alias_is_the_same_memory():
    t = torch.zeros(3, device="neuron")
    alias = _core.NATIVE_CORE.cpu_alias(t)
    assert alias.device.type == "cpu" and alias.data_ptr() == t.data_ptr()
    alias.fill_(2.0)
    assert t.cpu().tolist() == [2.0, 2.0, 2.0]

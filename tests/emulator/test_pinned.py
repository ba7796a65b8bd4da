"""Pinned host memory with the emulator installed (this process emulates neuron, see conftest)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def test_pin_memory_returns_a_pinned_copy_that_does_not_alias():
    x = torch.arange(12.0).reshape(3, 4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned()
    assert p.device.type == "cpu" and torch.equal(p, x)
    assert p.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    p[0, 0] = -1.0
    assert x[0, 0].item() == 0.0  # a copy, not a view of the original
    assert p.pin_memory() is p  # already pinned: returned as is (CUDA semantics)
    assert p[1].is_pinned()  # views of pinned memory are pinned


def test_pinned_copy_keeps_strides_and_autograd():
    x = torch.randn(4, 3).t()
    p = x.pin_memory()
    assert p.stride() == x.stride() and torch.equal(p, x)
    w = torch.randn(3, requires_grad=True)
    q = w.pin_memory()
    q.sum().backward()
    assert torch.equal(w.grad, torch.ones(3))


def test_pinned_state_ends_with_the_memory():
    p = torch.ones(1000).pin_memory()
    ptr = p.untyped_storage().data_ptr()
    del p
    fresh = [torch.ones(1000) for _ in range(4)]
    for t in fresh:
        if t.untyped_storage().data_ptr() == ptr:
            assert not t.is_pinned()  # same address, new (unpinned) allocation
    assert not any(t.is_pinned() for t in fresh)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(5, pin_memory=True),
        lambda: torch.zeros(2, 3, pin_memory=True),
        lambda: torch.ones(4, dtype=torch.int64, pin_memory=True),
        lambda: torch.full((2,), 7.0, pin_memory=True),
        lambda: torch.randn(3, pin_memory=True),
        lambda: torch.arange(6, pin_memory=True),
        lambda: torch.tensor([1.0, 2.0], pin_memory=True),
        lambda: torch.empty_like(torch.ones(3), pin_memory=True),
        lambda: torch.ones(2).new_zeros(3, pin_memory=True),
    ],
    ids=["empty", "zeros", "ones", "full", "randn", "arange", "tensor", "empty_like", "new_zeros"],
)
def test_factories_with_pin_memory(make):
    t = make()
    assert t.device.type == "cpu" and t.is_pinned()


def test_factories_without_pin_memory_are_not_pinned():
    assert not torch.zeros(3).is_pinned()
    assert not torch.zeros(3, pin_memory=False).is_pinned()


def test_device_tensors_are_not_pinned_and_cannot_be_pinned():
    d = torch.ones(3, device="neuron")
    assert not d.is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        d.pin_memory()
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.zeros(2, device="neuron", pin_memory=True)


def test_non_blocking_copy_from_pinned_memory_to_the_device():
    # The get_batch of a small GPT training script.
    data = torch.randint(0, 50, (200,))
    torch.manual_seed(0)
    ix = torch.randint(len(data) - 9, (4,))
    x = torch.stack([data[i : i + 8] for i in ix])
    y = torch.stack([data[i + 1 : i + 9] for i in ix])
    xd = x.pin_memory().to("neuron", non_blocking=True)
    yd = y.pin_memory().to("neuron", non_blocking=True)
    assert xd.device.type == "neuron" and torch.equal(xd.cpu(), x) and torch.equal(yd.cpu(), y)
    emb = torch.nn.Embedding(50, 8).to("neuron")
    assert emb(xd).shape == (4, 8, 8)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_pin_memory_yields_the_same_batches(num_workers):
    ds = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    kw = dict(batch_size=6, shuffle=True, num_workers=num_workers)
    torch.manual_seed(3)
    plain = list(DataLoader(ds, **kw))
    torch.manual_seed(3)
    pinned = list(DataLoader(ds, pin_memory=True, **kw))
    assert len(plain) == len(pinned) == 4
    for (a, b), (pa, pb) in zip(plain, pinned):
        assert torch.equal(a, pa) and torch.equal(b, pb)
        assert pa.is_pinned() and pb.is_pinned() and not a.is_pinned()
        assert torch.equal(pa.to("neuron", non_blocking=True).cpu(), a)

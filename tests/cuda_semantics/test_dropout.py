"""CUDA's fused dropout for CPU tensors, at the dispatcher: every caller gets it."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from neuron_workbench.cuda_semantics.dropout import fused_dropout_on_cpu


def _saved_mask_dtypes(fn, x):
    dtypes = []

    def pack(t):
        dtypes.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return dtypes


def test_dropout_saves_a_boolean_mask_as_on_cuda():
    x = torch.randn(8, 8, requires_grad=True)
    drop = lambda t: torch.nn.functional.dropout(t, 0.3, training=True)  # noqa: E731
    assert torch.float32 in _saved_mask_dtypes(drop, x)  # the CPU's own path
    with fused_dropout_on_cpu():
        assert _saved_mask_dtypes(drop, x) == [torch.bool]
    assert torch.bool not in _saved_mask_dtypes(drop, x)  # removed on exit


def test_fused_dropout_draws_what_native_dropout_draws_and_backpropagates():
    x = torch.randn(64, requires_grad=True)
    torch.manual_seed(3)
    with fused_dropout_on_cpu():
        out = torch.nn.functional.dropout(x, 0.25, training=True)
    torch.manual_seed(3)
    expected = torch.ops.aten.native_dropout.default(x.detach(), 0.25, True)[0]
    assert torch.equal(out.detach(), expected)
    out.sum().backward()
    assert torch.equal(x.grad, (expected != 0).float() / 0.75)


@pytest.mark.parametrize(
    ("p", "train", "expected"),
    [(0.0, True, "same"), (0.5, False, "same"), (1.0, True, "zeros")],
)
def test_the_edge_cases_are_atens(p, train, expected):
    x = torch.randn(5)
    with fused_dropout_on_cpu():
        out = torch.nn.functional.dropout(x, p, training=train)
    if expected == "same":
        assert out is x
    else:
        assert torch.equal(out, torch.zeros(5))


def test_under_inference_mode_too():
    x = torch.randn(32)
    torch.manual_seed(1)
    with fused_dropout_on_cpu(), torch.inference_mode():
        out = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.manual_seed(1)
    assert torch.equal(out, torch.ops.aten.native_dropout.default(x, 0.5, True)[0])


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoint_recompute_takes_the_same_kernel(reentrant):
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    with fused_dropout_on_cpu():
        checkpoint(block, x, use_reentrant=reentrant).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()

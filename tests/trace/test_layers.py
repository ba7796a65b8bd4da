"""First diverging layer: a 20-module model where module k misbehaves on emulated neuron."""

import pytest
import torch
import torch.nn as nn

from neuron_workbench.backends import get_backend
from neuron_workbench.compare.layer_divergence import compare_layers
from neuron_workbench.run import RunSpec, compile_cell, execute
from neuron_workbench.trace.layers import layer_instrument, summarize


class Float64Sensitive(nn.Module):
    """Adds 1e8 and takes it away again in float64: exact on CPU, float32-rounded on neuron."""

    def forward(self, x):
        y = x.double()
        return ((y + 1e8) - 1e8).float()


class Int64Sensitive(nn.Module):
    """Scales into the int64 range and back: int32 arithmetic on neuron wraps around."""

    def forward(self, x):
        big = (x * 1000).round().long() * 40_000_000
        return (big // 40_000_000).float() / 1000


def make_model(k, culprit):
    layers = []
    for i in range(20):
        if i == k:
            layers.append(culprit())
        elif i % 2 == 0:
            layers.append(nn.Linear(8, 8))
        else:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def traces_for(model_source, k, culprit):
    ns = {"__name__": "__main__", "torch": torch, "make_model": make_model, "culprit": culprit}
    program = compile_cell(
        f"torch.manual_seed(0)\nmodel = make_model({k}, culprit).to('cuda')\n"
        "out = model(torch.randn(4, 8, device='cuda') * 3)"
    )
    spec = RunSpec(program, ns, instruments={"layers": layer_instrument()})
    ref = execute(spec, get_backend("cpu"))
    target = execute(spec, get_backend("neuron"))
    assert ref.ok and target.ok, (ref.error, target.error)
    return ref.extras["layers"], target.extras["layers"]


@pytest.mark.parametrize("k", [1, 7, 12, 19])
@pytest.mark.parametrize("culprit", [Float64Sensitive, Int64Sensitive])
def test_divergence_is_born_at_module_k_and_propagated_after(k, culprit):
    ref, target = traces_for(None, k, culprit)
    result = compare_layers(ref, target)
    assert result.first is not None
    assert result.first.module == str(k) and result.first.born
    by_module = {d.module: d for d in result.layers}
    for i in range(k):
        assert not by_module[str(i)].diverged, i
    for i in range(k + 1, 20):
        layer = by_module[str(i)]
        assert layer.inputs_diverged and not layer.born, i
    # the container holds the culprit, so it is not where the difference was born
    assert by_module["Sequential"].diverged and not by_module["Sequential"].born


def test_identical_runs_have_no_divergence():
    ref, target = traces_for(None, 5, nn.Identity)
    result = compare_layers(ref, target)
    assert result.first is None
    assert len(result.layers) == 21 and not any(d.diverged for d in result.layers)


def test_summary_is_bounded_and_counts_non_finite():
    t = torch.arange(10_000, dtype=torch.float32)
    t[3] = float("nan")
    t[4] = float("inf")
    s = summarize(t)
    assert s.numel == 10_000 and s.nan == 1 and s.inf == 1 and len(s.sample) == 32


def test_in_place_modules_are_summarized_after_they_ran():
    from neuron_workbench.trace.layers import layer_recorder_for

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
    with torch.no_grad(), layer_recorder_for() as recorder:
        model(torch.randn(8, 4) - 5)
    calls = {c.module: c for c in recorder.trace.calls}
    assert calls["0"].output.min < 0  # the linear output, before ReLU changed it in place
    assert calls["1"].output.min == 0  # the same tensor after ReLU


def test_modules_under_inference_mode_are_summarized():
    # A tensor made under torch.inference_mode() has no version counter: --layers ERRORed every
    # evaluation cell using it ("Inference tensors do not track version counter.")
    from neuron_workbench.trace.layers import layer_recorder_for

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
    with torch.inference_mode(), layer_recorder_for() as recorder:
        model(torch.randn(8, 4) - 5)
    calls = {c.module: c for c in recorder.trace.calls}
    assert calls["0"].output.min < 0  # the linear output, before ReLU changed it in place
    assert calls["1"].output.min == 0


class _Float64Gradient(torch.autograd.Function):
    """Identity forward; the backward adds and removes 1e8 in float64 (float32 on neuron)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return ((grad.double() + 1e8) - 1e8).float()


class BackwardSensitive(nn.Module):
    def forward(self, x):
        return _Float64Gradient.apply(x)


def test_gradient_divergence_is_born_where_backward_differs():
    ns = {
        "__name__": "__main__",
        "torch": torch,
        "make_model": make_model,
        "culprit": BackwardSensitive,
    }
    program = compile_cell(
        "torch.manual_seed(0)\nmodel = make_model(9, culprit).to('cuda')\n"
        "loss = model(torch.randn(4, 8, device='cuda')).pow(2).sum()\nloss.backward()"
    )
    spec = RunSpec(program, ns, instruments={"layers": layer_instrument()})
    ref = execute(spec, get_backend("cpu"))
    target = execute(spec, get_backend("neuron"))
    assert ref.ok and target.ok
    result = compare_layers(ref.extras["layers"], target.extras["layers"])
    by_module = {d.module: d for d in result.layers}
    assert not any(d.diverged for d in result.layers)  # the forward pass matches exactly
    assert result.first_backward is not None and result.first_backward.module == "9"
    assert not by_module["9"].grad_diverged and by_module["8"].grad_diverged
    assert not any(by_module[str(i)].grad_diverged for i in range(9, 20))

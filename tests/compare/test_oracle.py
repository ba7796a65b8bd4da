"""The float64 oracle's promoting mode, on the real reference path (cpu standing in for cuda)."""

import math

import torch
from oracle_cells import TRAINING, spec_of

from neuron_workbench.backends import get_backend
from neuron_workbench.compare.oracle import oracle_instrument, rerun
from neuron_workbench.run import execute


def test_the_oracle_sees_the_references_random_draws_and_computes_in_float64():
    spec = spec_of(TRAINING)
    cpu = get_backend("cpu")
    ref = execute(spec, cpu, run_id="ref")
    oracle = rerun(spec, cpu, oracle_instrument(spec))
    assert ref.ok and oracle.ok, oracle.error
    # drawn in float32, then widened: the same numbers (module init, randn, dropout's mask)
    assert oracle.outputs["x"].dtype == torch.float64
    assert torch.equal(oracle.outputs["x"], ref.outputs["x"].double())
    assert torch.equal(oracle.outputs["drop"] == 0, ref.outputs["drop"] == 0)
    weight = oracle.outputs["model"][0].weight
    assert weight.dtype == torch.float64 and weight.grad.dtype == torch.float64
    # .float() is kept in float64; the result is close to the reference but not equal to it
    assert oracle.outputs["loss"].dtype == torch.float64
    assert isinstance(oracle.outputs["value"], float)
    assert oracle.outputs["value"] != ref.outputs["value"]
    assert math.isclose(oracle.outputs["value"], ref.outputs["value"], rel_tol=1e-5)
    # the namespace is as it was, and the default dtype is back
    assert set(spec.namespace) == {"torch"} and torch.get_default_dtype() == torch.float32


def test_widened_inputs_stay_one_object_for_the_model_and_its_optimizer():
    namespace = {"torch": torch}
    setup = spec_of(
        "model = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)",
        namespace,
    )
    cpu = get_backend("cpu")
    from neuron_workbench.run import commit

    commit(namespace, execute(setup, cpu))
    spec = spec_of(
        "loss = model(torch.ones(2, 4)).sum()\nloss.backward()\nopt.step()\nw = model.weight * 1",
        namespace,
    )
    ref = execute(spec, cpu)
    oracle = rerun(spec, cpu, oracle_instrument(spec))
    assert oracle.ok, oracle.error
    assert oracle.outputs["w"].dtype == torch.float64
    # the step moved the widened parameter: the optimizer holds the model's own tensor
    assert torch.allclose(oracle.outputs["w"], ref.outputs["w"].double(), atol=1e-6)
    assert namespace["model"].weight.dtype == torch.float32  # the user's model is untouched


def test_casts_stay_float64_and_keep_the_cells_aliasing():
    source = (
        "x = torch.ones(3)\n"
        "same = x.float()\n"
        "half = x.half()\n"
        "half.add_(1)\n"
        "low = x.to(torch.bfloat16)\n"
        "low.add_(1)\n"
        "y = torch.zeros(3, dtype=torch.float16)\n"
        "y[0] = x[0] / 3\n"
        "aliased = same is x"
    )
    spec = spec_of(source)
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    oracle = rerun(spec, cpu, oracle_instrument(spec))
    assert oracle.ok, oracle.error
    out = oracle.outputs
    assert {out[n].dtype for n in ("x", "half", "low", "y")} == {torch.float64}
    assert out["aliased"] is True and ref.outputs["aliased"] is True
    assert (
        out["x"].tolist() == ref.outputs["x"].tolist() == [1.0, 1.0, 1.0]
    )  # copies, as in the cell
    assert out["y"][0].item() == 1 / 3  # not rounded to float16


def test_a_grad_scaler_step_runs_in_the_oracle():
    # GradScaler's kernels take their scale and found-inf flag in float32 only: the oracle made
    # them float64 and raised "inv_scale must be a float tensor", so every AMP training cell's
    # budget fell back to random rounding.
    namespace = {"torch": torch}
    source = (
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(8, 2).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cuda', init_scale=1024.0, growth_interval=1)\n"
        "for _ in range(2):\n"
        "    with torch.autocast('cuda', dtype=torch.float16):\n"
        "        loss = model(torch.randn(4, 8, device='cuda')).square().mean()\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
        "    opt.zero_grad()\n"
        "scale = scaler.get_scale()\n"
    )
    spec = spec_of(source, namespace)
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    oracle = rerun(spec, cpu, oracle_instrument(spec))
    assert ref.ok and oracle.ok, oracle.error
    # the scale grew after each finite step, in both, and the oracle's weights are float64
    assert ref.outputs["scale"] == oracle.outputs["scale"] == 4096.0
    weight = oracle.outputs["model"].weight
    assert weight.dtype == torch.float64
    assert torch.allclose(weight, ref.outputs["model"].weight.double(), atol=1e-2)
    assert not torch.equal(weight, ref.outputs["model"].weight.double())

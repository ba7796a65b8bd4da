"""Gradients and second moments recorded at every optimizer.step()."""

import torch

from neuron_workbench.trace.optimizer import OptimizerRecorder


def test_gradients_are_read_before_the_step_and_survive_zero_grad():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = torch.optim.AdamW([w], lr=1e-3)
    recorder = OptimizerRecorder()
    with recorder.recording():
        for _ in range(2):
            (w * torch.tensor([0.5, 1e-9, -4.0])).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    steps = recorder.result()
    assert steps.calls == 2
    at = steps.at_step(w)
    assert at.optimizer == "AdamW" and at.step == 1 and at.eps == 1e-8
    assert torch.equal(at.grad, torch.tensor([0.5, 1e-9, -4.0]))
    assert at.second_moment is not None  # the state as the second step began
    assert steps.at_step(torch.nn.Parameter(torch.ones(3))) is None
    assert steps.to_dict() == {
        "calls": 2,
        "optimizers": [{"type": "AdamW", "lr": 1e-3, "eps": 1e-8, "betas": [0.9, 0.999]}],
        "skipped": "",
    }
    # the hook is gone after the context
    opt.step()
    assert recorder.result().calls == 2


def test_first_step_sensitivity_peaks_where_grad_is_near_eps():
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([w], lr=1e-3, eps=1e-8)
    recorder = OptimizerRecorder()
    with recorder.recording():
        (w * torch.tensor([1e-8, 1.0])).sum().backward()
        opt.step()
    at = recorder.result().at_step(w)
    near_eps, large = at.update_sensitivity((0,)), at.update_sensitivity((1,))
    # lr * eps / (|g| + eps)^2, with g = 1e-8 as float32
    assert abs(near_eps - 1e-3 * 1e-8 / (2e-8) ** 2) < 1e-3
    assert large < near_eps * 1e-10


def test_the_runs_function_modes_do_not_see_the_recorders_own_reads():
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    seen = []

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.Adam([w], lr=1e-3)
    recorder = OptimizerRecorder()
    outer, inner = Watching(), Watching()
    with recorder.recording(), outer, inner:
        (w * 3).sum().backward()
        opt.step()  # the second one reads the state (a step tensor, the second moment)
        opt.step()
        seen.clear()
        recorder._pre_step(opt, (), {})
        assert seen == []  # copies, .item() and .numel() of the recorder went past both modes
        assert _get_current_function_mode_stack() == [outer, inner]  # put back, in order
    at = recorder.result().at_step(w)
    assert at.step == 2 and type(at.lr) is float
    assert torch.equal(at.grad, torch.tensor([3.0, 3.0]))


def test_a_parameter_without_a_gradient_has_none_recorded():
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([used, unused], lr=0.1)
    recorder = OptimizerRecorder()
    with recorder.recording():
        (used * 2).sum().backward()
        opt.step()
    steps = recorder.result()
    assert torch.equal(steps.at_step(used).grad, torch.tensor([2.0, 2.0]))
    assert steps.at_step(unused).grad is None and steps.at_step(used).second_moment is None


def test_held_copies_come_back_through_the_fetch_and_the_fetch_does_not_travel():
    import pickle

    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.Adam([w], lr=1e-3)
    recorder = OptimizerRecorder()
    with recorder.recording():
        for _ in range(2):
            (w * torch.tensor([3.0, 4.0])).sum().backward()
            opt.step()
    steps = recorder.result()
    recorded = steps.params[id(w)][1]
    grad, moment = recorded.grad.clone(), recorded.second_moment.clone()
    copies = steps.hold_copies("token-1")
    assert steps.held == "token-1" and steps.params[id(w)][1].grad is None
    asked = []
    steps.fetch_copies_with(lambda token: asked.append(token) or copies)
    travelled = pickle.loads(pickle.dumps(steps))
    assert travelled.held == "token-1" and travelled._fetch is None
    at = steps.at_step(w)
    assert asked == ["token-1"] and not steps.held
    assert torch.equal(at.grad, grad) and torch.equal(at.second_moment, moment)
    steps.at_step(w)
    assert asked == ["token-1"]  # fetched once


def test_an_alias_of_a_parameter_is_judged_by_its_step_and_a_copy_is_not():
    # A checkpoint dict built in the training cell (`model.state_dict()`: detached aliases) held
    # the stepped weights under other paths, which had no record: the weights were judged by their
    # gradients and the same values in the checkpoint failed.
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = OptimizerRecorder()
    with recorder.recording():
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    steps = recorder.result()
    at = steps.at_step(model.weight)
    state = model.state_dict()
    assert steps.at_step(state["weight"]) is at and steps.at_step(model.weight.data) is at
    assert steps.at_step(state["bias"]) is steps.at_step(model.bias) is not None
    # a copy, a part, or another view of the same memory holds other values: no record
    assert steps.at_step(model.weight.detach().clone()) is None
    assert steps.at_step(model.weight[0]) is None and steps.at_step(model.weight.t()) is None
    assert steps.at_step(model.weight.view(-1)) is None and steps.at_step(3.0) is None

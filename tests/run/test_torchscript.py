"""TorchScript functions through the worker transport: scripted again, loaded, or by name."""

import linecache
import sys
import textwrap
import warnings

import pytest
import torch

from neuron_workbench.run import torchscript
from neuron_workbench.run.namespace import isolate
from neuron_workbench.run.transport import dumps, loads

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")

NOTEBOOK_CELL = """
import torch

@torch.jit.script
def fused_gelu(x, scale: float = 0.5):
    return x * scale * (1.0 + torch.erf(x / 1.41421))

@torch.jit.script
def twice_gelu(x):
    return fused_gelu(x) * 2.0
"""


@pytest.fixture
def notebook_cell():
    """A cell's functions as IPython makes them: source only in this process's linecache."""
    filename = "<ipython-input-7-0123456789ab>"
    linecache.cache[filename] = (len(NOTEBOOK_CELL), None, NOTEBOOK_CELL.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(compile(NOTEBOOK_CELL, filename, "exec"), namespace)
    torchscript._REBUILT.clear()
    yield namespace, filename
    linecache.cache.pop(filename, None)
    torchscript._REBUILT.clear()


def _sent_away(value, filename):
    """``value`` after a trip to a process that has not seen the cell's source."""
    message = dumps(value)
    linecache.cache.pop(filename, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the receiver shows no torch.jit deprecation warning
        return loads(message)


def test_a_notebooks_scripted_function_arrives_scripted_with_its_defaults(notebook_cell):
    namespace, filename = notebook_cell
    x = torch.randn(5)
    back = _sent_away(namespace["fused_gelu"], filename)
    assert type(back) is torch.jit.ScriptFunction
    assert back is not namespace["fused_gelu"]
    assert back.code == namespace["fused_gelu"].code
    assert torch.equal(back(x), namespace["fused_gelu"](x))  # the default scale
    assert torch.equal(back(x, 0.25), namespace["fused_gelu"](x, 0.25))


def test_a_scripted_function_calling_another_arrives_whole(notebook_cell):
    namespace, filename = notebook_cell
    x = torch.randn(5)
    back = _sent_away(namespace["twice_gelu"], filename)
    assert torch.equal(back(x), namespace["twice_gelu"](x))


def test_the_receiver_scripts_a_function_once_for_all_requests(notebook_cell, monkeypatch):
    namespace, filename = notebook_cell
    scripted = []
    script = torch.jit.script
    monkeypatch.setattr(torch.jit, "script", lambda fn: scripted.append(fn) or script(fn))
    first = loads(dumps(namespace["fused_gelu"]))
    second = loads(dumps(namespace["fused_gelu"]))
    assert first is second
    assert len(scripted) == 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_a_traced_function_arrives_as_its_loaded_code():
    def clipped(x):
        return x.clamp(max=1.0) if x.sum() > 0 else x * 2.0  # the trace keeps one branch

    traced = torch.jit.trace(clipped, torch.ones(4))
    back = loads(dumps(traced))
    x = -torch.ones(6)
    assert torch.equal(back(x), traced(x))
    assert torch.equal(back(x), x)  # the traced branch, not the Python function's


def test_a_scripted_function_changed_since_scripting_arrives_as_its_loaded_code(notebook_cell):
    """Its Python source now scripts to other code: the sender's compiled code is what runs."""
    namespace, filename = notebook_cell
    changed = NOTEBOOK_CELL.replace("* scale *", "* scale * 3.0 *")
    sent = dumps(namespace["fused_gelu"])
    linecache.cache[filename] = (len(changed), None, changed.splitlines(True), filename)
    back = loads(sent)
    x = torch.randn(4)
    assert torch.equal(back(x, 0.5), namespace["fused_gelu"](x, 0.5))


def test_an_importable_modules_scripted_function_travels_by_name(tmp_path, monkeypatch):
    (tmp_path / "fused_ops.py").write_text(
        textwrap.dedent(
            """
            import torch

            @torch.jit.script
            def bias_gelu(bias, y):
                x = bias + y
                return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import fused_ops
    try:
        assert loads(dumps(fused_ops.bias_gelu)) is fused_ops.bias_gelu
    finally:
        sys.modules.pop("fused_ops", None)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.head = torch.nn.Linear(2, 2)
        self.register_buffer("offset", torch.full((2,), 0.5))

    def forward(self, x):
        return self.head(self.fc(x)) + self.offset


@pytest.fixture(params=["scripted", "traced"])
def scripted_and_optimizer(request):
    """A scripted or traced model (``torch.jit.script(model)``, ``torch.jit.trace(model, x)``)."""
    if request.param == "scripted":
        model = torch.jit.script(_Net())
    else:
        model = torch.jit.trace(_Net(), torch.randn(2, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _connected(model, optimizer):
    weight = model.fc.weight
    return weight.is_leaf and weight is optimizer.param_groups[0]["params"][0]


def test_a_scripted_module_arrives_with_its_optimizers_tensors(scripted_and_optimizer):
    model, optimizer = scripted_and_optimizer
    archive_size = len(torchscript.reduce_script_module(model)[1][0])
    back_model, back_optimizer = loads(dumps((model, optimizer)))
    assert isinstance(back_model, torch.jit.ScriptModule)
    assert _connected(back_model, back_optimizer)
    assert torch.equal(back_model.offset, model.offset)
    x = torch.randn(4, 3)
    assert torch.equal(back_model(x), model(x))
    # the archive holds no copy of the tensors' data (they travel once, as tensors do)
    assert archive_size < 16_000
    big = torch.jit.script(torch.nn.Linear(512, 512))
    assert len(torchscript.reduce_script_module(big)[1][0]) < 16_000
    # the sender's module has its own tensors back after the archive was written
    assert _connected(model, optimizer) and model.fc.weight.device.type == "cpu"


def test_a_run_copies_a_scripted_module_with_its_optimizer(scripted_and_optimizer):
    model, optimizer = scripted_and_optimizer
    copies, shared = isolate({"model": model, "opt": optimizer}, ["model", "opt"])
    assert not shared
    assert copies["model"] is not model
    assert _connected(copies["model"], copies["opt"])
    before = model.fc.weight.detach().clone()
    copies["model"](torch.ones(1, 3)).sum().backward()
    copies["opt"].step()
    assert torch.equal(model.fc.weight, before)  # the notebook's model is untouched
    assert not torch.equal(copies["model"].fc.weight, before)

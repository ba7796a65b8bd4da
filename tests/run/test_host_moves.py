"""A plain cell's moves to the CPU, read from its source, for the next %%neuron cell."""

import torch

from neuron_workbench.run.host_moves import forget_moves_to_host
from neuron_workbench.run.namespace import ORIGIN_ATTR, ResidentObjects, on_accelerator


def _on_device(**values):
    resident = ResidentObjects()
    for value in values.values():
        resident.add(value)
    return dict(values), resident


def test_a_module_moved_by_cpu_or_to_cpu_is_no_longer_on_the_device():
    for source in (
        "model.cpu()",
        "model = model.to('cpu')",
        "model.to(torch.device('cpu'))",
        "model.to(device='cpu:0', dtype=torch.float32)",
        "model.to(where)",
    ):
        namespace, resident = _on_device(model=torch.nn.Linear(2, 2))
        namespace["where"] = torch.device("cpu")
        assert forget_moves_to_host(source, namespace, resident) == ["model"], source
        assert namespace["model"] not in resident


def test_what_names_no_cpu_leaves_the_module_on_the_device():
    for source in (
        "model.to(torch.float16)",
        "model.to(where)",  # where names cuda
        "model.half()",
        "other.cpu()",
        "model.cpu(",  # no Python
        "model.layer.cpu()",  # part of it: the source does not say which tensors
    ):
        namespace, resident = _on_device(model=torch.nn.Linear(2, 2))
        namespace["where"] = "cuda"
        assert forget_moves_to_host(source, namespace, resident) == [], source
        assert namespace["model"] in resident


def test_a_tensor_keeps_its_place_unless_its_name_is_rebound():
    x = torch.ones(3)
    vars(x)[ORIGIN_ATTR] = "cuda"  # as a worker sends a device tensor back
    namespace, resident = {"x": x}, ResidentObjects()
    assert forget_moves_to_host("x.cpu()\nprint(x.cpu())", namespace, resident) == []
    assert on_accelerator(x)
    namespace["b"] = x  # another holder of the tensor: on a GPU it keeps it on the device
    assert forget_moves_to_host("x = x.cpu()", namespace, resident) == ["x"]
    assert not on_accelerator(namespace["x"]) and on_accelerator(namespace["b"])
    namespace["x"] = x
    assert forget_moves_to_host("x = x.cpu().float()", namespace, resident) == ["x"]
    assert namespace["x"] is not x and not on_accelerator(namespace["x"])


def test_a_tensor_bound_to_another_name_gives_that_name_a_cpu_copy():
    x = torch.ones(3, requires_grad=True)
    namespace, resident = _on_device(x=x)
    namespace["y"] = x  # what `y = x.cpu()` leaves in a kernel holding cuda's stand-in
    assert forget_moves_to_host("y = x.cpu()", namespace, resident) == ["y"]
    y = namespace["y"]
    assert y is not x and x in resident and not on_accelerator(y)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    y.sum().backward()  # linked to x by autograd, as a GPU's copy is
    assert torch.equal(x.grad, torch.ones(3))


def test_an_object_that_moved_into_something_new_stays_on_the_device():
    class Batch:
        def to(self, device):
            return Batch()

    batch = Batch()
    namespace, resident = _on_device(batch=batch)
    namespace["moved"] = batch.to("cpu")
    assert forget_moves_to_host("moved = batch.to('cpu')", namespace, resident) == []
    assert batch in resident


def test_nothing_on_the_device_nothing_to_do():
    namespace, resident = {"model": torch.nn.Linear(2, 2)}, ResidentObjects()
    assert forget_moves_to_host("model.cpu()", namespace, resident) == []


def test_a_move_back_to_the_device_or_code_that_only_defines_moves_nothing():
    cuda_stand_in = torch.device("cpu")  # what a %%neuron cell leaves for torch.device("cuda")
    for source in (
        "model.eval()\nmodel.to(device)",  # the device the notebook made for cuda
        "model.cpu()\nsave(model)\nmodel.to(device)",  # the last move wins
        "model.cpu()\nmodel.cuda()",
        "def save_cpu_copy():\n    model.cpu()",
        "class Saver:\n    def save(self):\n        model.cpu()",
        "f = lambda: model.cpu()",
    ):
        namespace, resident = _on_device(model=torch.nn.Linear(2, 2), device=cuda_stand_in)
        assert forget_moves_to_host(source, namespace, resident) == [], source
        assert namespace["model"] in resident
    namespace, resident = _on_device(model=torch.nn.Linear(2, 2))
    source = "model.to(device)\nif True:\n    model.cpu()"
    assert forget_moves_to_host(source, namespace, resident) == ["model"]

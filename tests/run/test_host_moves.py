"""A plain cell's moves to the CPU and to the device, read from its source, for the next %%neuron cell."""

import copy

import torch

from neuron_workbench.run.host_moves import follow_plain_cell_moves, places_before
from neuron_workbench.run.namespace import (
    ORIGIN_ATTR,
    ResidentObjects,
    mark_on_accelerator,
    on_accelerator,
)


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
        assert follow_plain_cell_moves(source, namespace, resident) == ["model"], source
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
        assert follow_plain_cell_moves(source, namespace, resident) == [], source
        assert namespace["model"] in resident


def test_a_tensor_keeps_its_place_unless_its_name_is_rebound():
    x = torch.ones(3)
    vars(x)[ORIGIN_ATTR] = "cuda"  # as a worker sends a device tensor back
    namespace, resident = {"x": x}, ResidentObjects()
    assert follow_plain_cell_moves("x.cpu()\nprint(x.cpu())", namespace, resident) == []
    assert on_accelerator(x)
    namespace["b"] = x  # another holder of the tensor: on a GPU it keeps it on the device
    assert follow_plain_cell_moves("x = x.cpu()", namespace, resident) == ["x"]
    assert not on_accelerator(namespace["x"]) and on_accelerator(namespace["b"])
    namespace["x"] = x
    assert follow_plain_cell_moves("x = x.cpu().float()", namespace, resident) == ["x"]
    assert namespace["x"] is not x and not on_accelerator(namespace["x"])


def test_a_tensor_bound_to_another_name_gives_that_name_a_cpu_copy():
    x = torch.ones(3, requires_grad=True)
    namespace, resident = _on_device(x=x)
    namespace["y"] = x  # what `y = x.cpu()` leaves in a kernel holding cuda's stand-in
    assert follow_plain_cell_moves("y = x.cpu()", namespace, resident) == ["y"]
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
    assert follow_plain_cell_moves("moved = batch.to('cpu')", namespace, resident) == []
    assert batch in resident


def test_nothing_on_the_device_nothing_to_do():
    namespace, resident = {"model": torch.nn.Linear(2, 2)}, ResidentObjects()
    assert follow_plain_cell_moves("model.cpu()", namespace, resident) == []


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
        assert follow_plain_cell_moves(source, namespace, resident) == [], source
        assert namespace["model"] in resident
    namespace, resident = _on_device(model=torch.nn.Linear(2, 2))
    source = "model.to(device)\nif True:\n    model.cpu()"
    assert follow_plain_cell_moves(source, namespace, resident) == ["model"]


#: What a %%neuron cell leaves for torch.device("cuda"): the cpu stand-in, remembered as cuda.
CUDA_STAND_IN = torch.device("cpu")


def _after(source, **values):
    """Run the plain cell ``source`` over ``values`` (the stand-in ``device`` is on the device)."""
    resident = ResidentObjects()
    namespace = {"torch": torch, "copy": copy, "device": CUDA_STAND_IN, **values}
    resident.add(CUDA_STAND_IN)
    for value in values.values():
        if getattr(value, "on_device", False):
            resident.add(value)
    values.clear()  # the namespace holds them, as a notebook's does: nothing else
    value = None
    exec(source, namespace)
    return follow_plain_cell_moves(source, namespace, resident), namespace, resident


class _OnDevice(torch.nn.Linear):
    on_device = True  # put in the resident set by _after, as a %%neuron cell would


def test_a_module_moved_or_made_on_the_device_in_a_plain_cell_is_on_it():
    for source, name in (
        ("model.to(device)", "model"),
        ("model = model.to(device)", "model"),
        ("model.eval()\nmodel.to(device=device, dtype=torch.float32)", "model"),
        ("fresh = torch.nn.Linear(2, 2).to(device)", "fresh"),
        ("fresh = torch.nn.Linear(2, 2).to(device).eval()", "fresh"),
        ("fresh = torch.nn.Linear(2, 2, device=device)", "fresh"),
        ("from torch import nn\nfresh = nn.Linear(2, 2, device=device)", "fresh"),
        ("with torch.no_grad():\n    fresh = torch.nn.Linear(2, 2).to(device)", "fresh"),
    ):
        placed, namespace, resident = _after(source, model=torch.nn.Linear(2, 2))
        assert placed == [name], source
        assert namespace[name] in resident


def test_a_deep_copy_of_what_is_on_the_device_is_on_it_when_it_is_copied():
    placed, namespace, resident = _after(
        "ema = copy.deepcopy(model).eval()\nbest = copy.deepcopy(model.state_dict())",
        model=_OnDevice(2, 2),
    )
    assert placed == ["ema", "best"]
    assert namespace["ema"] in resident and namespace["best"] in resident
    placed, namespace, resident = _after("ema = copy.deepcopy(model)", model=torch.nn.Linear(2, 2))
    assert placed == [] and namespace["ema"] not in resident
    # in the cell's order: a copy of what it moved there, not of what it moved off
    placed, namespace, resident = _after(
        "model.to(device)\nema = copy.deepcopy(model)", model=torch.nn.Linear(2, 2)
    )
    assert placed == ["model", "ema"]
    placed, namespace, resident = _after(
        "model.cpu()\nsnap = copy.deepcopy(model)", model=_OnDevice(2, 2)
    )
    assert placed == ["model"]  # moved off the device; the copy of it with it
    assert namespace["snap"] not in resident and namespace["model"] not in resident


def test_a_tensor_made_on_the_device_is_on_it_and_a_moved_one_shared_is_a_copy():
    placed, namespace, resident = _after(
        "x = torch.randn(3, device=device)\nw = torch.zeros(2, device='cpu')\nz = torch.ones(2)"
    )
    assert placed == ["x"] and namespace["x"] in resident
    # what PyTorch has just made and moved there is new: on the device whoever holds it
    placed, namespace, resident = _after(
        "w = torch.zeros(4).float().to(device).requires_grad_()\n"
        "opt = torch.optim.SGD([w], lr=0.1)\nscale = torch.ones(2).to(device)\n"
        "holder = torch.nn.Module()\nholder.scale = scale"
    )
    assert placed == ["w", "scale"] and namespace["w"] in resident and namespace["w"].is_leaf
    assert namespace["holder"].scale is namespace["scale"]
    # a tensor the notebook already had: on a GPU a copy for the new name, which the stand-in's
    # move did not give; the name holding nothing else is on the device, else it stays as it was
    placed, namespace, resident = _after(
        "x = x.to(device)\na = b = c.to(device)", x=torch.ones(3), c=torch.ones(1)
    )
    assert placed == ["x"] and namespace["x"] in resident and namespace["a"] not in resident
    for source in (
        "y = x.to(device)",
        "x = x.to(device)\nkeep = [x]",
        "data = [x]\nx = x.to(device)",  # a dataset holds it
        "_ = x\nx = x.to(device)",  # IPython's output history, after a cell that showed x
    ):
        placed, namespace, resident = _after(source, x=torch.ones(3))
        assert placed == [], source
        assert not any(v in resident for k, v in namespace.items() if k != "device"), source


def test_containers_of_what_is_on_the_device_are_on_it():
    placed, namespace, resident = _after(
        "batch = {k: v.to(device) for k, v in batch.items()}\n"
        "a, b = a.to(device), b\n"
        "pair = [torch.ones(1, device=device), 3]\n"
        "mixed = [torch.ones(1).to(device), b]",
        batch={"ids": torch.ones(2), "mask": torch.zeros(2)},
        a=torch.ones(1),
        b=torch.ones(1),
    )
    assert placed == ["batch", "a", "pair"] and namespace["batch"] in resident
    assert namespace["b"] not in resident and namespace["mixed"] not in resident
    # a container of tensors another name holds: not for this name only (see above)
    placed, namespace, resident = _after("moved = {'x': x.to(device)}", x=torch.ones(2))
    assert placed == [] and namespace["moved"] not in resident


def test_only_the_last_binding_and_code_that_ran_count():
    for source in (
        "x = torch.randn(3, device=device)\nx = torch.ones(3)",
        "x = torch.randn(3, device=device)\nfor x in [torch.ones(1)]:\n    pass",
        "x = torch.randn(3, device=device)\nx = x.cpu()",
        "fresh = torch.nn.Linear(2, 2).to(device)\nfresh.cpu()",
        "if False:\n    x = torch.randn(3, device=device)",
        "if False:\n    model.to(device)",
        "for _ in []:\n    x = torch.randn(3, device=device)",
        "flag = False\nflag and (x := torch.randn(3, device=device))",
        "x = torch.randn(3, device=device) if False else x",
        "if False:\n    model.to(device)\nema = copy.deepcopy(model)",
        "try:\n    x = torch.randn(3, device=device)\nexcept RuntimeError:\n    pass",
        "def make():\n    return torch.nn.Linear(2, 2).to(device)",
        "f = lambda: torch.randn(3, device=device)",
        "fresh = torch.nn.ReLU().to(device)",  # nothing in it to put on the device
        "d = torch.device('cpu')\nx = torch.randn(3, device=d)",
    ):
        placed, namespace, resident = _after(source, x=torch.zeros(1), model=torch.nn.Linear(2, 2))
        assert placed == [], source
        assert not any(
            value in resident
            for key, value in namespace.items()
            if key not in ("device", "__builtins__")
        ), source


def test_what_keeps_a_tensor_where_the_cell_put_it():
    for source in (
        "z = torch.randn(3, device=device)\nz += 1",
        "z = torch.randn(3, device=device)\nn = [z for z in range(2)]",
        "(z := torch.randn(3, device=device))",
    ):
        placed, namespace, resident = _after(source)
        assert placed == ["z"], source
        assert namespace["z"] in resident


def test_what_a_notebook_function_makes_is_not_guessed():
    source = (
        "def evaluate(model, device):\n"
        "    return model(torch.ones(1, 2, device=device)).argmax(1).cpu()\n"
        "preds = evaluate(model, device)\n"
        "preds2 = evaluate(model, device=device)"
    )
    placed, namespace, resident = _after(source, model=_OnDevice(2, 2))
    assert placed == [] and namespace["preds"] not in resident


def test_moves_inside_comprehensions_and_under_other_names_count():
    # the cell's model moved off in a comprehension's element (its loop variable is its own)
    placed, namespace, resident = _after(
        "outs = [model.cpu()(torch.ones(1, 2)) for _ in range(2)]", model=_OnDevice(2, 2)
    )
    assert placed == ["model"] and namespace["model"] not in resident
    placed, namespace, resident = _after("n = [x.cpu() for x in range(0)]", x=_OnDevice(2, 2))
    assert placed == [] and namespace["x"] in resident
    # a module moves in place whatever name its move is bound to
    placed, namespace, resident = _after(
        "snap = model.cpu()\nema = copy.deepcopy(model)", model=_OnDevice(2, 2)
    )
    assert placed == ["model"] and namespace["ema"] not in resident
    placed, namespace, resident = _after(
        "w2 = model.to(device).weight", model=torch.nn.Linear(2, 2)
    )
    assert placed == ["model"] and namespace["w2"] is namespace["model"].weight


def test_a_pytorch_call_that_may_give_its_input_back_moves_it():
    for source in (
        "y = torch.as_tensor(x, device=device)",
        "y = torch.as_tensor(x).to(device)",
        "y = torch.relu_(x).to(device)",
    ):
        placed, namespace, resident = _after(source, x=torch.ones(3))
        assert placed == [] and namespace["x"] not in resident, source
    placed, namespace, resident = _after("x = torch.as_tensor(x, device=device)", x=torch.ones(3))
    assert placed == ["x"]  # nothing else holds it


def test_an_augmented_assignment_of_what_is_no_tensor_binds_it_again():
    placed, namespace, resident = _after("t = (torch.zeros(2).to(device),)\nt += (torch.ones(1),)")
    assert placed == [] and namespace["t"] not in resident


def test_a_module_moves_its_submodules_and_the_names_bound_to_them():
    placed, namespace, resident = _after(
        "model = torch.nn.Sequential(backbone, torch.nn.Linear(2, 2)).to(device)",
        backbone=torch.nn.Linear(2, 2),
        other=torch.nn.Linear(2, 2),
    )
    assert placed == ["model", "backbone"]
    assert namespace["backbone"] in resident and namespace["other"] not in resident


def _computed_after(source, **values):
    """Run the plain cell ``source`` over ``values`` as the magic does: places read before it."""
    resident = ResidentObjects()
    namespace = {"torch": torch, "F": torch.nn.functional, "device": CUDA_STAND_IN, **values}
    resident.add(CUDA_STAND_IN)
    for name in ("x", "model", "batch"):
        if name in values:
            resident.add(values[name])  # put there by a %%neuron cell
    values.clear()
    before = places_before(source, namespace, resident)
    exec(source, namespace)
    placed = follow_plain_cell_moves(source, namespace, resident, before)
    return placed, namespace, resident


def test_a_tensor_computed_from_device_tensors_is_on_the_device():
    for source, name in (
        ("y = x * 2", "y"),
        ("y = -x", "y"),
        ("y = x.clone().float()", "y"),
        ("y = x[1:] @ model.weight.T", "y"),
        ("y = torch.cat([x, torch.ones(1, 4)])", "y"),
        ("y = F.softmax(x, dim=-1)", "y"),
        ("y = torch.randn_like(x)", "y"),
        ("y = torch.zeros(3, device=x.device)", "y"),
        ("y = model(x).argmax(-1)", "y"),
        ("y = batch['ids'] + 1", "y"),
        ("y = torch.ones(2, 4).to(x)", "y"),
        ("x = x - x.mean(0)", "x"),  # x as it was before the cell
        ("z = x * 2\ny = z + 1", "y"),  # through a name the cell computed
        # a module of PyTorch's with no parameters, made here: where its input is
        ("act = torch.nn.Softmax(dim=-1)\ny = act(model(x))", "y"),
        ("y = model(x).to(x.device)", "y"),
    ):
        placed, namespace, resident = _computed_after(
            source,
            x=torch.ones(2, 4),
            model=torch.nn.Linear(4, 3),
            batch={"ids": torch.ones(2, dtype=torch.long)},
        )
        assert name in placed and namespace[name] in resident, source
    placed, namespace, resident = _computed_after("a, b = x.chunk(2)", x=torch.ones(2, 4))
    assert placed == ["a", "b"] and namespace["a"] in resident and namespace["b"] in resident


def test_a_container_of_tensors_computed_on_the_device_is_on_it():
    # On a GPU `pair = (x * 2, y + 1)` holds two cuda tensors; placed nothing, the next
    # %%neuron cell's target met CPU tensors next to its device's.
    for source in (
        "y = (x * 2, x.sum(0))",
        "y = [x * 2]",
        "y = {'a': x * 2, 'b': x, 'n': 3}",  # a device tensor itself, a constant
        "y = [x[i] * 2 for i in range(2)]",  # i is the comprehension's, x the notebook's
        "y = {k: x * 2 for k in 'ab'}",
        "y = ((x + 1, x - 1), [x.mean()])",
        "y = [x * 2]\nx = torch.zeros(3)",  # x as it was when y was computed
        "x = (x * 2, x + 1)",
    ):
        placed, namespace, resident = _computed_after(source, x=torch.ones(2, 4))
        assert "y" in placed or "x" in placed, source
        name = "y" if "y" in placed else "x"
        assert namespace[name] in resident and resident.on_device(namespace[name]), source


def test_a_tensor_dataset_of_tensors_computed_on_the_device_is_on_it():
    from torch.utils.data import TensorDataset

    placed, namespace, resident = _computed_after(
        "ds = TensorDataset(x * 2, x.sum(1))", x=torch.ones(2, 4), TensorDataset=TensorDataset
    )
    assert placed == ["ds"] and namespace["ds"] in resident
    for source in (
        "ds = TensorDataset(x * 2, cpu_tensor)",  # a CPU tensor in it too
        "ds = TensorDataset(cpu_tensor.to(device))",  # moved: cpu_tensor's name keeps it
    ):
        placed, namespace, resident = _computed_after(
            source, x=torch.ones(2, 4), cpu_tensor=torch.ones(2), TensorDataset=TensorDataset
        )
        assert placed == [] and namespace["ds"] not in resident, source


def test_what_a_gpu_has_on_the_cpu_or_the_source_cannot_place_stays_where_it_is():
    def helper(t):
        return t.cpu() * 2

    for source in (
        "y = x.cpu() * 2",  # moved to the host first
        "y = torch.zeros(x.shape)",  # a factory given no device
        "y = torch.arange(x.shape[0])",
        "y = torch.tensor(x.tolist())",
        "y = x.mean().item()",  # no tensor
        "y = helper(x)",  # a function of the notebook's may return anything
        "y = items[0] * 2",  # what a list holds is not looked through
        "y = [x * 2, cpu_tensor]",  # a container holding a CPU tensor too
        "y = [t * 2 for t in items]",  # reads the comprehension's own variable
        "y = [items[0] * 2]",
        "if flag:\n    y = x * 2",  # may not have run
        "for _ in range(2):\n    y = x * 2",
        "y = cpu_tensor + 1",
        "x = helper(x)\ny = x * 2",  # x computed by a function of the notebook's
    ):
        placed, namespace, resident = _computed_after(
            source,
            x=torch.ones(2, 4),
            helper=helper,
            items=[torch.ones(2)],
            flag=True,
            cpu_tensor=torch.ones(3),
        )
        assert "y" not in placed and namespace["y"] not in resident, source


def test_without_the_places_before_a_name_the_cell_binds_places_nothing_it_computes():
    resident = ResidentObjects()
    x = torch.ones(3)
    resident.add(x)
    namespace = {"x": x}
    exec("y = x * 2\nx = x + 1", namespace)
    # x is bound by the cell: its value now is not the one `y = x * 2` read
    assert follow_plain_cell_moves("y = x * 2\nx = x + 1", namespace, resident) == []


def test_the_first_batch_of_a_loader_over_a_dataset_on_the_device_is_on_it():
    from torch.utils.data import DataLoader, TensorDataset

    def loaded(source, dataset, **options):
        return _computed_after(
            source,
            x=torch.ones(4, 2),
            loader=DataLoader(dataset, batch_size=2, **options),
            DataLoader=DataLoader,
            TensorDataset=TensorDataset,
        )

    on_device = TensorDataset(torch.ones(4, 2))
    for source in ("xb, = next(iter(loader))", "batch = next(iter(loader))"):
        placed, _, _ = loaded(source, on_device)
        assert placed == [], source  # the dataset is not on the device
    # the dataset a %%neuron cell (here: this cell) put on the device
    placed, namespace, _ = _computed_after(
        "ds = TensorDataset(x * 2)\nloader = DataLoader(ds, batch_size=2)\n"
        "xb, = next(iter(loader))\nbatch = next(iter(loader))",
        x=torch.ones(4, 2),
        DataLoader=DataLoader,
        TensorDataset=TensorDataset,
    )
    assert placed == ["ds", "xb", "batch"]
    placed, namespace, resident = _computed_after(  # a dataset bound to no name
        "loader = DataLoader(TensorDataset(x * 2), batch_size=2)\nbatch = next(iter(loader))",
        x=torch.ones(4, 2),
        DataLoader=DataLoader,
        TensorDataset=TensorDataset,
    )
    assert placed == ["batch"] and namespace["loader"].dataset in resident
    for source in (
        # the stand-in's `x.cpu()` is x itself: on a GPU the dataset holds a CPU copy
        "ds = TensorDataset(x.cpu())\nloader = DataLoader(ds, batch_size=2)\n"
        "batch = next(iter(loader))",
        "ds = TensorDataset(x * 2)\nloader = DataLoader(ds, batch_size=2, num_workers=1)\n"
        "batch = next(iter(loader))",
        "ds = TensorDataset(x * 2)\nloader = DataLoader(ds, collate_fn=lambda b: b)\n"
        "batch = next(iter(loader))",
        # which loader `batch` came from is not known
        "ds = TensorDataset(x * 2)\nloader = DataLoader(ds)\nbatch = next(iter(loader))\n"
        "loader = DataLoader(TensorDataset(x.cpu()))",
    ):
        placed, namespace, _ = _computed_after(
            source, x=torch.ones(4, 2), DataLoader=DataLoader, TensorDataset=TensorDataset
        )
        assert "batch" not in placed, source


def test_a_list_or_dict_the_cell_makes_and_fills_in_a_loop_is_on_the_device():
    # preds = []; for b in batches: preds.append(model(b)): every item a loop put there
    def after(source, **values):
        batches = [torch.ones(2, 4) for _ in range(3)]
        for batch in batches:
            mark_on_accelerator(batch)
        return _computed_after(
            source, x=torch.ones(2, 4), model=torch.nn.Linear(4, 3), batches=batches, **values
        )

    for source in (
        "preds = []\nfor b in batches:\n    preds.append(model(b))",
        "preds = []\nfor b in batches:\n    if b.sum() > 0:\n        preds.append(model(b) * 2)",
        "preds = []\ni = 0\nwhile i < 2:\n    preds.append(model(x)[i])\n    i += 1",
        "preds = {}\nfor i, b in enumerate(batches):\n    preds[i] = model(b).argmax(-1)",
        "preds = {}\nfor i, b in enumerate(batches):\n    preds[i] = model(b)\npreds['x'] = x + 1",
        "preds, labels = [], []\nfor b in batches:\n    preds.append(model(b))",
        "preds = list()\nfor b in batches:\n    preds.append(F.softmax(model(b), -1))",
        "preds = []\nfor b in batches:\n    preds.append(model(b).type(torch.float16))",
        "preds = []\nfor b in batches:\n    preds.append(model(b).to(x.device))",
    ):
        placed, namespace, _ = after(source)
        held = namespace["preds"]
        items = list(held.values()) if isinstance(held, dict) else held
        assert "preds" in placed and all(on_accelerator(t) for t in items), source
    for source in (
        "for b in batches:\n    preds.append(model(b))",  # a list the cell did not make
        "preds = []\nfor b in batches:\n    preds.append(b.cpu() * 2)",
        "preds = []\nfor b in batches:\n    preds.append(model(b))\n    preds.append(cpu)",
        # the next pass appends what this one bound: on the CPU from the second pass on
        "h = x * 2\npreds = []\nfor b in batches:\n    preds.append(h * 2)\n    h = h.cpu()",
        "preds = []\nother = preds\nfor b in batches:\n    preds.append(model(b))\n"
        "    other.append(cpu)",
        "preds = {}\nfor i, b in enumerate(batches):\n    preds[i] = model(b)\npreds['c'] = cpu",
        "for _ in range(2):\n    preds = []\n    preds.append(model(x))",
        # filled where the visit does not look: a function or lambda the cell defines, a
        # comprehension's side effect, another name for it, code run from a string
        "preds = []\ndef collect(t):\n    preds.append(t.cpu())\nfor b in batches:\n"
        "    preds.append(model(b))\n    collect(model(b))",
        "preds = []\nadd = lambda: preds.append(cpu)\nfor b in batches:\n    preds.append(model(b))\n"
        "add()",
        "preds = []\n[preds.append(cpu) for _ in range(1)]\nfor b in batches:\n"
        "    preds.append(model(b))",
        "preds = []\nother, n = preds, 0\nfor b in batches:\n    preds.append(model(b))\n"
        "other.append(cpu)",
        "preds = []\nfor b in batches:\n    preds.append(model(b))\nexec('preds.append(cpu)')",
        # the next pass calls a model the last one moved to the CPU
        "preds = []\nfor b in batches:\n    preds.append(model(b))\n    model.cpu()",
        # what .type() gives, and .to() another tensor's device, is where that says
        "preds = []\nfor b in batches:\n    preds.append(model(b).type(torch.FloatTensor))",
        "preds = []\nfor b in batches:\n    preds.append(model(b).to(cpu.device))",
    ):
        placed, namespace, _ = after(source, preds=[], cpu=torch.ones(3))
        held = namespace["preds"]
        items = list(held.values()) if isinstance(held, dict) else held
        assert not any(on_accelerator(t) for t in items), source


def test_a_tensor_computed_on_the_device_into_a_list_or_dict_is_on_it():
    # outs.append(x * 2), results["a"] = model(x): on a GPU the container holds a cuda tensor
    def after(source, **values):
        return _computed_after(source, x=torch.ones(2, 4), model=torch.nn.Linear(4, 3), **values)

    placed, namespace, _ = after(
        "outs = []\nouts.append(x * 2)\nouts.append(x - 1)\nprint(len(outs))\n"
        "results = {}\nresults['a'] = model(x)\nresults['b'] = cpu_tensor + 1\n"
        "results['b'] = x + 1\nall_outs = torch.cat(outs)",
        cpu_tensor=torch.ones(3),
    )
    assert "outs" in placed and "results" in placed
    outs, results = namespace["outs"], namespace["results"]
    assert all(on_accelerator(t) for t in [*outs, *results.values()])
    for source in (
        "outs.append(x * 2)\nouts.insert(0, cpu_tensor)",  # which item is which: not known
        "outs.append(x * 2)\nhelper(outs)",  # a function of the notebook's may change it
        "outs.append(cpu_tensor * 2)",
        "if flag:\n    outs.append(x * 2)",
        "for _ in range(2):\n    outs.append(x * 2)",
        "outs.append(x * 2)\nouts[-1] = cpu_tensor",
        "results[key] = x * 2",  # a key the source does not show
        # a container holding a CPU tensor too: the next cell would move it as a whole
        "outs.append(cpu_tensor)\nouts.append(x * 2)",
        "results['a'] = x * 2\nresults['n'] = cpu_tensor",
    ):
        placed, namespace, _ = after(
            source,
            outs=[],
            results={},
            cpu_tensor=torch.ones(3),
            helper=lambda items: items.reverse(),
            flag=True,
            key="a",
        )
        held = [*namespace["outs"], *namespace["results"].values()]
        assert not any(on_accelerator(t) for t in held), source

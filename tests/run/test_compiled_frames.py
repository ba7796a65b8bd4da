"""Dynamo compiles the user's frames, never the workbench's own, and traces none of the run's."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from neuron_workbench.backends import get_backend
from neuron_workbench.run.compiled_frames import keep_dynamo_out_of_the_workbench
from neuron_workbench.run.remap import cuda_remapped_to
from neuron_workbench.testing import run_cell


class _Counted(TorchFunctionMode):
    """A mode of the test's own: its frames are not the workbench's, so Dynamo may compile them."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _graphs_compiled(mode_factory):
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model.compile(backend="eager")  # torch's own module: Dynamo skips its _call_impl
    with mode_factory():
        model(torch.ones(2, 4))
    compiled = dict(counters["stats"]).get("unique_graphs", 0)
    torch._dynamo.reset()
    return compiled


def test_the_remaps_frames_are_not_compiled_where_another_modes_are():
    import torch._dynamo  # noqa: F401 - as any compiling program has

    keep_dynamo_out_of_the_workbench()
    # the control: a mode outside the workbench has its __torch_function__ compiled, a graph per call
    assert _graphs_compiled(_Counted) > 0
    # the remap (the same mode kind, in the workbench) has none compiled
    assert _graphs_compiled(lambda: cuda_remapped_to(get_backend("cpu"))) == 0


def test_the_names_dynamo_puts_into_a_namespace_are_told_from_the_notebooks():
    from neuron_workbench.run.compiled_frames import compiled_global

    for name in ("__compiled_fn_1_ab", "__resume_at_30_2", "___stack0", "_140270807021296_c18"):
        assert compiled_global(name), name
    for name in ("model", "_", "_7", "_i7", "__name__", "_hidden_c"):
        assert not compiled_global(name), name


#: A compiled training step whose graph breaks (``loss.backward()``, the formatted loss) a plain
#: cell has too; it runs as it is in a plain cell (on the CPU) and under ``%%neuron``.
TRAINING_STEP = (
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Linear(4, 1).to(device)\n"
    "x, y = torch.randn(8, 4, device=device), torch.randn(8, 1, device=device)\n"
    "@torch.compile\n"
    "def step(x, y):\n"
    "    loss = F.mse_loss(model(x), y)\n"
    "    loss.backward()\n"
    "    print(f'loss {loss:.4f}')\n"
    "    return loss\n"
    "loss = step(x, y)\n"
)


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_compiled_training_step_breaks_its_graphs_where_and_as_often_as_a_plain_cell(ip):
    # Dynamo traced the run's remap mode: loss.backward() broke the graph in torch/_tensor.py:623
    # (the mode's call of Tensor.backward's Python), and the formatted loss broke it once more
    # (in the run's scalar record) than in the plain cell
    import torch._dynamo

    from neuron_workbench.trace.compile import compile_instrument

    run_cell(ip, "import torch\nimport torch.nn.functional as F")
    with compile_instrument("<no cell>")(None) as plain:
        run_cell(ip, TRAINING_STEP)
    plain_breaks = [(b["line"], b["reason"]) for b in plain.graph_breaks]
    # the plain cell's own count and sites: backward at line 8, the print at 9
    assert [line for line, _ in plain_breaks][:1] == [8], plain.graph_breaks
    assert len(plain_breaks) == 2, plain.graph_breaks
    torch._dynamo.reset()

    run_cell(ip, "%%neuron -o r\n" + TRAINING_STEP)
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    data = report.to_dict()
    for role in ("ref", "target"):
        record = data[role]["compile"]
        # the same breaks at the same lines of the cell (one down: the %%neuron line)
        breaks = [(b["file"], b["line"] - 1, b["reason"]) for b in record["graph_breaks"]]
        assert breaks == [("cell", line, reason) for line, reason in plain_breaks], (role, record)
        assert len(record["graphs"]) == len(plain.graphs), (role, record)


@pytest.mark.usefixtures("fresh_dynamo")
def test_torchs_item_graph_break_warning_names_the_cells_line_not_the_workbench(ip):
    # the warning's "user code" listed neuron_workbench/run/remap.py and run/measurements.py
    run_cell(ip, "import logging\nimport torch")
    run_cell(
        ip,
        "%%neuron -o r\n"
        "warned = []\n"
        "def keep(record):\n"
        "    warned.append(record.getMessage())\n"
        "    return True\n"
        "log = logging.getLogger('torch._dynamo.variables.tensor')\n"
        "log.addFilter(keep)\n"
        "# torch warns once per process: each run's process warns here\n"
        "torch._dynamo.variables.tensor.TensorVariable._warn_capture_scalar_outputs.cache_clear()\n"
        "@torch.compile\n"
        "def f(x):\n"
        "    y = x * 2\n"
        "    s = y.sum().item()\n"
        "    return y + s\n"
        "out = f(torch.ones(3, device='cuda'))\n"
        "log.removeFilter(keep)\n"
        "del log, keep\n"
        "warned = [w for w in warned if 'Graph break from `Tensor.item()`' in w]",
    )
    report = ip.user_ns["r"]
    # the reference's warning (the kept run's list) and the target's (its stderr) alike
    (reference,) = ip.user_ns["warned"]
    target = report.target.stderr.partition("Graph break from `Tensor.item()`")[2]
    for role, warning in (("ref", reference), ("target", target)):
        user_code = warning.partition("from user code at:")[2]
        assert "line 13, in f" in user_code and "s = y.sum().item()" in user_code, (role, warning)
        assert "neuron_workbench" not in user_code, (role, warning)
    assert report.verdict == "PASS", report.summary()


def test_a_compiled_frame_that_enters_a_mode_leaves_the_run_its_remap():
    # Dynamo's compiled code sets the whole mode stack back to what it traced, which has no remap
    import torch._dynamo

    class Scoped(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    @torch.compile(backend="eager")
    def scoped(x):
        with Scoped():
            y = x * 3
        return x + 1, y

    torch._dynamo.reset()
    try:
        with cuda_remapped_to(get_backend("cpu")):
            before = torch.overrides._get_current_function_mode_stack()
            scoped(torch.ones(2))
            assert torch.overrides._get_current_function_mode_stack() == before
    finally:
        torch._dynamo.reset()


_optimizer = None


def _step_with_the_global_optimizer(x):
    y = x * 2
    torch._dynamo.graph_break()  # the frame resuming here guards the optimizer by identity
    _optimizer.step()
    return y


def test_code_compiled_for_objects_since_freed_counts_to_no_recompile_limit():
    # Each %%neuron run compiles such a frame for its own copies; Dynamo kept the entries of the
    # freed copies, which counted towards recompile_limit: from the ninth cell it ran eagerly.
    import torch._dynamo
    import torch._dynamo.config as config

    from neuron_workbench.run.compiled_frames import drop_code_compiled_for_the_dead

    global _optimizer
    torch._dynamo.reset()
    compiled = torch.compile(_step_with_the_global_optimizer, backend="eager")
    weight = torch.nn.Parameter(torch.zeros(2))
    frames = []
    try:
        config.recompile_limit = 2
        for _ in range(4):  # a copy per run, the last one freed as the next is made
            _optimizer = torch.optim.SGD([weight], lr=0.1)
            drop_code_compiled_for_the_dead()
            before = dict(torch._dynamo.utils.counters["frames"])
            compiled(torch.ones(2))
            after = torch._dynamo.utils.counters["frames"]
            frames.append(
                (after["total"] - before.get("total", 0), after["ok"] - before.get("ok", 0))
            )
        # compiled for each copy after the first, none run eagerly at the limit
        assert all(ok == total > 0 for total, ok in frames[1:]), frames
        assert drop_code_compiled_for_the_dead() == 0  # the last copy lives: its code stays
        _optimizer = None
        assert drop_code_compiled_for_the_dead() > 0  # the frames resuming with it
    finally:
        config.recompile_limit = config._config["recompile_limit"].default
        _optimizer = None
        torch._dynamo.reset()

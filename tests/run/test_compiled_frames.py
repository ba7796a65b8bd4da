"""Dynamo compiles the user's frames, never the workbench's own."""

from torch.overrides import TorchFunctionMode

from neuron_workbench.backends import get_backend
from neuron_workbench.run.compiled_frames import keep_dynamo_out_of_the_workbench
from neuron_workbench.run.remap import cuda_remapped_to


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

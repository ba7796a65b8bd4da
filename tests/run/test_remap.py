import copy

import pytest
import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.run.remap import (
    cuda_remapped_to,
    remap_device,
    remember_autocast_requests,
    remember_grad_scaler_requests,
)


@pytest.mark.parametrize(
    ("value", "target", "expected"),
    [
        ("cuda", "neuron", "neuron"),
        ("cuda:0", "neuron", "neuron:0"),
        ("cuda:1", "tpu", "tpu:1"),
        ("cuda:1", "cpu", "cpu"),
        (torch.device("cuda", 0), "cpu", torch.device("cpu")),
        ("cpu", "neuron", "cpu"),
        ("cudafoo", "neuron", "cudafoo"),
        (3, "neuron", 3),
    ],
)
def test_remap_device(value, target, expected):
    assert remap_device(value, target) == expected


def test_remap_device_objects_to_an_accelerator():
    assert remap_device(torch.device("cuda"), "neuron") == torch.device("neuron")
    assert remap_device(torch.device("cuda", 0), "neuron") == torch.device("neuron", 0)


def test_cuda_idioms_land_on_the_cpu_backend():
    cpu = get_backend("cpu")
    with cuda_remapped_to(cpu):
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = torch.nn.Linear(3, 2).to(device)
        model.cuda()
        x = torch.randn(2, 3, device="cuda").cuda()
        y = torch.zeros(2).to("cuda:0")
        assert x.is_cuda  # answers for the run's device
        with torch.autocast("cuda"):
            out = model(x)
        scaler = torch.amp.GradScaler()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        assert end.query() and start.elapsed_time(end) >= 0
    assert model.weight.device.type == "cpu" and y.device.type == "cpu"
    assert out.dtype == torch.float16  # CUDA's autocast default, not CPU's bfloat16
    assert scaler._device == "cpu"
    # everything is put back
    assert torch.cuda.is_available() is False or torch.backends.cuda.is_built()
    assert torch.cuda.Event is not None and torch.cuda.synchronize.__module__ == "torch.cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch turns a cuda scaler off without CUDA")
def test_a_grad_scaler_turned_off_for_want_of_cuda_is_on_in_a_run():
    remember_grad_scaler_requests()
    with pytest.warns(UserWarning, match="CUDA is not available") as caught:
        scaler = torch.amp.GradScaler("cuda", init_scale=8.0, growth_interval=1)
    assert caught[0].filename == __file__  # torch's warning, at the line that built the scaler
    off = torch.amp.GradScaler("cuda", enabled=False)
    assert not scaler.is_enabled() and not off.is_enabled()
    with cuda_remapped_to(get_backend("cpu")):
        copied, copied_off = copy.deepcopy(scaler), copy.deepcopy(off)  # a run's copies
        assert copied.is_enabled() and copied._device == "cpu"
        weight = torch.ones(2, requires_grad=True)
        opt = torch.optim.SGD([weight], lr=0.1)
        copied.scale(weight.sum()).backward()
        assert weight.grad.tolist() == [8.0, 8.0]  # scaled by init_scale
        copied.step(opt)
        copied.update()
        assert copied.get_scale() == 16.0  # grown after growth_interval steps without inf
        assert not copied_off.is_enabled()  # off on purpose: off on a GPU too
    assert not scaler.is_enabled()  # outside a run the notebook's scaler is what torch made


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch turns cuda autocast off without CUDA")
def test_a_cuda_autocast_turned_off_for_want_of_cuda_warns_at_the_line_that_built_it():
    # `@torch.autocast("cuda", dtype=torch.bfloat16)` on a notebook model's method: torch's warning
    # named the workbench's wrapper (remap.py) as where it came from
    remember_autocast_requests()
    with pytest.warns(UserWarning, match="CUDA is not available") as caught:
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, caught[0].lineno)]
    assert "autocast = torch.autocast(" in open(__file__).readlines()[caught[0].lineno - 1]
    assert not autocast._enabled  # what torch made of it outside a run


def test_cuda_given_a_device_string_lands_on_the_runs_device():
    # x.cuda("cuda:0") gave "neuron:cuda:0", an invalid device, where compiled code mapped it
    neuron = get_backend("neuron")
    with neuron.activated(), cuda_remapped_to(neuron):
        moved = torch.ones(2).cuda("cuda:0")
        assert moved.device == torch.device("neuron", 0)


def test_cuda_idioms_land_on_the_emulated_neuron_device():
    neuron = get_backend("neuron")
    with neuron.activated(), cuda_remapped_to(neuron):
        model = torch.nn.Linear(3, 2).cuda()
        x = torch.ones(4, 3, device=torch.device("cuda"))
        t = torch.tensor([1.0, 2.0], device="cuda:0")
        with torch.cuda.amp.autocast():
            out = model(x)
        torch.cuda.manual_seed(1)
        a = torch.rand(2, device="cuda")
        torch.cuda.manual_seed(1)
        b = torch.rand(2, device="cuda")
    assert model.weight.device.type == "neuron"
    assert x.device.type == t.device.type == out.device.type == "neuron"
    assert out.dtype == torch.float16
    assert torch.equal(a.cpu(), b.cpu())


def test_compiled_code_puts_what_it_makes_on_cuda_on_each_runs_device():
    # Dynamo traces the run's code without the remap mode, which maps the devices of the graph's
    # nodes instead: a graph is the run's device's, and is compiled again for a run on another
    # one in the same process (it reused the first run's graph, on the cpu, on neuron)
    import torch._dynamo

    @torch.compile(backend="eager")
    def made():
        ones = torch.ones(3, device="cuda")
        return ones * 2, torch.arange(2).cuda(), torch.zeros(2).to("cuda:0"), ones.is_cuda

    torch._dynamo.reset()
    try:
        for name in ("cpu", "neuron", "cpu", "neuron"):
            backend = get_backend(name)
            with backend.activated(), cuda_remapped_to(backend):
                *tensors, is_cuda = made()
            assert [t.device.type for t in tensors] == [name] * 3
            assert is_cuda  # as x.is_cuda answers for the run's device outside compiled code
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("name", ["cpu", "neuron"])
def test_a_cuda_generator_is_one_the_run_can_draw_with(name):
    # torch.Generator is no torch function: the mode never saw its "cuda", so both runs raised.
    backend = get_backend(name)
    original = torch.Generator
    with backend.activated(), cuda_remapped_to(backend) as facts:
        g = torch.Generator(device="cuda").manual_seed(3)
        h = torch.Generator(torch.device("cuda:0")).manual_seed(3)
        drawn = [torch.randn(4, generator=each, device="cuda") for each in (g, h)]
        assert isinstance(g, torch.Generator) and isinstance(
            torch.default_generator, torch.Generator
        )
        assert torch.Generator().device.type == "cpu"
    assert torch.Generator is original  # put back
    assert g.device.type == h.device.type == "cpu"  # neither the host nor the emulator has others
    expected = torch.randn(4, generator=torch.Generator().manual_seed(3))
    for each in drawn:
        assert each.device.type == backend.device_type and torch.equal(each.cpu(), expected)
    notes = [n for n in facts.notes if n.startswith("torch.Generator for this device is a host")]
    assert len(notes) == (1 if name == "neuron" else 0), facts.notes


def test_torch_load_onto_cuda_lands_on_the_run_device(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"w": torch.arange(3.0)}, path)
    registry = list(torch.serialization._package_registry)
    with cuda_remapped_to(get_backend("cpu")):
        for where in ("cuda", "cuda:0", {"cpu": "cuda"}):
            loaded = torch.load(path, map_location=where)
            assert loaded["w"].device.type == "cpu" and loaded["w"].tolist() == [0.0, 1.0, 2.0]
    assert torch.serialization._package_registry == registry  # put back as it was


def test_a_default_device_a_run_sets_holds_for_the_notebook_as_the_cell_named_it(ip):
    from neuron_workbench.testing import run_cell

    try:
        run_cell(
            ip,
            "%%neuron --ref cpu --target neuron\nimport torch\ntorch.set_default_device('cuda')\n"
            "q = torch.ones(1)",
        )
        # "cuda", as a plain cell leaves it, not a run's own device (neuron, or the host's cpu)
        assert torch._GLOBAL_DEVICE_CONTEXT.device_context.device == torch.device("cuda")
        assert ip.user_ns["q"].device.type == "cpu"  # the reference's, on the host
    finally:
        torch.set_default_device(None)


def test_facts_note_random_draws_dropout_autocast_and_accumulating_scatters():
    neuron = get_backend("neuron")
    with neuron.activated(), cuda_remapped_to(neuron) as facts:
        x = torch.randn(4, 3, device="cuda")
        torch.nn.functional.dropout(x, 0.5, training=True)
        torch.nn.functional.dropout(x, 0.5, training=False)
        torch.zeros(3, device="cuda").index_add_(
            0, torch.tensor([0, 0], device="cuda"), torch.ones(2, device="cuda")
        )
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass
    assert facts.random_ops == {"torch.randn": 1, "torch.nn.functional.dropout": 1}
    assert facts.dropout_in_training == 1
    assert facts.nondeterministic_ops == {"Tensor.index_add_": 1}
    assert facts.autocast_dtypes == ["bfloat16"]


def test_rng_on_cpu_draws_from_the_host_generator_and_moves_the_numbers():
    from neuron_workbench import emulator

    neuron = get_backend("neuron")
    torch.manual_seed(5)
    expected = torch.randn(3, 2)
    mask_expected = torch.empty(8).bernoulli_(0.5)
    with neuron.activated(), emulator.record_fallbacks() as log:
        with cuda_remapped_to(neuron, rng_on_cpu=True) as facts:
            torch.manual_seed(5)
            drawn = torch.randn(3, 2, device="cuda")
            ones = torch.ones(8, device="cuda")
            dropped = torch.nn.functional.dropout(ones, 0.5, training=True)
    assert facts.rng_on_cpu and drawn.device.type == "neuron"
    assert torch.equal(drawn.cpu(), expected)
    assert torch.equal(dropped.cpu(), mask_expected * 2)
    # the draws happened on the host, so the device never had to fall back for them
    assert "aten::normal_" not in log.ops() and "aten::bernoulli_" not in log.ops()

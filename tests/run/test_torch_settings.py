"""Torch settings earlier cells changed travel with each run request and are taken there."""

import pytest
import torch

from neuron_workbench.run import torch_settings


@pytest.fixture
def restored():
    before = torch_settings.current()
    yield
    torch_settings.apply(before)


def test_settings_taken_in_another_state_come_back_as_they_were(restored):
    defaults = torch_settings.current()
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = True
    torch.set_printoptions(precision=2, sci_mode=False)
    changed = torch_settings.current()
    assert changed != defaults
    torch_settings.apply(defaults)
    assert torch_settings.current() == defaults
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    torch_settings.apply(changed)
    assert torch_settings.current() == changed
    assert torch.tensor([0.5]).dtype == torch.float64
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.get_float32_matmul_precision() == "high"
    assert str(torch.tensor([1.23456])) == "tensor([1.23])"


def test_a_backend_default_stays_where_the_kernel_has_torchs(restored):
    # an emulated TPU reports its one-pass DEFAULT mode as "medium"; a CUDA kernel says "highest"
    torch.set_float32_matmul_precision("medium")
    own = dict(torch_settings._own)
    torch_settings.keep_own()  # a target process whose backend defaults to "medium"
    try:
        kernel = {"float32_matmul_precision": "highest"}
        torch_settings.apply(kernel)
        assert torch.get_float32_matmul_precision() == "medium"
        torch_settings.apply({"float32_matmul_precision": "high"})  # chosen by the notebook
        assert torch.get_float32_matmul_precision() == "high"
        torch_settings.apply(kernel)  # and back to torch's default: the backend's own again
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch_settings._own.clear()  # this test process takes settings exactly again
        torch_settings._own.update(own)


def test_nothing_to_take_changes_nothing(restored):
    before = torch_settings.current()
    torch_settings.apply(None)
    torch_settings.apply({})
    assert torch_settings.current() == before


def test_a_process_that_kept_no_settings_of_its_own_takes_them_exactly(restored):
    # the kernel (a test restoring what it changed): torch's default is a value like any other
    assert not torch_settings._own
    torch.set_float32_matmul_precision("high")
    torch_settings.apply({"float32_matmul_precision": "highest"})
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_precision_the_notebook_chose_travels_at_torchs_default_too(restored):
    # torch.set_float32_matmul_precision('highest') in the kernel (the hint for a TPU's one-pass
    # matmuls) is a choice: the target's backend default no longer stands in for it
    torch.set_float32_matmul_precision("medium")
    own = dict(torch_settings._own)
    torch_settings.keep_own()  # a target process whose backend defaults to "medium"
    try:
        chosen = {"float32_matmul_precision": "highest", "float32_matmul_precision_chosen": True}
        torch_settings.apply(chosen)
        assert torch.get_float32_matmul_precision() == "highest"
        torch_settings.apply({**chosen, "float32_matmul_precision_chosen": False})
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch_settings._own.clear()  # this test process takes settings exactly again
        torch_settings._own.update(own)


def test_the_compilers_stance_travels_and_goes_back():
    # A target process compiled what the kernel's set_stance("force_eager") ran eagerly.
    import torch.compiler
    from torch._dynamo import eval_frame

    try:
        torch.compiler.set_stance("force_eager")
        sent = torch_settings.current()
        assert sent["compile_stance"] == {
            "stance": "force_eager",
            "skip_guard_eval_unsafe": False,
            "force_backend": None,
        }
        torch.compiler.set_stance("default")
        torch_settings.apply(sent)
        assert eval_frame._stance.stance == "force_eager"
        # settings without a stance set torch's default back
        torch_settings.apply({"grad_enabled": torch.is_grad_enabled()})
        assert eval_frame._stance.stance == "default"
        torch.compiler.set_stance(force_backend="eager")  # a backend by name travels
        assert torch_settings.current()["compile_stance"]["force_backend"] == "eager"
        torch.compiler.set_stance(force_backend=lambda gm, inputs: gm)  # a callable one does not
        assert "compile_stance" not in torch_settings.current()
    finally:
        torch.compiler.set_stance("default")


def test_dynamo_config_a_notebook_changed_travels_and_goes_back():
    # A target process compiled with torch's defaults whatever the kernel's cells set.
    import torch._dynamo.config as config

    # config.patch (torch.export's, an earlier test's) leaves its names set back to their defaults
    with config.patch(allow_rnn=True, specialize_int=True):
        pass
    try:
        config.capture_scalar_outputs = True
        config.recompile_limit = 3
        config.reorderable_logging_functions = {print}  # a callable belongs to its process
        sent = torch_settings.current()
        assert sent["dynamo_config"] == {"capture_scalar_outputs": True, "recompile_limit": 3}
        config.capture_scalar_outputs = False
        config.recompile_limit = config._config["recompile_limit"].default
        torch_settings.apply(sent)
        assert (config.capture_scalar_outputs, config.recompile_limit) == (True, 3)
        # settings with no change of Dynamo's set what an earlier request set back
        torch_settings.apply({"grad_enabled": torch.is_grad_enabled()})
        assert not config.capture_scalar_outputs
        assert config.recompile_limit == config._config["recompile_limit"].default
    finally:
        for name in ("capture_scalar_outputs", "recompile_limit", "reorderable_logging_functions"):
            setattr(config, name, config._config[name].default)
        torch_settings.apply({})


def test_a_reset_of_dynamo_is_counted_and_done_where_the_count_differs():
    # A target process kept its compiled graphs after the kernel's torch._dynamo.reset().
    import torch._dynamo
    import torch.compiler

    assert torch_settings.remember_dynamo_resets()  # Dynamo is loaded: resets are counted
    torch_settings.remember_dynamo_resets()  # once: not counted twice
    before = torch_settings.current()["dynamo_resets"]
    torch._dynamo.reset()
    torch.compiler.reset()
    sent = torch_settings.current()
    assert sent["dynamo_resets"] == before + 2
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm

    compiled = torch.compile(lambda t: t + 1, backend=backend)
    compiled(torch.ones(2))
    torch_settings.apply(sent)  # the count this process has: nothing to reset
    compiled(torch.ones(2))
    assert len(graphs) == 1
    torch_settings._resets[0] -= 1  # a process one reset behind resets, and takes the count
    torch_settings.apply(sent)
    assert torch_settings.current()["dynamo_resets"] == sent["dynamo_resets"]
    compiled(torch.ones(2))
    assert len(graphs) == 2


def test_taking_unchanged_settings_leaves_inductor_unimported():
    # torch.use_deterministic_algorithms imports Inductor (over a second): a new worker paid it on
    # its first cell although the kernel had never changed the setting
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from neuron_workbench.run import torch_settings\n"
        "torch_settings.apply(torch_settings.current())\n"
        "assert 'torch._inductor' not in sys.modules, 'unchanged: Inductor imported'\n"
        "torch_settings.apply({'deterministic': (True, True)})\n"
        "assert torch.are_deterministic_algorithms_enabled()\n"
        "assert torch.is_deterministic_algorithms_warn_only_enabled()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

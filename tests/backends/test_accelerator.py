"""The dispatch-level call recorder that gives real SDKs' fallback names their counts and lines."""

from __future__ import annotations

import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.backends.accelerator import DispatchCallRecorder
from neuron_workbench.opnames import normalize_op


def test_normalize_op():
    assert normalize_op("aten::add.Tensor") == "aten::add"
    assert normalize_op("sort") == "aten::sort"
    assert normalize_op("tpu::_max_pool2d") == "tpu::_max_pool2d"


def test_recorder_counts_calls_of_the_named_ops_per_line():
    with get_backend("neuron").activated():
        x = torch.randn(4, 6, device="neuron", requires_grad=True)
        recorder = DispatchCallRecorder()
        with recorder.recording():
            for _ in range(2):
                x.argmax(dim=1)
            x.sort(dim=1).values.sum().backward()
        events = recorder.events_for(
            ["aten::argmax.default", "aten::sort.stable", "aten::never_called"], source="test"
        )
    by_op = {}
    for event in events:
        by_op.setdefault(event["op"], []).append(event)
    (argmax,) = by_op["aten::argmax"]
    assert argmax["count"] == 2 and argmax["phase"] == "forward"
    assert argmax["site"]["file"] == __file__ and argmax["shapes"] == [[4, 6]]
    (sort,) = by_op["aten::sort"]
    assert sort["site"]["line"] == argmax["site"]["line"] + 1
    (missing,) = by_op["aten::never_called"]
    assert missing["count"] is None and missing["site"] is None
    assert "not seen at dispatch" in missing["source"]
    assert recorder.calls > 3


def test_emulated_capabilities_name_the_coverage():
    caps = get_backend("neuron").capabilities()
    assert caps["coverage"] == "neuron-2026-04 (195 native ops)"
    assert get_backend("neuron").kind() == "emulated"
    assert get_backend("neuron").fake_description() == ""


def test_recorder_leaves_torch_compile_on():
    from torch.utils._python_dispatch import any_torch_dispatch_mode_on_stack

    with DispatchCallRecorder().recording():
        # Dynamo skips compiling every frame while a mode that does not ignore it is active.
        assert any_torch_dispatch_mode_on_stack() is False


def test_per_call_tracking_attributes_fallbacks_inside_other_ops():
    from neuron_workbench import emulator

    with get_backend("neuron").activated(), emulator.record_fallbacks() as log:
        recorder = DispatchCallRecorder(
            per_call=(log.clear, lambda: [event.overload for event in log.events])
        )
        with recorder.recording():
            for _ in range(2):
                torch.randn(3, device="neuron")  # normal_ falls back inside randn's kernel
        events = recorder.events_for(sorted(recorder.named), source="test")
    (normal,) = events
    assert normal["op"] == "aten::normal_" and normal["count"] == 2
    assert normal["site"]["file"] == __file__


def test_an_emulated_run_turns_autograd_threads_off_and_back_on():
    backend = get_backend("neuron")
    assert torch.autograd.is_multithreading_enabled()
    with backend.activated():
        assert not torch.autograd.is_multithreading_enabled()
        with backend.activated():  # nested (a what-if run inside a run's activation)
            assert not torch.autograd.is_multithreading_enabled()
        assert not torch.autograd.is_multithreading_enabled()
    assert torch.autograd.is_multithreading_enabled()


def test_the_emulated_device_trains_in_a_process_whose_autograd_started_before_it():
    # `%%neuron --executor inprocess` (the escape hatch the worker's messages name) installs the
    # emulator in the kernel when the cell runs: after any backward pass there (the reference's
    # own, a run of an earlier cell) the engine's device queues had no slot for the device, and
    # every such cell was refused ("autograd started before the emulator was installed")
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        from neuron_workbench.testing import run_cell, testing_shell
        shell = testing_shell()
        run_cell(shell, "import torch\\nx = torch.ones(2, requires_grad=True)\\n(x * 3).sum().backward()")
        run_cell(
            shell,
            "%%neuron --executor inprocess -o r\\n"
            "w = torch.randn(3, device='cuda', requires_grad=True)\\n"
            "(w * 2).sum().backward()\\ng = w.grad",
        )
        print(shell.user_ns["r"].summary())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("PASS neuron (emulated)"), done.stdout

"""Launching a target's worker without torch, and ahead of the slot that takes it."""

import os
import subprocess
import sys

import pytest

from neuron_workbench import worker_launch
from neuron_workbench.run.worker_process import WorkerSlot


@pytest.fixture
def nothing_ahead():
    yield
    worker_launch._end_untaken()


def test_spawning_a_worker_imports_no_torch():
    code = (
        "import sys\n"
        "from neuron_workbench.worker_launch import launch_worker\n"
        "launched = launch_worker('neuron')\n"
        "assert 'torch' not in sys.modules\n"
        "launched.end()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_first_slot_of_a_target_takes_the_worker_launched_ahead(nothing_ahead):
    worker_launch.launch_ahead("neuron")
    ahead = worker_launch._AHEAD["neuron"]
    worker_launch.launch_ahead("neuron")  # once
    assert worker_launch._AHEAD["neuron"] is ahead
    slot = WorkerSlot("neuron")
    try:
        slot.ensure_started()
        assert slot.pid == ahead.process.pid and slot.availability.emulated
        assert worker_launch.take_launched("neuron") is None  # taken: the next slot spawns its own
    finally:
        slot.stop()
    assert ahead.process.poll() is not None and not os.path.exists(ahead.folder)


def test_nothing_is_launched_ahead_for_a_target_that_runs_here(nothing_ahead, monkeypatch):
    worker_launch.launch_ahead("cpu")
    monkeypatch.setenv("NEURON_WORKBENCH_EMULATE", "tpu")  # autoload installs it in this process
    worker_launch.launch_ahead("tpu")
    assert worker_launch._AHEAD == {}


def test_a_worker_no_slot_took_is_ended_with_the_process():
    code = (
        "from neuron_workbench.worker_launch import _AHEAD, launch_ahead\n"
        "launch_ahead('tpu')\n"
        "print(_AHEAD['tpu'].process.pid, _AHEAD['tpu'].folder)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pid, folder = done.stdout.split()
    assert not os.path.exists(folder)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


def test_a_worker_whose_kernel_died_before_using_it_ends_without_a_word():
    # its stderr is the kernel's, which `neuron-workbench run` shows: a BrokenPipeError traceback
    # there followed every notebook whose kernel died (or had no %%neuron cell) early
    code = (
        "import os\n"
        "from neuron_workbench.worker_launch import launch_worker\n"
        "launched = launch_worker('neuron')\n"
        "print(launched.folder, flush=True)\n"
        "os._exit(0)  # as a killed kernel: nothing ends the worker\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # (the run returns once the worker, which holds the same stderr, has ended too)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert not os.path.exists(done.stdout.strip())

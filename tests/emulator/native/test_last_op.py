"""The native core writes the name of each op the device runs into a caller's buffer (crash reports).

Each op the emulated device runs, and each op registered outside aten (a custom op) called from
Python on any device, is written as ``namespace::name[.overload]``; an op that ends gives the slot
back to the op still running around it, so the slot names the innermost op running, or the last
top-level op once none is. Host ops are not the device's: they leave the slot as it is.
"""

from __future__ import annotations

import json
import mmap

import pytest
import torch

from neuron_workbench.emulator import record_last_op, status


@pytest.fixture(autouse=True)
def _native_core(emulated_neuron):
    # decided once the device is installed (by the fixture), not at collection
    if status() is None or status().core != "native":
        pytest.skip("needs the emulator's native core (python -m neuron_workbench.emulator.native)")


SLOT = 128


def _name(buf) -> str:
    return bytes(buf).split(b"\0", 1)[0].decode()


def _ended(buf) -> bool:
    """The slot's last byte: the op it names has returned (1) or is still running (0)."""
    return bytes(buf)[-1] == 1


@pytest.fixture
def slot():
    buf = mmap.mmap(-1, SLOT)
    assert record_last_op(buf) is True
    try:
        yield buf
    finally:
        record_last_op(None)
        buf.close()  # possible again once recording is off


def test_the_last_op_and_its_overload_are_in_the_slot(slot):
    a = torch.ones(3, device="neuron")
    a.cos()
    assert _name(slot) == "aten::cos" and _ended(slot)  # no overload name
    a + a
    assert _name(slot) == "aten::add.Tensor"
    a.view(3, 1)
    assert _name(slot) == "aten::view"  # the core's own kernel


def test_an_op_on_host_tensors_leaves_the_last_device_op(slot):
    a = torch.ones(3, device="neuron")
    a.cos()
    torch.ones(3).sin()
    torch.ones(2) + torch.ones(2)
    assert _name(slot) == "aten::cos"


def test_the_ops_a_kernel_runs_inside_an_op_leave_the_outer_name(slot):
    # float64 on neuron: the core narrows, running casts of its own inside aten::sum
    torch.ones(3, device="neuron", dtype=torch.float64).sum()
    assert _name(slot) == "aten::sum"
    # a copy to the device runs whole on it; its allocation and byte copy nest inside
    torch.ones(2, 2).to("neuron")
    assert _name(slot) == "aten::_to_copy"


def test_the_parts_of_a_composite_op_are_what_the_device_runs(slot):
    # aten::matmul has no kernel of the device: the dispatcher runs it as aten::mm
    torch.ones(2, 2, device="neuron").matmul(torch.ones(2, 2, device="neuron"))
    assert _name(slot) == "aten::mm"


@pytest.fixture(scope="module")
def mine():
    """A custom op in Python whose body reads the slot, before and after an op of its own."""
    reads: dict = {"slot": None, "seen": []}

    @torch.library.custom_op("nwtest_lastop::mine", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        reads["seen"].append(_name(reads["slot"]))
        y = x * 2  # aten::mul.Tensor, inside nwtest_lastop::mine
        reads["seen"].append(_name(reads["slot"]))
        reads["running"] = not _ended(reads["slot"])  # an inner op ended, the outer one did not
        return y

    def run(x, slot):
        reads["slot"], reads["seen"], reads["running"] = slot, [], None
        op(x)
        return reads["seen"], reads["running"]

    return run


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_a_python_custom_op_is_named_while_its_body_runs(slot, mine, device):
    seen, running = mine(torch.ones(3, device=device), slot)
    assert seen == ["nwtest_lastop::mine", "nwtest_lastop::mine"] and running
    assert _name(slot) == "nwtest_lastop::mine" and _ended(slot)


def test_profiler_markers_are_not_ops_of_the_cell(slot):
    # optimizer.step() and zero_grad() mark themselves with record_function (profiler:: ops)
    torch.ones(3, device="neuron").cos()
    with torch.autograd.profiler.record_function("step"):
        torch.ones(3).sin()
    assert _name(slot) == "aten::cos"


def test_a_device_factory_leaves_its_name(slot):
    torch.empty(2, 3, device="neuron")
    assert _name(slot) == "aten::empty.memory_format"
    torch.empty_strided((2, 3), (1, 2), device="neuron")
    assert _name(slot) == "aten::empty_strided"


def test_a_shorter_name_leaves_no_tail_of_a_longer_one(slot):
    torch.empty(2, device="neuron").cos()
    assert bytes(slot) == b"aten::cos".ljust(SLOT - 1, b"\0") + b"\1"


def test_a_long_name_is_cut_to_the_slot():
    small = bytearray(b"\xff" * 8)
    assert record_last_op(small) is True
    try:
        torch.ones(2, device="neuron").cos()
    finally:
        record_last_op(None)
    assert small == bytearray(b"aten::\0\1")


def test_none_stops_the_writes(mine):
    buf = mmap.mmap(-1, SLOT)
    assert record_last_op(buf) is True
    with pytest.raises(BufferError):
        buf.close()  # the core writes into it: kept open
    assert record_last_op(None) is True
    buf[:] = bytes(SLOT)
    torch.ones(3, device="neuron").cos()
    torch.ones(3).cos()
    assert mine(torch.ones(3), buf) == (["", ""], True)  # custom ops are not entered either
    assert bytes(buf) == bytes(SLOT)
    buf.close()
    torch.ones(3, device="neuron").cos()  # nothing writes into the unmapped buffer
    torch.ones(3).cos()


def test_a_read_only_or_empty_buffer_is_refused():
    with pytest.raises(TypeError):
        record_last_op(b"aten")
    with pytest.raises(ValueError):
        record_last_op(bytearray(1))  # no room for a name and its state


KILLED = """
import mmap, os, signal, sys
import torch
from neuron_workbench.emulator import emulate, record_last_op
emulate("neuron")
with open(sys.argv[1], "r+b") as handle:
    slot = mmap.mmap(handle.fileno(), 128)
assert record_last_op(slot)
torch.ones(3, device="neuron").cos()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_name_outlives_a_killed_process(run_py, tmp_path):
    path = tmp_path / "slot"
    path.write_bytes(bytes(SLOT))
    r = run_py(KILLED, args=[str(path)])
    assert r.returncode == -9, r.stderr[-2000:]
    # killed in host code after the op: named, and marked ended
    assert _name(path.read_bytes()) == "aten::cos" and _ended(path.read_bytes())


ABORTED = """
import ctypes, mmap, sys
import torch
from neuron_workbench.emulator import emulate, record_last_op
emulate("neuron")


@torch.library.custom_op("nwtest_lastop::boom", mutates_args=())
def boom(x: torch.Tensor) -> torch.Tensor:
    x.clone()
    ctypes.CDLL(None).abort()
    return x


with open(sys.argv[1], "r+b") as handle:
    slot = mmap.mmap(handle.fileno(), 128)
assert record_last_op(slot)
boom(torch.ones(3, device="neuron") * 2)
"""


def test_a_custom_op_that_aborts_the_process_is_the_last_op(run_py, tmp_path):
    path = tmp_path / "slot"
    path.write_bytes(bytes(SLOT))
    r = run_py(ABORTED, args=[str(path)])
    assert r.returncode == -6, r.stderr[-2000:]
    # died inside the op (its inner clone had ended): running
    assert _name(path.read_bytes()) == "nwtest_lastop::boom"
    assert not _ended(path.read_bytes())


EXITS = """
import mmap, threading
import torch
from neuron_workbench.emulator import emulate, record_last_op
emulate("neuron")
slot = mmap.mmap(-1, 128)
assert record_last_op(slot)
w = torch.ones(3, device="neuron", requires_grad=True)
# The backward on this thread: an autograd device thread still stopping while the interpreter
# finalizes is torch's own exit race ("terminate called without an active exception", SIGABRT).
with torch.autograd.set_multithreading_enabled(False):
    (w * w).sum().backward()
other = threading.Thread(target=lambda: (w.detach() + 1).sum().item())  # device ops elsewhere
other.start()
other.join()
torch.ones(3).cos()
"""


def test_a_process_exits_cleanly_while_recording(run_py):
    # at exit the core stops recording (forgets the buffer) before Python frees it
    r = run_py(EXITS)
    assert r.returncode == 0, r.stderr[-2000:]


PYTHON_CORE = """
import json, mmap
from neuron_workbench.emulator import emulate, record_last_op
buf = mmap.mmap(-1, 128)
before = record_last_op(buf)  # nothing emulated yet
st = emulate("neuron")
print(json.dumps({"core": st.core, "before": before, "after": record_last_op(buf),
                  "off": record_last_op(None)}))
"""


def test_the_python_core_leaves_recording_to_the_caller(run_py):
    r = run_py(PYTHON_CORE, env={"NEURON_WORKBENCH_EMULATOR_CORE": "python"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"core": "python", "before": False, "after": False, "off": False}

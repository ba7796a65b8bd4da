"""The worker slot: target runs in a child process, shipped with cloudpickle, crashes contained."""

import os
import textwrap
import threading
import time

import pytest
import torch

from neuron_workbench.cell.session import Session
from neuron_workbench.cell.settings import CellOptions, CompareOptions
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.transport import dumps, loads

NOTEBOOK = """
import os
import time
import torch
import torch.nn as nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

def train_step():
    # reads the global `model`: each run must see its own copy
    loss = model(torch.ones(3, 4, device="cuda")).sum()
    loss.backward()
    return loss
"""

#: A module the worker imports by reference: its op aborts the process, but only in a worker.
ABORTING_OPS = """
import ctypes
import os

import torch


@torch.library.custom_op("nwtest_worker::boom", mutates_args=())
def boom(x: torch.Tensor) -> torch.Tensor:
    if os.environ.get("NEURON_WORKBENCH_WORKER"):
        ctypes.CDLL(None).abort()
    return x.clone()
"""


@pytest.fixture(scope="module")
def session():
    session = Session()
    yield session
    session.close()


@pytest.fixture
def namespace():
    ns = {"__name__": "__main__"}
    exec(NOTEBOOK, ns)
    return ns


def compare(source, ns, session, target="neuron", timeout=None):
    options = CellOptions(
        compare=CompareOptions(ref="cpu", target=target),
        executor="worker",
        timeout=timeout,
        scan=False,
    )
    return session.run_cell(textwrap.dedent(source).lstrip("\n"), ns, options)


@pytest.mark.inprocess_device
def test_tensors_travel_with_grads_parameters_and_their_device():
    model = torch.nn.Linear(4, 2)
    model(torch.randn(3, 4)).sum().backward()
    loss = (model.weight * 2).sum()
    copy = loads(dumps({"model": model, "loss": loss}))
    assert isinstance(copy["model"].weight, torch.nn.Parameter)
    assert torch.equal(copy["model"].weight.grad, model.weight.grad)
    assert copy["loss"].requires_grad and torch.equal(copy["loss"], loss.detach())
    on_device = loads(dumps(torch.ones(2, device="neuron")))
    assert on_device.device.type == "cpu"
    assert on_device._workbench_device == "neuron:0"


def test_cell_runs_in_a_reused_worker_and_leaves_the_namespace_alone(session, namespace):
    result = compare(
        """
        model = Tiny().cuda()
        loss = train_step()
        print("on", loss.device)
        grad = model.fc.weight.grad
        """,
        namespace,
        session,
    )
    report = result.report
    assert report.verdict == "PASS", report.summary()
    assert report.target.backend.emulated and report.target.backend.name == "neuron"
    assert "model.fc.weight.grad" in [d.path for d in report.comparison.diffs]
    assert report.target.stdout == "on neuron:0\n"
    assert result.captured["target"].stdout == "on neuron:0\n"
    # the reference's results are kept (on the CPU, remembered as device-resident)
    assert namespace["model"].fc.weight.device.type == "cpu"
    worker = session.workers.get("neuron")
    pid, cells = worker.pid, worker.cells_run
    result = compare("out = model(torch.ones(1, 4, device='cuda'))", namespace, session)
    assert result.report.verdict == "PASS", result.report.summary()
    assert worker.pid == pid and worker.cells_run == cells + 1


def test_unshippable_value_is_a_one_line_error_naming_it(session, namespace):
    namespace["lock"] = threading.Lock()
    with pytest.raises(WorkbenchUsageError) as caught:
        compare("with lock:\n    first = 1", namespace, session)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("'lock' (a lock) cannot be sent to the neuron worker")
    assert message.endswith("run the cell with --executor inprocess")


def test_an_aborting_op_is_an_error_naming_signal_op_and_line(
    session, namespace, tmp_path, monkeypatch
):
    (tmp_path / "nwtest_worker_ops.py").write_text(ABORTING_OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import nwtest_worker_ops

    namespace["nwtest_worker_ops"] = nwtest_worker_ops
    namespace["kept"] = torch.arange(3.0)
    before = dict(namespace)
    result = compare(
        """
        x = torch.ones(3, device="cuda")
        y = x * 2
        z = nwtest_worker_ops.boom(y)
        """,
        namespace,
        session,
    )
    report = result.report
    assert report.verdict == "ERROR"
    assert report.ref.ok
    assert report.target.error.message == (
        "target process died (SIGABRT) while running nwtest_worker::boom at cell line 3"
    )
    assert "neuron raised TargetProcessDied: target process died (SIGABRT)" in report.summary()
    assert namespace == before  # nothing committed, nothing lost
    result = compare("w = kept.cuda() * 2", namespace, session)
    assert result.report.verdict == "PASS", result.report.summary()


def test_a_hung_target_is_ended_at_the_timeout(namespace):
    session = Session()
    try:
        compare("warm = torch.ones(1, device='cuda')", namespace, session)  # start the worker
        start = time.monotonic()
        result = compare(
            """
            x = torch.ones(2, device="cuda")
            if os.environ.get("NEURON_WORKBENCH_WORKER"):
                time.sleep(600)
            """,
            namespace,
            session,
            timeout=3,
        )
        elapsed = time.monotonic() - start
    finally:
        session.close()
    assert elapsed < 10
    message = result.report.target.error.message
    assert message.startswith(
        "target process timed out after 3 s at cell line 3, after running aten::"
    )
    assert message.endswith("; it was ended")


def test_a_worker_that_exits_is_reported_and_replaced(session, namespace):
    result = compare(
        """
        x = torch.ones(2, device="cuda") + 1
        if os.environ.get("NEURON_WORKBENCH_WORKER"):
            os._exit(3)
        """,
        namespace,
        session,
    )
    # os._exit leaves no stack dump: the op (which had ended) is known, the line is not
    assert result.report.target.error.message == (
        "target process died (exit status 3) after running aten::add.Tensor"
    )
    assert compare("y = torch.ones(2, device='cuda')", namespace, session).report.verdict == "PASS"


@pytest.mark.inprocess_device
def test_tpu_runs_in_its_own_worker_next_to_an_emulated_neuron_process(session, namespace):
    # this test process emulates neuron (conftest), so tpu can only run in a worker
    result = compare("y = torch.ones(4, device='cuda').cumsum(0)", namespace, session, "tpu")
    assert result.report.verdict == "PASS", result.report.summary()
    assert result.report.target.backend.name == "tpu"
    assert torch._C._get_privateuse1_backend_name() == "neuron"


@pytest.mark.inprocess_device
def test_a_device_this_process_lacks_comes_back_as_a_generic_accelerator():
    # the kernel holds no accelerator: a worker's torch.device("tpu") still reads as one
    from neuron_workbench.run.transport import _rebuild_device

    assert _rebuild_device("tpu", 0) == torch.device("privateuseone", 0)  # this process: neuron
    assert loads(dumps(torch.device("neuron", 0))) == torch.device("neuron", 0)  # emulated here


KERNEL_THAT_HANGS = """
import os, time, torch
from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.cell.settings import CellOptions
from neuron_workbench.cell.session import Session
from neuron_workbench.run.transport import dumps, loads
session = Session()
worker = session.workers.get("neuron")
worker.ensure_started()
print(worker.pid, worker.arena, flush=True)
ns = {"__name__": "__main__", "torch": torch, "os": os, "time": time}
cell = "x = torch.ones(1, device='cuda')\\nif os.environ.get('NEURON_WORKBENCH_WORKER'):\\n    time.sleep(600)"
options = CellOptions(compare=CompareOptions(ref="cpu", target="neuron"), scan=False)
session.run_cell(cell, ns, options)
"""


@pytest.mark.parametrize("when", ["mid-cell", "between cells"])
def test_a_worker_ends_and_removes_its_folder_when_its_kernel_is_killed(when):
    import subprocess
    import sys

    # between cells: the worker waits for the next request when the kernel dies (a notebook's
    # kernel shut down); mid-cell: its parent watch notices
    script = KERNEL_THAT_HANGS if when == "mid-cell" else KERNEL_THAT_HANGS.replace("600", "0")
    script += "time.sleep(600)\n"
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid, folder = kernel.stdout.readline().split()
        pid = int(pid)
        assert os.path.isdir(folder)
        time.sleep(2)  # the worker is now inside the hung cell, or done with the cell
    finally:
        kernel.kill()
        kernel.wait()
    deadline = time.monotonic() + 10
    while (_running(pid) or os.path.exists(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(pid)
    assert not os.path.exists(folder)  # its arenas and crash records with it


KERNEL_THAT_CLOSES_THE_PIPE = '''
import os, sys, torch
from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.cell.settings import CellOptions
from neuron_workbench.cell.session import Session
session = Session()
ns = {"__name__": "__main__", "torch": torch, "os": os, "sys": sys}
cell = """
class Noisy:
    def __del__(self):
        sys.stderr.write("finalised in the worker\\\\n")
if os.environ.get("NEURON_WORKBENCH_WORKER"):
    sys.modules["nwtest_noisy"] = Noisy()  # lives until the interpreter's own teardown
x = torch.ones(1, device="cuda")
"""
options = CellOptions(compare=CompareOptions(ref="cpu", target="neuron"), scan=False)
print(session.run_cell(cell, ns, options).report.verdict, flush=True)
worker = session.workers.get("neuron")
process, folder = worker._process, worker.arena
worker._conn.close()  # as a kernel that is gone: the worker ends on its own
print(process.wait(timeout=60), os.path.exists(folder), flush=True)
'''


def test_a_worker_ends_on_a_closed_pipe_without_the_interpreters_teardown():
    # Teardown runs library finalisers (torch's dynamo weakref callbacks among them) that can print
    # "Exception ignored in ..." into the stderr the worker shares with its kernel or the CLI.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", KERNEL_THAT_CLOSES_THE_PIPE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["PASS", "0", "False"], done.stdout + done.stderr[-2000:]
    assert "finalised in the worker" not in done.stderr


def _running(pid):
    """Whether ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()
    except OSError:
        return False


def test_the_kernels_environment_as_of_the_cell_reaches_the_worker(session, namespace, monkeypatch):
    monkeypatch.setenv("NWB_TEST_SETTING", "on")
    result = compare("setting = os.environ.get('NWB_TEST_SETTING')", namespace, session)
    assert result.report.verdict == "PASS", result.report.summary()
    assert result.report.target.outputs["setting"] == "on"


@pytest.mark.inprocess_device
def test_auto_keeps_a_device_this_process_already_holds():
    from neuron_workbench.backends.registry import resolve_executor

    # this test process emulates neuron (conftest); tpu can only run elsewhere
    assert resolve_executor("auto", ["neuron"]) == "inprocess"
    assert resolve_executor("auto", ["tpu"]) == "worker"
    assert resolve_executor("auto", ["neuron", "tpu"]) == "worker"
    assert resolve_executor("auto", ["cpu"]) == "inprocess"
    assert resolve_executor("inprocess", ["tpu"]) == "inprocess"


def _environment_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return dict(
            entry.decode().split("=", 1) for entry in handle.read().split(b"\0") if b"=" in entry
        )


def test_a_launched_worker_starts_while_the_kernel_goes_on_and_its_first_use_waits_for_it():
    from neuron_workbench.run.worker_process import WorkerSlot

    slot = WorkerSlot("neuron")
    try:
        launched = time.perf_counter()
        slot.launch()
        assert time.perf_counter() - launched < 0.5  # torch is imported there, not waited for
        assert slot.alive and slot.availability is None
        pid = slot.pid
        slot.ensure_started()
        assert slot.pid == pid  # the launched process, not a second one
        assert slot.availability is not None and slot.availability.emulated
        assert slot.info is not None and slot.info.device.startswith("neuron")
    finally:
        slot.stop()
    assert not slot.alive


def test_a_variable_set_after_the_launch_reaches_the_worker_that_runs_the_cell(monkeypatch):
    # an SDK reads its variables as it loads (NEURON_RT_VISIBLE_CORES): a process launched before
    # the notebook set one is not the one that runs its cells
    from neuron_workbench.run.worker_process import WorkerSlot

    slot = WorkerSlot("neuron")
    try:
        slot.launch()
        first = slot.pid
        monkeypatch.setenv("NWTEST_SET_AFTER_LAUNCH", "1")
        slot.ensure_started()
        assert slot.pid != first
        assert _environment_of(slot.pid).get("NWTEST_SET_AFTER_LAUNCH") == "1"
    finally:
        slot.stop()


def test_a_launched_worker_that_died_before_its_first_use_is_started_afresh():
    from neuron_workbench.run.worker_process import WorkerSlot

    slot = WorkerSlot("neuron")
    try:
        slot.launch()
        first = slot.pid
        os.kill(first, 9)
        slot._process.wait()
        slot.ensure_started()  # no "failed to start": nobody was waiting for that one
        assert slot.alive and slot.pid != first and slot.availability is not None
    finally:
        slot.stop()


def test_a_session_launches_workers_only_for_targets_that_run_in_one():
    session = Session()
    try:
        session.launch_workers(["neuron"], "auto")
        session.launch_workers(["cpu"], "worker")
        rows = {row.target: row for row in session.workers.rows()}
        assert set(rows) == {"neuron"} and rows["neuron"].alive
        pid = rows["neuron"].pid
        session.launch_workers(["neuron"], "auto")  # launched already: not again
        assert session.workers.rows()[0].pid == pid
    finally:
        session.close()

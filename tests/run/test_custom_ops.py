"""A notebook's ``torch.library.custom_op`` on the default path: defined again in the target's worker.

Each test names its ops in a namespace of its own: an op is registered for the whole process (and
the worker's), and a test must not find another test's op.
"""

import uuid

import pytest
import torch
from IPython.core.error import UsageError

from neuron_workbench.testing import run_cell

SCALE_ADD = """
import torch

@torch.library.custom_op("{ns}::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y

@scale_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)

def _setup(ctx, inputs, output):
    ctx.alpha = inputs[2]

def _backward(ctx, grad):
    return grad * ctx.alpha, grad, None

scale_add.register_autograd(_backward, setup_context=_setup)
x = torch.randn(6)
y = torch.randn(6)
"""


@pytest.fixture
def ns():
    return f"nb{uuid.uuid4().hex[:10]}"


def _report(ip, cell):
    run_cell(ip, "%%neuron -o r\n" + cell)
    return ip.user_ns["r"]


def test_a_notebook_op_runs_in_the_worker_by_its_function_and_by_torch_ops(ip, ns):
    # before: "'scale_add' (a CustomOpDef) cannot be sent to the neuron worker process", and
    # torch.ops.<ns>.scale_add was an AttributeError in the worker alone (ERROR)
    run_cell(ip, SCALE_ADD.format(ns=ns))
    report = _report(
        ip,
        f"""w = x.cuda().requires_grad_()
z = scale_add(w, y.cuda(), 2.0)
z2 = torch.ops.{ns}.scale_add(w, y.cuda(), 3.0)
(z * z2).sum().backward()
g = w.grad""",
    )
    assert report.verdict == "PASS", report.summary()
    assert {d.path for d in report.comparison.diffs} >= {"z", "z2", "g"}
    x, y = ip.user_ns["x"], ip.user_ns["y"]
    assert torch.allclose(ip.user_ns["g"], 2 * (3 * x + y) + 3 * (2 * x + y))
    assert not report.target.error and report.target.backend.name == "neuron"


def test_an_op_the_notebook_defines_again_is_the_new_one_in_the_worker(ip, ns):
    run_cell(ip, SCALE_ADD.format(ns=ns))
    assert _report(ip, f"z = torch.ops.{ns}.scale_add(x.cuda(), y.cuda(), 2.0)").verdict == "PASS"
    # the worker has the first definition now: the second must replace it there too, or the
    # target computes x * 2 + y against the reference's x * 2 - y (FAIL)
    run_cell(
        ip,
        f"""@torch.library.custom_op("{ns}::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha - y""",
    )
    report = _report(ip, f"z = torch.ops.{ns}.scale_add(x.cuda(), y.cuda(), 2.0)")
    assert report.verdict == "PASS", report.summary()
    assert torch.allclose(ip.user_ns["z"], ip.user_ns["x"] * 2 - ip.user_ns["y"])


def test_kernels_registered_for_a_device_by_decorator_travel_too(ip, ns):
    run_cell(
        ip,
        f"""import torch
@torch.library.custom_op("{ns}::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@twice.register_kernel("cpu")
def _(x):
    return x + x

x = torch.randn(4)""",
    )
    report = _report(ip, "z = twice(x.cuda())")
    assert report.verdict == "PASS", report.summary()
    assert torch.equal(ip.user_ns["z"], ip.user_ns["x"] * 2)


def test_an_op_defined_in_the_cell_comes_back_as_the_notebooks(ip, ns):
    run_cell(ip, "import torch")
    report = _report(
        ip,
        f"""@torch.library.custom_op("{ns}::neg", mutates_args=())
def neg(x: torch.Tensor) -> torch.Tensor:
    return -x
z = neg(torch.ones(3, device="cuda"))""",
    )
    assert report.verdict == "PASS", report.summary()
    assert not [d for d in report.comparison.diffs if d.status == "not-compared"]
    assert torch.equal(ip.user_ns["neg"](torch.ones(2)), -torch.ones(2))


def test_op_objects_travel_by_name_both_ways(ip):
    # an OpOverload(Packet)'s C++ handle cannot be pickled: the cell was refused, or the op the
    # cell bound came back "not compared"
    run_cell(ip, "import torch\nadd = torch.ops.aten.add.Tensor\nx = torch.randn(3)")
    report = _report(ip, "z = add(x.cuda(), x.cuda())\nmul = torch.ops.aten.mul")
    assert report.verdict == "PASS", report.summary()
    assert {d.path for d in report.comparison.diffs} == {"z"}
    assert ip.user_ns["mul"] is torch.ops.aten.mul


def test_an_op_whose_definition_was_not_kept_is_a_usage_error(ip, ns):
    # as an op a notebook defined before %load_ext neuron_workbench: its calls were not kept
    run_cell(ip, SCALE_ADD.format(ns=ns))
    run_cell(ip, "del scale_add._workbench_calls")
    with pytest.raises(UsageError, match=r"'scale_add' was defined with torch.library.custom_op"):
        run_cell(ip, "%%neuron\nz = scale_add(x.cuda(), y.cuda(), 2.0)")


def test_an_op_that_cannot_travel_stays_behind_without_stopping_other_cells(ip, ns):
    # every request carries the notebook's ops: one whose function holds a lock must not make
    # every later cell fail to reach the worker
    run_cell(
        ip,
        f"""import threading, torch
guard = threading.Lock()
def locked(x: torch.Tensor) -> torch.Tensor:
    with guard:
        return x + 1
locked = torch.library.custom_op("{ns}::locked", locked, mutates_args=())
x = torch.randn(3)""",
    )
    report = _report(ip, "z = x.cuda() * 2")
    assert report.verdict == "PASS", report.summary()
    report = _report(ip, f"z = torch.ops.{ns}.locked(x.cuda())")
    assert report.verdict == "ERROR" and report.ref.error is None, report.summary()
    note = next(n for n in report.notes if f"torch.ops.{ns}.locked" in n)
    assert "could not be pickled" in note and "--executor inprocess" in note


def test_register_autocast_is_kept_and_returns_what_torch_returns(ip, ns):
    # register_autocast has no decorator form: its keyword call was taken for one, so it returned
    # a decorator and the worker never got the registration
    run_cell(ip, SCALE_ADD.format(ns=ns))
    run_cell(ip, 'returned = scale_add.register_autocast("cuda", cast_inputs=torch.float16)')
    # torch's own kernel, not a decorator waiting for a function
    assert ip.user_ns["returned"].__qualname__.startswith("CustomOpDef.register_autocast")
    calls = ip.user_ns["scale_add"]._workbench_calls
    assert calls[-1] == ("register_autocast", ("cuda",), {"cast_inputs": torch.float16})

"""The ``scalars`` run instrument on the cpu reference, through the executor users' runs take."""

import pytest
import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.run import RunSpec, compile_cell, execute
from neuron_workbench.run import scalars as scalars_module
from neuron_workbench.run.records import recorded
from neuron_workbench.run.scalars import ScalarTrace, scalar_instrument


def _trace(source, max_steps=None, **values):
    ns = {"torch": torch, **values}
    program = compile_cell(source)
    spec = RunSpec(program, ns, instruments={"scalars": scalar_instrument(max_steps)})
    run = execute(spec, get_backend("cpu"))
    assert run.ok, run.error
    return recorded(run.extras["scalars"]), run


def test_every_conversion_is_kept_in_order_with_its_call_site():
    trace, _ = _trace(
        "t = torch.tensor([1.5, 2.5])\n"
        "a = t.sum().item()\n"
        "b = int(t.sum())\n"
        "c = t.tolist()\n"
        "for i in range(3):\n"
        "    d = float(t[0] * i)\n"
    )
    assert list(trace.series) == [f"{name}:{line}" for name, line in _lines(trace, (2, 3, 4, 6))]
    a, b, c, d = trace.series.values()
    assert (a.how, a.dtype, a.values) == ("Tensor.item", "float32", [4.0])
    assert (b.how, b.dtype, b.values) == ("int", "float32", [4])
    assert (c.how, c.values) == ("Tensor.tolist", [[1.5, 2.5]])
    assert (d.how, d.values, d.order) == ("float", [0.0, 1.5, 3.0], [3, 4, 5])
    assert trace.total == 6


def _lines(trace, lines):
    name = next(iter(trace.series)).rsplit(":", 1)[0]  # the cell's compiled name
    return [(name, line) for line in lines]


def test_a_formatted_loss_and_a_logged_one_are_the_users_calls():
    # f"{loss:.4f}" made its number inside Tensor.__format__ with the run's mode off (no curve:
    # a training script's loop printing so was UNCOMPARED), and logging formats its arguments in
    # its own frames (every logged metric was one series at logging/__init__.py)
    import io
    import logging

    log = logging.getLogger("wbtest.scalars")
    log.addHandler(logging.StreamHandler(io.StringIO()))  # one that formats the message
    log.propagate, log.level = False, logging.INFO
    trace, _ = _trace(
        "loss = torch.tensor(0.25) * 2\n"
        'a = f"loss {loss:.4f}"\n'
        'b = "{:.2f}".format(loss)\n'
        'log.info("loss %.6f", loss)\n'
        'log.info("norm %.6f", loss * 3)\n'
        'c = f"{torch.ones(2)}"\n',  # no 0-dim tensor: no number made
        log=log,
    )
    assert list(trace.series) == [f"{name}:{line}" for name, line in _lines(trace, (2, 3, 4, 5))]
    assert [s.values for s in trace.series.values()] == [[0.5], [0.5], [0.5], [1.5]]


def test_a_notebook_cells_own_sites_do_not_name_its_pseudo_file():
    # <neuron-cell-K> counts the cells a kernel compiled: the same cell recorded in two sessions
    # had different sites, and comparing the recordings FAILed ("... vs none")
    ns = {"torch": torch}
    program = compile_cell("x = torch.ones(1)\nv = x.item()\n", first_line=2)
    spec = RunSpec(program, ns, instruments={"scalars": scalar_instrument(None, program.filename)})
    run = execute(spec, get_backend("cpu"))
    assert list(recorded(run.extras["scalars"]).series) == ["cell:3"]
    script = compile_cell("v = torch.ones(1).item()\n", filename="/tmp/train.py")
    spec = RunSpec(script, ns, instruments={"scalars": scalar_instrument(None, script.filename)})
    assert list(recorded(execute(spec, get_backend("cpu")).extras["scalars"]).series) == [
        "train.py:1"
    ]


def test_torch_and_the_workbench_own_conversions_are_not_recorded():
    model = torch.nn.Linear(3, 1)
    trace, _ = _trace(
        "opt = torch.optim.Adam(model.parameters())\n"
        "model(torch.ones(2, 3)).sum().backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "opt.step()\n",
        model=model,
    )
    assert trace.series == {}


def test_long_runs_are_capped_and_summarised(monkeypatch):
    monkeypatch.setattr(scalars_module, "MAX_VALUES", 4)
    monkeypatch.setattr(scalars_module, "MAX_SITES", 1)
    trace, _ = _trace(
        "for i in range(10):\n    v = torch.tensor(float(i)).item()\nw = torch.ones(1).item()\n"
        "big = torch.ones(100).tolist()\n"
    )
    (series,) = trace.series.values()
    assert series.values == [0.0, 1.0, 2.0, 3.0] and series.count == 10
    assert series.dropped == {"min": 4.0, "max": 9.0, "last": 9.0}
    assert trace.unrecorded == 1  # the second site, beyond MAX_SITES; the big tolist is no scalar


def test_max_steps_ends_the_run_as_if_the_program_ended():
    trace, run = _trace(
        "seen = []\nfor i in range(100):\n    seen.append(torch.tensor(i).item())\n    x = 1\n",
        max_steps=5,
    )
    (series,) = trace.series.values()
    assert series.values == [0, 1, 2, 3, 4] and trace.stopped
    assert run.outputs["seen"] == [0, 1, 2, 3, 4]


def test_a_trace_survives_json():
    trace, _ = _trace("a = torch.tensor(float('nan')).item()\nb = torch.tensor(2.0).item()")
    again = ScalarTrace.from_dict(trace.to_dict())
    nan, two = again.series.values()
    assert nan.values[0] != nan.values[0] and two.values == [2.0]
    assert trace.to_dict()["series"][0]["values"] == ["nan"]


@pytest.mark.parametrize("bad", [0, -1])
def test_max_steps_must_be_positive(bad):
    from neuron_workbench.cell.settings import CompareOptions
    from neuron_workbench.errors import OptionError

    with pytest.raises(OptionError):
        CompareOptions(max_steps=bad).validate()

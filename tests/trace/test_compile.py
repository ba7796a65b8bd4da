"""The compile instrument's recording of Dynamo's logs, around a run."""

import logging

import pytest
import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.trace.compile import (
    _GRAPH_BREAK_LOGGER,
    _recording,
    compile_instrument,
    graph_break_violation,
)


def test_recording_turns_the_graph_loggers_on_and_leaves_them_as_they_were():
    loggers = [logging.getLogger(_GRAPH_BREAK_LOGGER)]
    other = logging.getLogger("neuron_workbench.tests.bystander")
    other.setLevel(logging.INFO)
    assert other.isEnabledFor(logging.INFO)  # its answer is cached now
    before = [(each.level, each.propagate, each.isEnabledFor(logging.DEBUG)) for each in loggers]
    with _recording("<cell>", get_backend("cpu")):
        for each in loggers:
            assert each.isEnabledFor(logging.DEBUG)
            assert each.propagate is False
        assert other.isEnabledFor(logging.INFO)
        assert not other.isEnabledFor(logging.DEBUG)
    after = [(each.level, each.propagate, each.isEnabledFor(logging.DEBUG)) for each in loggers]
    assert after == before


BREAKING = """import torch


def f(t):
    t = t.sin()
    print("inside")
    return t.cos()


y = torch.compile(f, backend="eager")(torch.ones(3))
"""


@pytest.mark.parametrize(
    ("filename", "file"),
    [("<neuron-cell-9001>", "cell"), ("breaks.py", "breaks.py"), ("/abs/b.py", "/abs/b.py")],
)
def test_only_a_cells_pseudo_file_marks_its_breaks_as_cell_lines(filename, file, capsys):
    # A script is compiled under its own path: its breaks read `breaks.py:6`, not `cell line 6`
    torch._dynamo.reset()
    with compile_instrument(filename)(get_backend("cpu")) as record:
        exec(compile(BREAKING, filename, "exec"), {"__name__": "__main__"})
    assert [(b["file"], b["line"]) for b in record.graph_breaks] == [(file, 6)]
    assert {graph["file"] for graph in record.graphs} == {file}
    where = "cell line 6" if file == "cell" else f"{file}:6"
    assert f"the first at {where}: " in graph_break_violation(record.graph_breaks, "cpu")

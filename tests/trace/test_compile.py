"""The compile instrument's recording of Dynamo's logs, around a run."""

import logging

from neuron_workbench.backends import get_backend
from neuron_workbench.trace.compile import _GRAPH_BREAK_LOGGER, _GRAPH_CODE_LOGGER, _recording


def test_recording_turns_the_graph_loggers_on_and_leaves_them_as_they_were():
    loggers = [logging.getLogger(_GRAPH_BREAK_LOGGER), logging.getLogger(_GRAPH_CODE_LOGGER)]
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

"""nbval settings for the guided notebooks.

Only cells marked ``# NBVAL_CHECK_OUTPUT`` have their output compared (the suite runs
``--nbval-lax``); those print deterministic verdict text. HTML and Plotly outputs carry timings or
random ids, so they are never compared even in strict mode.
"""

import os

# A notebook kernel must not inherit an emulated device from the environment of the test run.
os.environ.pop("NEURON_WORKBENCH_EMULATE", None)


def pytest_collectstart(collector):
    """Skip volatile MIME types in nbval's output comparison."""
    if hasattr(collector, "skip_compare"):
        collector.skip_compare = (
            *collector.skip_compare,
            "text/html",
            "application/vnd.plotly.v1+json",
            "application/vnd.neuron-workbench.report+json",
        )

import pytest
from artifact_builders import CELL, run_cell


@pytest.fixture(scope="session")
def small_runs():
    """One cell run on cpu and on the emulated neuron device."""
    return {"ref": run_cell(CELL, "cpu"), "target": run_cell(CELL, "neuron")}


@pytest.fixture(scope="session")
def small_artifact(tmp_path_factory, small_runs):
    from neuron_workbench.artifacts import save

    path = tmp_path_factory.mktemp("artifact") / "small.nwrun.zip"
    return save(path, runs=small_runs, cell_source=CELL)

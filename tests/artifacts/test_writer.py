"""What the writer cannot turn into data is recorded with the reason, never dropped silently."""

import dataclasses

from artifact_builders import CELL, manifest_of, run_cell

from neuron_workbench.artifacts import load, save
from neuron_workbench.artifacts.writer import _lenient_json


class Broken:
    def to_dict(self):
        raise ValueError("half-built")

    def __str__(self):
        return "Broken()"


class Fine:
    def to_dict(self):
        return {"k": (1, 2.5, float("nan"))}


def test_a_failing_to_dict_is_kept_as_its_text_and_the_error():
    assert _lenient_json(Broken()) == "Broken() (to_dict() failed: ValueError: half-built)"
    assert _lenient_json({"a": [Broken()]}) == {
        "a": ["Broken() (to_dict() failed: ValueError: half-built)"]
    }
    assert _lenient_json(Fine()) == {"k": [1, 2.5, "nan"]}


def test_the_failure_reaches_the_manifest_and_the_artifact_still_loads(tmp_path):
    run = run_cell(CELL, "cpu")
    run = dataclasses.replace(run, steps=[Fine(), Broken()])
    path = save(tmp_path / "a.nwrun.zip", runs={"ref": run}, cell_source=CELL)
    steps = manifest_of(path)["runs"]["ref"]["steps"]
    assert steps == [{"k": [1, 2.5, "nan"]}, "Broken() (to_dict() failed: ValueError: half-built)"]
    assert load(path).runs["ref"].backend == run.backend


def test_an_int_too_large_for_json_is_listed_as_not_recorded_and_the_artifact_loads(tmp_path):
    # json.dumps of 10**5000 hit Python's int-to-str limit (4300 digits): a traceback, no file
    run = run_cell(CELL, "cpu")
    run = dataclasses.replace(run, outputs={**run.outputs, "big": 10**5000, "fits": 10**4299})
    path = save(tmp_path / "a.nwrun.zip", runs={"ref": run}, cell_source=CELL)
    data = manifest_of(path)["runs"]["ref"]
    reason = "an int of more than 4300 digits is not recorded"
    assert data["skipped_outputs"] == [{"path": "big", "reason": reason}]
    (leaf,) = [leaf for leaf in data["outputs"] if leaf["path"] == "big"]
    assert leaf == {"path": "big", "kind": "not-compared", "value": reason}
    loaded = load(path).runs["ref"]
    assert loaded.outputs["big"].reason == reason and loaded.outputs["fits"] == 10**4299

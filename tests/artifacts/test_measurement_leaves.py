"""Measurements and scalars made from tensors keep their provenance in a recorded artifact."""

import pytest
from artifact_builders import manifest_of, rewrite

from neuron_workbench.artifacts import ArtifactError, load, save
from neuron_workbench.backends import BackendInfo
from neuron_workbench.compare import compare_outputs
from neuron_workbench.run import Run
from neuron_workbench.run.measurements import (
    Provenance,
    TaggedFloat,
    TaggedInt,
    TaggedStr,
    provenance_of,
)

MS = Provenance("time", "torch.cuda.Event.elapsed_time", "ms")
PEAK = Provenance("memory", "torch.cuda.max_memory_allocated", "B")
NAME = Provenance("device", "torch.cuda.get_device_name")
LOSS = Provenance("tensor", "Tensor.item", dtype="float32")


def _saved(tmp_path):
    outputs = {
        "step_ms": TaggedFloat(12.5, MS),
        "stats": {"peak": TaggedInt(4096, PEAK), "name": TaggedStr("cpu", NAME)},
        "loss": TaggedFloat(0.25, LOSS),
        "plain": 1.5,
    }
    run = Run(backend=BackendInfo("cpu", "cpu", "host"), outputs=outputs)
    return save(tmp_path / "m.nwrun.zip", runs={"ref": run}, cell_source="x = 1")


def test_provenance_round_trips_and_the_recording_compares_as_live(tmp_path):
    path = _saved(tmp_path)
    leaves = {leaf["path"]: leaf for leaf in manifest_of(path)["runs"]["ref"]["outputs"]}
    assert leaves["step_ms"]["provenance"] == {
        "kind": "time",
        "source": "torch.cuda.Event.elapsed_time",
        "unit": "ms",
    }
    assert "provenance" not in leaves["plain"]
    loaded = load(path).runs["ref"].outputs
    assert provenance_of(loaded["step_ms"]) == MS
    assert provenance_of(loaded["stats['peak']"]) == PEAK
    assert provenance_of(loaded["stats['name']"]) == NAME
    assert provenance_of(loaded["loss"]) == LOSS
    comparison = compare_outputs(loaded, loaded)
    assert [m.path for m in comparison.measurements] == [
        "step_ms",
        "stats['peak']",
        "stats['name']",
    ]
    assert [(d.path, d.ref_dtype) for d in comparison.diffs] == [
        ("loss", "float32"),
        ("plain", "float64"),
    ]


@pytest.mark.parametrize(
    "provenance",
    [[1], {"kind": "time"}, {"kind": 1, "source": "x"}, {"kind": "time", "source": "x", "unit": 2}],
)
def test_a_malformed_provenance_is_one_clear_error(tmp_path, provenance):
    path = _saved(tmp_path)
    manifest = manifest_of(path)
    manifest["runs"]["ref"]["outputs"][0]["provenance"] = provenance
    bad = rewrite(path, tmp_path / "bad.nwrun.zip", manifest=manifest)
    with pytest.raises(ArtifactError) as error:
        load(bad)
    assert "provenance" in str(error.value) and "\n" not in str(error.value)


def test_texts_made_of_measurements_stay_measurements_in_recorded_runs(tmp_path):
    from neuron_workbench.cli.commands.compare import report_of_artifacts
    from neuron_workbench.run.records import RunFacts

    def recorded(name, text, ms):
        facts = RunFacts(
            measured_texts={ms: ("time", "time.perf_counter")},
            measured_values={float(ms): ("time", "time.perf_counter")},
        )
        run = Run(backend=BackendInfo("cpu", "cpu", "host"), outputs={"line": text}, facts=facts)
        return save(tmp_path / f"{name}.nwrun.zip", runs={"ref": run}, cell_source="x = 1")

    a = recorded("a", "took 12.50 ms", "12.50")
    b = recorded("b", "took 3.75 ms", "3.75")
    facts = load(a).runs["ref"].facts
    assert facts.measured_texts == {"12.50": ("time", "time.perf_counter")}
    assert facts.measured_values == {12.5: ("time", "time.perf_counter")}
    report = report_of_artifacts(load(a), load(b))
    assert report.verdict != "FAIL", report.summary()
    (measured,) = report.measurements()
    assert (measured["path"], measured["ref"], measured["target"]) == (
        "line",
        "took 12.50 ms",
        "took 3.75 ms",
    )

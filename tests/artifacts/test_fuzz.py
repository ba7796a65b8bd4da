"""Property: whatever the manifest or the bytes hold, load() succeeds or raises ArtifactError."""

import copy
import json
import tempfile
from pathlib import Path

import pytest
from artifact_builders import manifest_of, read_entries, write_zip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_workbench.artifacts import ArtifactError, load
from neuron_workbench.cli.commands.compare import report_of_artifacts
from neuron_workbench.cli.commands.show import summarize
from neuron_workbench.report.html import render_page

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**400, -(10**400), 2**64])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["float32", "bfloat16", "tensor", "ref", "tensors/ref.safetensors", "../x"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

SETTINGS = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory):
    """A small artifact with every leaf kind, so each example is cheap."""
    import torch

    from neuron_workbench.artifacts import save
    from neuron_workbench.backends import BackendInfo
    from neuron_workbench.run import Run

    outputs = {"x": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([True]), "n": 1, "f": 0.5}
    outputs |= {
        "s": "text",
        "z": 1j,
        "raw": b"\x01",
        "none": None,
        "c": torch.ones(1, dtype=torch.complex128),
    }
    ref = Run(BackendInfo("cpu", "cpu", "host"), outputs=outputs)
    target = Run(
        BackendInfo("neuron", "neuron:0", "emulated", True, {"profile": "p"}),
        outputs={"x": torch.zeros(2, 3)},
        fallbacks=[{"op": "aten::sort", "count": 1, "site": {"file": "<cell>", "line": 2}}],
        wall_time_s=0.1,
    )
    path = tmp_path_factory.mktemp("fuzz") / "tiny.nwrun.zip"
    return save(
        path, runs={"ref": ref, "target": target}, cell_source="x = 1", report={"verdict": "PASS"}
    )


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def _paths(value, prefix=()):
    """Every location in a JSON document, as key/index tuples."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _load_only_artifact_errors(path):
    try:
        artifact = load(path)
    except ArtifactError as exc:
        assert "\n" not in str(exc)
        return None
    return artifact


@SETTINGS
@given(data=st.data())
def test_fuzzed_manifests_raise_only_artifact_error(tiny_artifact, scratch, data):
    entries = read_entries(tiny_artifact)
    manifest = manifest_of(tiny_artifact)
    mutated = copy.deepcopy(manifest)
    for _ in range(data.draw(st.integers(1, 3))):
        locations = [p for p in _paths(mutated) if p]
        location = data.draw(st.sampled_from(locations))
        parent = mutated
        for key in location[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[location[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(json_values)
        else:
            parent[location[-1]] = data.draw(json_values)
    payload = json.dumps(mutated).encode()
    entries.pop("mimetype")
    entries["manifest.json"] = payload
    path = scratch / "fuzz.zip"
    write_zip(path, entries)
    artifact = _load_only_artifact_errors(path)
    if artifact is not None:  # what loaded is what the manifest says, and the commands can use it
        assert set(artifact.runs) == set(mutated["runs"])
        summarize(artifact)
        if len(artifact.runs) <= 2:
            data = report_of_artifacts(artifact, artifact).to_dict()
            render_page([data])


@SETTINGS
@given(data=st.data())
def test_fuzzed_bytes_raise_only_artifact_error(tiny_artifact, scratch, data):
    raw = bytearray(tiny_artifact.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "splat"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "flip" and raw:
            raw[at] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        else:
            blob = data.draw(st.binary(min_size=1, max_size=8))
            raw[at : at + len(blob)] = blob
    path = scratch / "bytes.zip"
    path.write_bytes(bytes(raw))
    _load_only_artifact_errors(path)

"""save() then load() gives back what was saved, and comparing against a recording equals live."""

import hashlib
import math
import zipfile

import numpy as np
import pytest
import torch
from artifact_builders import CELL, bits, manifest_of, run_cell

from neuron_workbench.artifacts import (
    FORMAT_VERSION,
    MEDIA_TYPE,
    load,
    save,
    source_mismatch_warning,
)
from neuron_workbench.backends import BackendInfo
from neuron_workbench.cell.pipeline import compare_cell
from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.compare import compare_outputs
from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.run import Run, RunError, compile_cell
from neuron_workbench.run.records import NotCompared


def test_every_tensor_dtype_and_scalar_kind_round_trips_bitwise(tmp_path):
    special = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-45, 3.0])
    outputs = {
        "f32": special,
        "f64": special.double(),
        "f16": special.half(),
        "bf16": special.bfloat16(),
        "c64": torch.complex(special, -special),
        "c128": torch.complex(special.double(), special.double().flip(0)),
        "i64": torch.tensor([-(2**63), 2**63 - 1, 0]),
        "i32": torch.tensor([-(2**31), 7], dtype=torch.int32),
        "i16": torch.tensor([-3], dtype=torch.int16),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([255, 0], dtype=torch.uint8),
        "u16": torch.tensor([65535], dtype=torch.uint16),
        "u32": torch.tensor([2**32 - 1], dtype=torch.uint32),
        "u64": torch.tensor([5], dtype=torch.uint64),
        "bool": torch.tensor([True, False, True]),
        "f8": torch.tensor([1.5, -2.0]).to(torch.float8_e4m3fn),
        "f8b": torch.tensor([1.5, -2.0]).to(torch.float8_e5m2),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "strided": torch.arange(24.0).reshape(4, 6)[:, ::2].t(),  # a non-contiguous view
        "conj": torch.complex(torch.ones(2), torch.ones(2)).conj(),
        "param": torch.nn.Parameter(torch.ones(2)),
        "np": np.arange(6, dtype=np.float32).reshape(2, 3),
        "np_scalar": np.float64(0.25),
        "values": [
            1,
            True,
            2.5,
            float("nan"),
            -0.0,
            float("-inf"),
            3 + 4j,
            "text",
            b"\x00\xff",
            None,
        ],
        "big_int": 2**80,
        "gone": NotCompared("could not be sent back from the neuron worker process (TypeError)"),
    }
    run = Run(backend=BackendInfo("cpu", "cpu", "host"), outputs=outputs)
    loaded = load(save(tmp_path / "a.nwrun.zip", runs={"ref": run}, cell_source="x = 1")).runs[
        "ref"
    ]
    expected = dict(iter_leaves(outputs))
    assert list(loaded.outputs) == list(expected)
    for path, value in expected.items():
        got = loaded.outputs[path]
        if isinstance(value, torch.Tensor):
            assert type(got) is torch.Tensor and got.device.type == "cpu", path
            want = value.detach().resolve_conj()
            assert got.dtype == want.dtype and got.shape == want.shape, path
            assert torch.equal(bits(got), bits(want)), path
        elif isinstance(value, np.ndarray | np.generic):
            assert isinstance(got, np.ndarray) and got.dtype == np.asarray(value).dtype, path
            assert got.shape == np.asarray(value).shape
            assert got.tobytes() == np.asarray(value).tobytes(), path
        elif isinstance(value, float) and math.isnan(value):
            assert isinstance(got, float) and math.isnan(got)
        elif isinstance(value, float):
            assert type(got) is float and math.copysign(1, got) == math.copysign(1, value)
            assert got == value
        else:
            assert type(got) is type(value) and got == value, path


def test_run_fields_environment_and_cell_round_trip(tmp_path, small_runs):
    error_run = Run(
        backend=BackendInfo("neuron", "neuron:0", "emulated", True, {"profile": "p"}),
        error=RunError("RuntimeError", "boom\nsecond line", 3, "y = f(x)"),
        fallbacks=[{"op": "aten::sort", "count": 2, "site": {"file": "<c>", "line": 4}}],
        wall_time_s=0.25,
        shared_names=["gen"],
        stdout="printed\n",
        extras={
            "layers": {"a": [1, 2]},
            "live": object(),
            "obj": type("X", (), {"to_dict": lambda self: {"k": 1}})(),
        },
    )
    source = "y = f(x)\n# ünïcode\n"
    path = save(
        tmp_path / "e.nwrun.zip",
        runs={"ref": small_runs["ref"], "target": error_run},
        cell_source=source,
        report={"verdict": "ERROR", "nan": float("nan")},
    )
    artifact = load(path)
    assert artifact.path == path and artifact.cell_source == source
    assert artifact.cell_sha256 == hashlib.sha256(source.encode()).hexdigest()
    assert artifact.report == {"verdict": "ERROR", "nan": "nan"}
    env = artifact.environment
    assert (
        env["torch"] == torch.__version__
        and env["workbench"]
        and env["python"]
        and env["created"].endswith("Z")
    )
    target = artifact.runs["target"]
    assert target.backend == error_run.backend and target.error == error_run.error
    assert target.fallbacks == error_run.fallbacks and target.fallback_ops() == ["aten::sort"]
    assert (
        target.wall_time_s == 0.25
        and target.shared_names == ["gen"]
        and target.stdout == "printed\n"
    )
    assert target.extras == {"layers": {"a": [1, 2]}, "obj": {"k": 1}}
    assert manifest_of(path)["runs"]["target"]["extras_skipped"] == ["live"]
    ref = artifact.runs["ref"]
    assert ref.backend == small_runs["ref"].backend and ref.memory == small_runs["ref"].memory
    assert artifact.manifest["format_version"] == FORMAT_VERSION


def test_file_layout_is_a_zip_with_mimetype_first_and_stored_tensors(small_artifact):
    raw = small_artifact.read_bytes()
    assert raw[:4] == b"PK\x03\x04" and raw[30:38] == b"mimetype"
    assert raw[38 : 38 + len(MEDIA_TYPE)] == MEDIA_TYPE.encode()
    with zipfile.ZipFile(small_artifact) as archive:
        infos = {i.filename: i for i in archive.infolist()}
    assert list(infos) == [
        "mimetype",
        "manifest.json",
        "tensors/ref.safetensors",
        "tensors/target.safetensors",
    ]
    assert infos["tensors/ref.safetensors"].compress_type == zipfile.ZIP_STORED


def test_recording_only_the_reference_and_mismatch_warning(tmp_path, small_runs):
    artifact = load(
        save(tmp_path / "r.nwrun.zip", runs={"ref": small_runs["ref"]}, cell_source=CELL)
    )
    assert list(artifact.runs) == ["ref"]
    assert source_mismatch_warning(artifact, CELL) is None
    warning = source_mismatch_warning(artifact, CELL + "\nz = 1")
    assert (
        "r.nwrun.zip ran a different cell source" in warning
        and artifact.cell_sha256[:12] in warning
    )
    assert "\n" not in warning


def test_saving_writes_only_the_file_atomically(tmp_path, small_runs):
    folder = tmp_path / "out" / "deeper"
    target = folder / "run.nwrun.zip"
    save(target, runs={"ref": small_runs["ref"]}, cell_source=CELL)
    first = target.read_bytes()
    save(target, runs={"ref": small_runs["target"]}, cell_source=CELL)  # replaces it whole
    assert sorted(p.name for p in folder.iterdir()) == ["run.nwrun.zip"]
    assert target.read_bytes() != first and load(target).runs["ref"].backend.name == "neuron"
    with pytest.raises(ValueError, match="invalid run role"):
        save(tmp_path / "x.zip", runs={"../evil": small_runs["ref"]}, cell_source="")
    assert not (tmp_path / "x.zip").exists()


def test_comparing_against_a_recording_gives_the_same_paths_and_results(small_artifact, small_runs):
    live = compare_outputs(small_runs["ref"].outputs, small_runs["target"].outputs)
    recorded = load(small_artifact)
    against = compare_outputs(recorded.runs["ref"].outputs, small_runs["target"].outputs)
    both = compare_outputs(recorded.runs["ref"].outputs, recorded.runs["target"].outputs)
    assert (
        [d.path for d in live.diffs]
        == [d.path for d in against.diffs]
        == [d.path for d in both.diffs]
    )
    assert "out['logits'][0]" in [d.path for d in live.diffs] and "model.weight.grad" in [
        d.path for d in live.diffs
    ]
    assert (
        [d.to_dict() for d in live.diffs]
        == [d.to_dict() for d in against.diffs]
        == [d.to_dict() for d in both.diffs]
    )


FAILING = "flag = torch.tensor([1.0]) + (1.0 if torch.zeros(1, device='cuda').device.type != 'cpu' else 0.0)"


@pytest.mark.parametrize("cell", [CELL, FAILING], ids=["pass-with-fallback", "numeric-fail"])
def test_against_a_recording_reproduces_the_live_verdict(tmp_path, cell):
    # seeded, as a recorded cell is (the session seeds --record and --against runs with 0)
    live = compare_cell(
        compile_cell(cell), {"torch": torch}, CompareOptions(ref="cpu", target="neuron", seed=0)
    ).report
    path = save(
        tmp_path / "ref.nwrun.zip", runs={"ref": live.ref}, cell_source=cell, report=live.to_dict()
    )
    recorded = load(path)
    target = run_cell(cell, "neuron", {"torch": torch})
    comparison = compare_outputs(recorded.runs["ref"].outputs, target.outputs)
    assert comparison.passed == live.comparison.passed
    assert [d.status for d in comparison.diffs] == [d.status for d in live.comparison.diffs]
    assert recorded.report["verdict"] == live.verdict


def test_layer_statistics_and_op_profile_are_kept(tmp_path):
    from neuron_workbench.cli.commands.compare import report_of_artifacts
    from neuron_workbench.trace.profile import op_profiler

    cell = (
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).cuda()\n"
        "y = m(torch.randn(2, 4, device='cuda'))\n"
    )
    live = compare_cell(
        compile_cell(cell),
        {"torch": torch},
        CompareOptions(ref="cpu", target="neuron", layers=True),
        instruments={"profile": op_profiler},
    ).report
    path = save(
        tmp_path / "l.nwrun.zip",
        runs={"ref": live.ref, "target": live.target},
        cell_source=cell,
        report=live.to_dict(),
    )
    artifact = load(path)
    for role in ("ref", "target"):
        extras = artifact.runs[role].extras
        assert isinstance(extras["layers"], dict) and isinstance(extras["profile"], dict)
        assert extras["profile"] == live.to_dict()[role]["profile"]
    again = report_of_artifacts(artifact, artifact).to_dict()
    assert again["layers"] == live.to_dict()["layers"]
    assert again["verdict"] == live.verdict

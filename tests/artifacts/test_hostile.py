"""Hostile artifacts: each gives one documented line (ArtifactError; exit 2 on the command line).

Nothing is unpickled or executed, nothing is written anywhere, and sizes are checked before data
is read.
"""

import copy
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from importlib import resources

import pytest
import torch
from artifact_builders import manifest_of, read_entries, rewrite, write_zip

from neuron_workbench.artifacts import ArtifactError, load
from neuron_workbench.cli.main import main


class Trap:
    """Creating this file proves a pickle was executed."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def pickle_bytes(sentinel):
    return pickle.dumps(Trap(sentinel))


def snapshot(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A work folder that is also the current directory; the test checks nothing else appears."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def expect(path, fragment, capsys):
    """load() raises ArtifactError with one line containing ``fragment`` and the file's name; the
    command line (``show``) prints exactly that line and exits 2."""
    with pytest.raises(ArtifactError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message and fragment in message and str(path) in message, message
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"neuron-workbench: error: {message}\n"
    return message


def test_pickle_payloads_are_never_unpickled(sandbox, small_artifact, capsys):
    sentinel = sandbox / "PWNED"
    before = snapshot(sandbox)
    # A torch.save file is a zip of pickles: refused at the magic check.
    torch.save({"x": Trap(sentinel)}, sandbox / "model.pt")
    expect(sandbox / "model.pt", "is a zip file but not a neuron-workbench artifact", capsys)
    # A pickle smuggled in as an extra entry.
    rewrite(small_artifact, sandbox / "extra.zip", add={"payload.pkl": pickle_bytes(sentinel)})
    expect(sandbox / "extra.zip", "unexpected entry 'payload.pkl'", capsys)
    # A pickle in place of the tensor data.
    rewrite(
        small_artifact,
        sandbox / "swap.zip",
        add={"tensors/ref.safetensors": pickle_bytes(sentinel)},
    )
    expect(sandbox / "swap.zip", "tensors/ref.safetensors", capsys)
    # A bare pickle file.
    (sandbox / "bare.pkl").write_bytes(pickle_bytes(sentinel))
    expect(sandbox / "bare.pkl", "bad magic bytes", capsys)
    assert not sentinel.exists()
    assert snapshot(sandbox) == sorted(before + ["model.pt", "extra.zip", "swap.zip", "bare.pkl"])


@pytest.mark.parametrize(
    "entry",
    [
        "../evil.safetensors",
        "tensors/../../evil",
        "/etc/evil",
        "tensors/ref.safetensors/../x",
        "C:/evil",
        "a\\..\\b",
    ],
)
def test_entry_names_cannot_escape(sandbox, small_artifact, entry, capsys):
    path = rewrite(small_artifact, sandbox / "a.zip", add={entry: b"x"})
    expect(path, "unsafe entry name", capsys)
    assert snapshot(sandbox.parent) == ["work", "work/a.zip"]


def test_a_declared_tensor_far_larger_than_the_file(sandbox, small_artifact, capsys):
    manifest = manifest_of(small_artifact)
    leaf = next(x for x in manifest["runs"]["ref"]["outputs"] if x["kind"] == "tensor")
    assert leaf["dtype"] == "float32"
    leaf["shape"] = [2**31, 2**31]
    leaf["nbytes"] = 2**31 * 2**31 * 4  # 16 EiB, consistent with the shape: only the file disagrees
    path = rewrite(small_artifact, sandbox / "big.zip", manifest=manifest)
    message = expect(path, "bytes of tensors but tensors/ref.safetensors holds only", capsys)
    declared = int(message.split("declares ")[1].split(" ")[0])
    assert declared >= 2**31 * 2**31 * 4


def test_a_safetensors_header_declaring_data_beyond_its_entry(sandbox, small_artifact, capsys):
    blob = read_entries(small_artifact)["tensors/ref.safetensors"]
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    key = next(k for k in header if k != "__metadata__")
    header[key]["data_offsets"][1] += 10**12
    raw = json.dumps(header).encode()
    forged = struct.pack("<Q", len(raw)) + raw + blob[8 + length :]
    path = rewrite(small_artifact, sandbox / "h.zip", add={"tensors/ref.safetensors": forged})
    expect(path, "does not hold", capsys)
    huge_header = struct.pack("<Q", 2**60) + blob[8:]
    path = rewrite(small_artifact, sandbox / "h2.zip", add={"tensors/ref.safetensors": huge_header})
    expect(path, "declares a 1152921504606846976-byte header", capsys)


def test_a_zip_entry_declaring_more_bytes_than_the_file(sandbox, small_artifact, capsys):
    raw = bytearray(small_artifact.read_bytes())
    # Patch the central directory's compressed and uncompressed size of the last entry.
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 20 : cd + 28] = struct.pack("<II", 2**31, 2**31)
    path = sandbox / "sizes.zip"
    path.write_bytes(bytes(raw))
    expect(path, "declares 2147483648 bytes but the file has only", capsys)


@pytest.mark.parametrize("keep", [0.999, 0.9, 0.6, 0.3, 0.05])
def test_truncated_files(sandbox, small_artifact, keep, capsys):
    raw = small_artifact.read_bytes()
    path = sandbox / "cut.zip"
    path.write_bytes(raw[: int(len(raw) * keep)])
    expect(path, "truncated", capsys)


def test_corrupt_tensor_bytes_fail_the_crc(sandbox, small_artifact, capsys):
    raw = bytearray(small_artifact.read_bytes())
    with zipfile.ZipFile(small_artifact) as archive:
        info = archive.getinfo("tensors/target.safetensors")
    data_start = info.header_offset + 30 + len(info.filename)
    raw[data_start + info.file_size - 3] ^= 0xFF  # inside the tensor data, after the header
    path = sandbox / "crc.zip"
    path.write_bytes(bytes(raw))
    expect(path, "is corrupt", capsys)


def test_wrong_magic_and_formats(sandbox, small_artifact, capsys):
    (sandbox / "text.zip").write_text("hello, not a zip")
    expect(sandbox / "text.zip", "bad magic bytes", capsys)
    (sandbox / "empty.zip").write_bytes(b"")
    expect(sandbox / "empty.zip", "is empty", capsys)
    write_zip(sandbox / "nomime.zip", {"manifest.json": b"{}"}, mimetype=False)
    expect(sandbox / "nomime.zip", "its first entry is not 'mimetype'", capsys)
    manifest = manifest_of(small_artifact)
    for version, fragment in [
        (2, "written by a newer neuron-workbench (artifact format 2; this version reads format 1)"),
        (0, "uses artifact format 0, which this neuron-workbench no longer reads"),
        ("1", "format_version must be an integer, not a string"),
    ]:
        path = rewrite(
            small_artifact,
            sandbox / f"v{version}.zip",
            manifest={**manifest, "format_version": version},
        )
        expect(path, fragment, capsys)
    path = rewrite(small_artifact, sandbox / "fmt.zip", manifest={**manifest, "format": "other"})
    expect(path, "is not a neuron-workbench run artifact", capsys)


def test_non_utf8_deep_and_invalid_json(sandbox, small_artifact, capsys):
    good = json.dumps(manifest_of(small_artifact)).encode()
    cases = {
        "latin1": (good.replace(b'"lin"', b'"l\xefn"'), "manifest.json is not valid UTF-8"),
        "deep": (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64 levels"),
        "deep_obj": (b'{"a":' * 5000 + b"1" + b"}" * 5000, "nested deeper than 64 levels"),
        "nan": (
            good.replace(b'"wall_time_s": ', b'"wall_time_s": NaN, "x": ', 1),
            "NaN is not valid JSON",
        ),
        "dup": (b'{"format": 1, "format": 2}', "duplicate key 'format'"),
        "broken": (good[:-5], "manifest.json is not valid JSON"),
        "list": (b"[]", "the manifest must be an object, not a list"),
    }
    for name, (payload, fragment) in cases.items():
        path = rewrite(small_artifact, sandbox / f"{name}.zip", manifest=payload)
        expect(path, fragment, capsys)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (
            lambda m: m["runs"]["ref"]["outputs"][0].update(dtype="object"),
            "is not a supported tensor dtype",
        ),
        (
            lambda m: m["runs"]["ref"]["outputs"][0].update(shape=[-1, 4]),
            "shape[0] must not be negative",
        ),
        (
            lambda m: m["runs"]["ref"]["outputs"][0].update(shape=[3, True]),
            "must be an integer, not a boolean",
        ),
        (
            lambda m: m["runs"]["ref"]["outputs"][0].update(nbytes=1),
            "does not match its dtype and shape",
        ),
        (
            lambda m: m["runs"]["ref"].update(tensor_file="../../x.safetensors"),
            "tensor_file must be",
        ),
        (lambda m: m["runs"].update({"../x": m["runs"]["ref"]}), "is not a valid role name"),
        (lambda m: m["runs"].clear(), "holds no runs"),
        (lambda m: m["runs"]["ref"]["backend"].pop("name"), "runs.ref.backend lacks 'name'"),
        (lambda m: m["cell"].update(sha256="x"), "cell.sha256 must be 64 lowercase hex digits"),
        (
            lambda m: m["runs"]["ref"]["outputs"].append(dict(m["runs"]["ref"]["outputs"][0])),
            "repeats the path",
        ),
        (lambda m: m["runs"]["ref"]["outputs"][0].update(kind="pickle"), "kind must be one of"),
    ],
)
def test_manifest_validation(sandbox, small_artifact, mutate, fragment, capsys):
    manifest = manifest_of(small_artifact)
    mutate(manifest)
    path = rewrite(small_artifact, sandbox / "m.zip", manifest=manifest)
    expect(path, fragment, capsys)


def _schema_defs():
    text = resources.files("neuron_workbench.report").joinpath("report.schema.json").read_text()
    return json.loads(text)["$defs"]


def _typed_fields(node, defs, path=()):
    """(path, JSON types, minimum) of every field under ``node`` that the schema gives a type."""
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    types = node.get("type")
    if types and path:
        yield path, {types} if isinstance(types, str) else set(types), node.get("minimum")
    for key, child in node.get("properties", {}).items():
        yield from _typed_fields(child, defs, (*path, key))
    if "items" in node:
        yield from _typed_fields(node["items"], defs, (*path, 0))


#: Where each run field of the report comes from in the manifest's run; None for those the report
#: makes itself (label, ok, time_kind) and for facts, which the loader restores field by field
#: (a value of the wrong shape is dropped: the report writes the run's own, always an object).
_RUN_SOURCES = {"label": None, "ok": None, "time_kind": None, "facts": None}
_RUN_SOURCES |= {"compile": ("extras", "compile"), "profile": ("extras", "profile")}
#: A valid value to put where the artifact has none, so that only the field under test is wrong.
_SEEDS = {("error",): {"type": "RuntimeError", "message": "m"}}
_CANDIDATES = ["text", 7, 0.5, [1], {"k": 1}, True, None]


def _json_types(value):
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    names = {float: "number", str: "string", list: "array", dict: "object", type(None): "null"}
    return {names[type(value)]}


def _run_field_cases():
    """Every typed field of a report's run, with each value of a wrong type or below its minimum."""
    defs = _schema_defs()
    for path, types, minimum in _typed_fields(defs["run"], defs):
        source = _RUN_SOURCES.get(path[0], (path[0],))
        if source is None:
            continue
        location = (*source, *path[1:])
        for value in _CANDIDATES:
            if not _json_types(value) & types:
                yield location, value
        if minimum is not None:
            yield location, minimum - 1


def _put(run, location, value):
    """Set ``run`` at ``location``, making (or seeding) the containers on the way."""
    parent = run
    for depth, key in enumerate(location):
        if isinstance(parent, list) and key == len(parent):
            parent.append(None)
        if depth == len(location) - 1:
            parent[key] = value
            return
        current = parent[key] if isinstance(parent, list) or key in parent else None
        if not isinstance(current, dict | list):
            seed = _SEEDS.get(location[: depth + 1])
            empty = [] if location[depth + 1] == 0 else {}
            current = parent[key] = copy.deepcopy(seed) if seed else empty
        parent = current


def test_every_run_field_the_report_schema_types_is_checked_on_load(sandbox, small_artifact):
    # A fallback's site edited to a number loaded, and `compare --json` wrote a report that failed
    # report.schema.json: each field the report carries from a run is checked when it is loaded.
    cases = list(_run_field_cases())
    assert ("fallbacks", 0, "site") in {location for location, _ in cases}
    assert ("extras", "compile", "graphs", 0, "line") in {location for location, _ in cases}
    manifest = manifest_of(small_artifact)
    assert manifest["runs"]["target"]["fallbacks"][0]["site"]  # a real event with a real site
    accepted = []
    for location, value in cases:
        edited = json.loads(json.dumps(manifest))
        _put(edited["runs"]["target"], location, value)
        path = rewrite(small_artifact, sandbox / "field.zip", manifest=edited)
        try:
            load(path)
        except ArtifactError as exc:
            assert "\n" not in str(exc) and "runs.target." in str(exc), str(exc)
        else:
            accepted.append((location, value))
    assert accepted == []


@pytest.mark.parametrize("site", [5, ["x.py", 3], "x.py:3"])
def test_a_fallback_site_of_the_wrong_type_is_a_damaged_artifact(
    sandbox, small_artifact, site, capsys
):
    manifest = manifest_of(small_artifact)
    manifest["runs"]["target"]["fallbacks"][0]["site"] = site
    path = rewrite(small_artifact, sandbox / "site.zip", manifest=manifest)
    kind = {int: "a number", list: "a list", str: "a string"}[type(site)]
    expect(path, f"runs.target.fallbacks[0].site must be an object or null, not {kind}", capsys)


def test_missing_and_orphan_entries(sandbox, small_artifact, capsys):
    expect(
        rewrite(small_artifact, sandbox / "a.zip", drop=["tensors/ref.safetensors"]),
        "missing entry 'tensors/ref.safetensors'",
        capsys,
    )
    expect(
        rewrite(small_artifact, sandbox / "b.zip", drop=["manifest.json"]),
        "missing entry 'manifest.json'",
        capsys,
    )
    expect(
        rewrite(small_artifact, sandbox / "c.zip", add={"tensors/other.safetensors": b"x" * 16}),
        "belongs to no run",
        capsys,
    )
    deflated = read_entries(small_artifact)["tensors/ref.safetensors"]
    path = rewrite(
        small_artifact,
        sandbox / "d.zip",
        add={"tensors/ref.safetensors": (deflated, zipfile.ZIP_DEFLATED)},
    )
    expect(path, "uses an unsupported compression", capsys)


def test_missing_file_and_directory(sandbox, capsys):
    expect(sandbox / "nope.nwrun.zip", "no such artifact", capsys)
    with pytest.raises(ArtifactError, match="is a directory"):
        load(sandbox)


def test_command_line_prints_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(zipfile.ZipInfo("mimetype"), b"application/vnd.neuron-workbench.run+zip")
        archive.writestr("../../escape.txt", b"x")
    for args in (["show", str(path)],):
        done = subprocess.run(
            [sys.executable, "-m", "neuron_workbench.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        assert done.returncode == 2
        assert (
            done.stderr
            == f"neuron-workbench: error: {path}: unsafe entry name '../../escape.txt'\n"
        )
        assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.zip"]
    assert not (tmp_path.parent / "escape.txt").exists()


def _with_options(small_artifact, sandbox, edit):
    """``small_artifact`` with the report options a recording writes, edited by ``edit``."""
    from neuron_workbench.cell.settings import CompareOptions

    manifest = manifest_of(small_artifact)
    manifest["report"] = {"options": CompareOptions(ref="cpu", target="neuron").to_dict()}
    edit(manifest["report"])
    return rewrite(small_artifact, sandbox / "options.zip", manifest=manifest)


def _set(*keys, value):
    def edit(report):
        place = report
        for key in keys[:-1]:
            place = place[key]
        place[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (_set("options", value=5), "report.options must be an object or null, not a number"),
        (_set("options", value=[1]), "report.options must be an object or null, not a list"),
        (_set("options", "tolerance", value=5), "report.options.tolerance must be an object or"),
        (
            _set("options", "tolerance", value={"rtol": "x"}),
            "report.options.tolerance.rtol must be a non-negative number or null, not a string",
        ),
        (
            _set("options", "tolerance", value={"rtol": 0.1}),
            "report.options.tolerance must have both rtol and atol, or neither",
        ),
        (
            _set("options", "tolerance", "per_output", value={"n": [1]}),
            "report.options.tolerance.per_output['n'] must have 2 items, not 1",
        ),
        (_set("options", "steps", value=0), "report.options.steps must be at least 1"),
        (_set("options", "judge", value=5), "report.options.judge must be a string, not a number"),
    ],
)
def test_recorded_options_of_the_wrong_type_are_a_damaged_artifact(
    sandbox, small_artifact, edit, fragment, capsys
):
    # compare judges the runs with these: options of 5 or a tolerance of {"rtol": "x"} were a
    # TypeError traceback in compare
    assert load(_with_options(small_artifact, sandbox, lambda report: None)).report["options"]
    expect(_with_options(small_artifact, sandbox, edit), fragment, capsys)


def test_every_compare_option_is_checked_on_load(sandbox, small_artifact):
    # the option table sits above the artifacts, so the loader has its own list: a new option of
    # the compare group (what compare reads from a recording) needs its entry there
    from neuron_workbench.cell.options import COMPARE_GROUP, OPTIONS

    in_tolerance = ("preset", "rtol", "atol", "per_output")
    unchecked = []
    for option in OPTIONS:
        if option.group != COMPARE_GROUP:
            continue
        keys = ("options", "tolerance", option.name) if option.name in in_tolerance else None
        keys = keys or ("options", option.name)
        # an object is no option's type but per_output's (whose values are pairs)
        value = "x" if option.name == "per_output" else {"damaged": True}
        try:
            load(_with_options(small_artifact, sandbox, _set(*keys, value=value)))
        except ArtifactError as exc:
            assert ".".join(("report",) + keys) in str(exc)
        else:
            unchecked.append(option.name)
    assert unchecked == []


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        (5, "runs.ref.extras.profile.rows must be a list of objects or null, not a number"),
        ([5], "runs.ref.extras.profile.rows[0] must be an object, not a number"),
        ([{"op": "sort", "calls": "2"}], "runs.ref.extras.profile.rows[0].calls must be an"),
    ],
)
def test_a_profile_table_of_the_wrong_shape_is_a_damaged_artifact(
    sandbox, small_artifact, rows, fragment, capsys
):
    # the profile's op tables are untyped in report.schema.json, and compare --html crashed on
    # rows of 5
    manifest = manifest_of(small_artifact)
    manifest["runs"]["ref"]["extras"]["profile"] = {"steps": 1, "rows": [], "first_call": None}
    path = rewrite(small_artifact, sandbox / "profile.zip", manifest=manifest)
    assert load(path).runs["ref"].extras["profile"]["first_call"] is None
    manifest["runs"]["ref"]["extras"]["profile"]["rows"] = rows
    path = rewrite(small_artifact, sandbox / "profile.zip", manifest=manifest)
    expect(path, fragment, capsys)

"""Read an artifact safely: nothing is unpickled, executed or extracted, and sizes are checked first."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load

from neuron_workbench.artifacts._format import (
    DTYPES,
    MANIFEST_ENTRY,
    MAX_MANIFEST_BYTES,
    MAX_ROLES,
    MAX_SAFETENSORS_HEADER,
    MEDIA_TYPE,
    MIMETYPE_ENTRY,
    ROLE_PATTERN,
    SAFETENSORS_CODES,
    TENSOR_DIR,
    ArtifactError,
    parse_json,
    validate_manifest,
)
from neuron_workbench.backends.base import BackendInfo, MemoryStats
from neuron_workbench.run.measurements import Provenance, tag
from neuron_workbench.run.records import NotCompared, Run, RunError

_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30
# A zip whose first entry is ``mimetype``, stored, holding MEDIA_TYPE: the fixed prefix to check.
_MAGIC_NAME_OFFSET = _LOCAL_HEADER_SIZE


@dataclass
class RunArtifact:
    """A loaded artifact: its runs with flat outputs, the cell, the environment and the report.

    Attributes
    ----------
    runs : dict of str to Run
        Role (``ref``, ``target``) to :class:`~neuron_workbench.run.Run`. ``outputs`` is flat: output
        path (``model.fc.weight.grad``) to a CPU tensor bitwise equal to what was saved, or the saved
        number, string, bytes or None. NumPy outputs come back as NumPy arrays.
    cell_source, cell_sha256 : str
        The recorded cell and the sha256 of its UTF-8 bytes.
    environment : dict
        Versions and platform of the recording process, and ``created`` (UTC, ISO 8601).
    report : dict or None
        The recorded ``Report.to_dict()``, when a comparison was recorded.
    manifest : dict
        The validated manifest as read.
    path : pathlib.Path
        The file.
    """

    runs: dict[str, Run]
    cell_source: str
    cell_sha256: str
    environment: dict[str, Any]
    report: dict[str, Any] | None
    manifest: dict[str, Any] = field(repr=False)
    path: Path

    @property
    def created(self) -> str:
        """When the artifact was written (UTC, ISO 8601)."""
        return str(self.manifest.get("created", ""))


def source_mismatch_warning(artifact: RunArtifact, cell_source: str) -> str | None:
    """The warning to show when ``cell_source`` differs from the recorded cell, else None.

    The sources are compared by sha256 of their UTF-8 bytes.
    """
    current = hashlib.sha256(cell_source.encode("utf-8")).hexdigest()
    if current == artifact.cell_sha256:
        return None
    when = f", recorded {artifact.created}" if artifact.created else ""
    return (
        f"the recording {artifact.path.name} ran a different cell source than this one "
        f"(sha256 {artifact.cell_sha256[:12]} vs {current[:12]}{when})"
    )


def _check_magic(handle: IO[bytes], name: str, size: int) -> None:
    media = MEDIA_TYPE.encode("ascii")
    wanted = _MAGIC_NAME_OFFSET + len(MIMETYPE_ENTRY) + len(media)
    head = handle.read(wanted)
    if size == 0:
        raise ArtifactError(f"{name} is empty, not a neuron-workbench artifact")
    if not head.startswith(_LOCAL_HEADER):
        raise ArtifactError(f"{name} is not a neuron-workbench artifact (bad magic bytes)")
    if len(head) < wanted:
        raise ArtifactError(f"{name} is truncated ({size} bytes)")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    compression = struct.unpack("<H", head[8:10])[0]
    if (
        name_len != len(MIMETYPE_ENTRY)
        or extra_len != 0
        or compression != 0
        or head[_MAGIC_NAME_OFFSET : _MAGIC_NAME_OFFSET + name_len] != MIMETYPE_ENTRY.encode()
        or head[_MAGIC_NAME_OFFSET + name_len :] != media
    ):
        raise ArtifactError(
            f"{name} is a zip file but not a neuron-workbench artifact "
            f"(its first entry is not 'mimetype' = {MEDIA_TYPE})"
        )


def _safe_entry_name(entry: str) -> bool:
    if not entry or entry.startswith(("/", "\\")) or "\\" in entry or ":" in entry:
        return False
    if "\x00" in entry:
        return False
    parts = entry.split("/")
    return all(part not in ("", ".", "..") for part in parts)


def _check_entries(archive: zipfile.ZipFile, name: str, size: int) -> dict[str, zipfile.ZipInfo]:
    infos = archive.infolist()
    if len(infos) > MAX_ROLES + 2:
        raise ArtifactError(
            f"{name} has {len(infos)} entries (an artifact has at most {MAX_ROLES + 2})"
        )
    entries: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        entry = info.filename
        shown = repr(entry[:80])
        if not _safe_entry_name(entry) or info.orig_filename != entry:
            raise ArtifactError(f"{name}: unsafe entry name {repr(info.orig_filename[:80])}")
        if entry in entries:
            raise ArtifactError(f"{name}: entry {shown} appears twice")
        allowed = entry in (MIMETYPE_ENTRY, MANIFEST_ENTRY) or (
            entry.startswith(TENSOR_DIR)
            and entry.endswith(".safetensors")
            and ROLE_PATTERN.fullmatch(entry[len(TENSOR_DIR) : -len(".safetensors")]) is not None
        )
        if not allowed:
            raise ArtifactError(
                f"{name}: unexpected entry {shown} (an artifact holds only mimetype, manifest.json "
                "and tensors/<role>.safetensors)"
            )
        if info.flag_bits & 0x1:
            raise ArtifactError(f"{name}: entry {shown} is encrypted")
        stored_only = entry != MANIFEST_ENTRY
        if info.compress_type not in (
            (zipfile.ZIP_STORED,) if stored_only else (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
        ):
            raise ArtifactError(f"{name}: entry {shown} uses an unsupported compression")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise ArtifactError(f"{name}: entry {shown} declares inconsistent sizes")
        end = info.header_offset + _LOCAL_HEADER_SIZE + len(entry) + info.compress_size
        if end > size:
            raise ArtifactError(
                f"{name}: entry {shown} declares {info.compress_size} bytes but the file has only "
                f"{size} bytes (truncated or corrupt)"
            )
        entries[entry] = info
    for required in (MIMETYPE_ENTRY, MANIFEST_ENTRY):
        if required not in entries:
            raise ArtifactError(f"{name}: missing entry {required!r}")
    return entries


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, limit: int) -> bytes:
    """Read at most ``limit`` bytes of an entry (the whole entry when it fits), verifying its CRC."""
    try:
        with archive.open(info) as stream:
            data = stream.read(limit + 1 if info.file_size <= limit else limit)
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        OSError,
        ValueError,
        NotImplementedError,
    ) as exc:
        raise ArtifactError(f"{name}: entry {info.filename!r} is corrupt: {exc}") from None
    if len(data) > info.file_size:
        raise ArtifactError(f"{name}: entry {info.filename!r} is larger than it declares")
    return data


def _tensor_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> dict[str, Any]:
    entry = info.filename
    if info.file_size < 8:
        raise ArtifactError(f"{name}: {entry} is too short to be safetensors")
    try:
        with archive.open(info) as stream:
            (header_len,) = struct.unpack("<Q", stream.read(8))
            if header_len > min(MAX_SAFETENSORS_HEADER, info.file_size - 8):
                raise ArtifactError(
                    f"{name}: {entry} declares a {header_len}-byte header in a "
                    f"{info.file_size}-byte entry (not safetensors, or corrupt)"
                )
            raw = stream.read(header_len)
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        OSError,
        struct.error,
        NotImplementedError,  # "zip file version 8.4" and other features zipfile lacks
    ) as exc:
        raise ArtifactError(f"{name}: {entry} is corrupt: {exc}") from None
    if len(raw) != header_len:
        raise ArtifactError(f"{name}: {entry} is truncated")
    header = parse_json(raw, f"{name}: {entry} header")
    if not isinstance(header, dict):
        raise ArtifactError(f"{name}: {entry} header is not a JSON object")
    header.pop("__metadata__", None)
    header["__data_bytes__"] = info.file_size - 8 - header_len
    return header


def _check_tensor_header(
    header: dict[str, Any], leaves: list[dict[str, Any]], name: str, entry: str
) -> None:
    """The safetensors header must describe exactly the manifest's tensors, within the entry."""
    data_bytes = header.pop("__data_bytes__")
    declared = sum(leaf["nbytes"] for leaf in leaves)
    if declared > data_bytes:
        raise ArtifactError(
            f"{name}: the manifest declares {declared} bytes of tensors but {entry} holds only "
            f"{data_bytes}"
        )
    keys = {leaf["key"] for leaf in leaves}
    if set(header) != keys:
        raise ArtifactError(f"{name}: {entry} does not hold the tensors the manifest lists")
    spans = []
    for leaf in leaves:
        item = header[leaf["key"]]
        dtype = DTYPES[leaf["dtype"]]
        native = dtype in SAFETENSORS_CODES
        code = SAFETENSORS_CODES[dtype] if native else "U8"
        shape = leaf["shape"] if native else [leaf["nbytes"]]
        if not isinstance(item, dict) or item.get("dtype") != code or item.get("shape") != shape:
            raise ArtifactError(
                f"{name}: tensor {leaf['path'][:60]!r} in {entry} does not match its declared "
                "dtype and shape"
            )
        offsets = item.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_bytes
            or offsets[1] - offsets[0] != leaf["nbytes"]
        ):
            raise ArtifactError(
                f"{name}: tensor {leaf['path'][:60]!r} declares {leaf['nbytes']} bytes that "
                f"{entry} ({data_bytes} data bytes) does not hold"
            )
        spans.append((offsets[0], offsets[1]))
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise ArtifactError(f"{name}: {entry} declares overlapping tensors")


def _restore_tensor(leaf: dict[str, Any], stored: torch.Tensor) -> Any:
    dtype = DTYPES[leaf["dtype"]]
    tensor = stored if dtype in SAFETENSORS_CODES else stored.view(dtype).reshape(leaf["shape"])
    if leaf.get("container") == "numpy":
        try:
            return tensor.numpy()
        except (ImportError, RuntimeError, TypeError):  # no NumPy here, or a dtype it lacks
            return tensor
    return tensor


def _number(value: Any) -> float:
    return float(value)


def _restore_scalar(leaf: dict[str, Any], name: str) -> Any:
    value = _restore_plain_scalar(leaf, name)
    origin = leaf.get("provenance")
    if origin is None:
        return value
    fields = ("kind", "source", "unit", "dtype")
    return tag(value, Provenance(*(origin.get(key) for key in fields)))


def _restore_plain_scalar(leaf: dict[str, Any], name: str) -> Any:
    kind = leaf["kind"]
    value = leaf.get("value")
    if kind == "none":
        return None
    if kind == "float":
        return float(value)
    if kind == "complex":
        return complex(_number(value[0]), _number(value[1]))
    if kind == "not-compared":
        return NotCompared(str(value))
    if kind == "bytes":
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ArtifactError(
                f"{name}: output {leaf['path'][:60]!r} is not valid base64"
            ) from None
    return value  # bool, int, str: exactly as JSON gave them


def _build_run(
    role: str,
    data: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    name: str,
) -> Run:
    outputs: dict[str, Any] = {}
    for leaf in data["outputs"]:
        if leaf["kind"] == "tensor":
            outputs[leaf["path"]] = _restore_tensor(leaf, tensors[leaf["key"]])
        else:
            outputs[leaf["path"]] = _restore_scalar(leaf, name)
    memory = data.get("memory", {})
    error = data.get("error")
    wall = data.get("wall_time_s")
    run = Run(
        backend=BackendInfo.from_dict(data["backend"]),
        error=RunError.from_dict(error) if error is not None else None,
        outputs=outputs,
        stdout=data.get("stdout", ""),
        stderr=data.get("stderr", ""),
        fallbacks=[dict(event) for event in data.get("fallbacks", [])],
        memory=MemoryStats(memory.get("current_bytes"), memory.get("peak_bytes")),
        wall_time_s=float(wall) if wall is not None else None,
        shared_names=list(data.get("shared_names", [])),
        extras=dict(data.get("extras", {})),
    )
    _restore_optional_fields(run, data)
    return run


def _like(value: Any, default: Any) -> bool:
    """Whether JSON ``value`` has the shape of a dataclass field's ``default`` value."""
    if isinstance(default, bool) or default is None:
        return isinstance(value, bool) if isinstance(default, bool) else value is None
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, dict):  # counters by name (RunFacts.random_ops)
        return isinstance(value, dict) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values()
        )
    if isinstance(default, list):  # names (RunFacts.autocast_dtypes)
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return False


def _json_scalars(items: list[Any], depth: int = 0) -> bool:
    """Whether ``items`` holds only JSON scalars and (shallow) lists of them."""
    return depth < 3 and all(
        v is None
        or isinstance(v, bool | int | float | str)
        or (isinstance(v, list) and _json_scalars(v, depth + 1))
        for v in items
    )


def _restore_optional_fields(run: Run, data: dict[str, Any]) -> None:
    """Set ``facts`` and ``steps`` on Run versions that have them.

    Both are context for hints, so a value of the wrong shape is dropped rather than refused.
    """
    facts = data.get("facts")
    current = getattr(run, "facts", None)
    if isinstance(facts, dict) and dataclasses.is_dataclass(current):
        values = {}
        for item in dataclasses.fields(current):
            value = facts.get(item.name)
            if item.name == "random_draws":  # fingerprints: lists of JSON scalars
                fits = isinstance(value, list) and all(
                    isinstance(v, list) and _json_scalars(v) for v in value
                )
            elif item.name == "measured_texts":  # [text, kind, source] each
                fits = isinstance(value, list) and all(
                    isinstance(v, list) and len(v) == 3 and all(isinstance(s, str) for s in v)
                    for v in value
                )
                value = {text: (kind, source) for text, kind, source in value} if fits else value
            elif item.name == "measured_values":  # [kind, source, [value, ...]] each
                fits = isinstance(value, list) and all(
                    isinstance(v, list)
                    and len(v) == 3
                    and all(isinstance(s, str) for s in v[:2])
                    and isinstance(v[2], list)
                    and all(isinstance(n, int | float) and not isinstance(n, bool) for n in v[2])
                    for v in value
                )
                if fits:
                    value = {float(n): (kind, source) for kind, source, ns in value for n in ns}
            else:
                fits = item.name in facts and _like(value, getattr(current, item.name))
            if fits:
                values[item.name] = value
        try:
            run.facts = type(current)(**values)
        except (TypeError, ValueError):
            pass
    steps = data.get("steps")
    if isinstance(steps, list) and hasattr(run, "steps"):
        run.steps = [
            {str(k): v for k, v in step.items() if isinstance(v, float)}
            for step in steps
            if isinstance(step, dict)
        ]


def load(path: str | os.PathLike[str]) -> RunArtifact:
    """Load an artifact written by :func:`save`, validating everything before trusting it.

    Nothing is unpickled, executed or extracted to disk. Entry names, the manifest's layout, types
    and format version, and every declared size (zip entries against the file, tensors against their
    entry) are checked before tensor data is read.

    Raises
    ------
    ArtifactError
        The only error for bad input: one line naming the file and the problem.
    """
    file = Path(path)
    name = str(file)
    try:
        handle = open(file, "rb")  # noqa: SIM115 - closed in the finally below
    except FileNotFoundError:
        raise ArtifactError(f"no such artifact: {name}") from None
    except IsADirectoryError:
        raise ArtifactError(f"{name} is a directory, not an artifact file") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        size = os.fstat(handle.fileno()).st_size
        _check_magic(handle, name, size)
        handle.seek(0)
        try:
            archive = zipfile.ZipFile(handle)
        except (
            zipfile.BadZipFile,
            zipfile.LargeZipFile,
            EOFError,
            OSError,
            ValueError,
            NotImplementedError,
        ) as exc:
            raise ArtifactError(f"{name} is truncated or corrupt ({exc})") from None
        with archive:
            return _load_archive(archive, file, name, size)
    except (RecursionError, MemoryError) as exc:
        raise ArtifactError(f"{name} is corrupt ({type(exc).__name__})") from None
    finally:
        handle.close()


def _load_archive(archive: zipfile.ZipFile, file: Path, name: str, size: int) -> RunArtifact:
    entries = _check_entries(archive, name, size)
    manifest_info = entries[MANIFEST_ENTRY]
    if manifest_info.file_size > MAX_MANIFEST_BYTES:
        raise ArtifactError(
            f"{name}: manifest.json declares {manifest_info.file_size} bytes "
            f"(limit {MAX_MANIFEST_BYTES})"
        )
    raw = _read(archive, manifest_info, name, MAX_MANIFEST_BYTES)
    manifest = parse_json(raw, f"{name}: manifest.json")
    validate_manifest(manifest, name)
    runs_data: dict[str, dict[str, Any]] = manifest["runs"]
    referenced = {run["tensor_file"] for run in runs_data.values() if run.get("tensor_file")}
    for entry in entries:
        if entry.startswith(TENSOR_DIR) and entry not in referenced:
            raise ArtifactError(f"{name}: entry {entry!r} belongs to no run in the manifest")
    # First every size check, then any tensor data: nothing large is read before all headers agree.
    plans = []
    for role, run in runs_data.items():
        entry = run.get("tensor_file")
        if entry is None:
            continue
        if entry not in entries:
            raise ArtifactError(f"{name}: missing entry {entry!r} for run {role!r}")
        leaves = [leaf for leaf in run["outputs"] if leaf["kind"] == "tensor"]
        header = _tensor_header(archive, entries[entry], name)
        _check_tensor_header(header, leaves, name, entry)
        plans.append((role, entries[entry]))
    tensors_by_role: dict[str, dict[str, torch.Tensor]] = {}
    for role, info in plans:
        blob = _read(archive, info, name, info.file_size)
        try:
            tensors_by_role[role] = safetensors_load(blob)
        except (SafetensorError, ValueError, RuntimeError, TypeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ArtifactError(f"{name}: {info.filename} is corrupt: {first}") from None
    runs = {
        role: _build_run(role, data, tensors_by_role.get(role, {}), name)
        for role, data in runs_data.items()
    }
    return RunArtifact(
        runs=runs,
        cell_source=manifest["cell"]["source"],
        cell_sha256=manifest["cell"]["sha256"],
        environment=dict(manifest.get("environment", {})),
        report=manifest.get("report"),
        manifest=manifest,
        path=file,
    )

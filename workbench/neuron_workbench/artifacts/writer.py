"""Write runs into one artifact file (zip: mimetype, manifest.json, tensors/<role>.safetensors)."""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import math
import os
import platform
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_save

from neuron_workbench.artifacts._format import (
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_ENTRY,
    MAX_INT,
    MAX_INT_DIGITS,
    MAX_ROLES,
    MEDIA_TYPE,
    MIMETYPE_ENTRY,
    ROLE_PATTERN,
    ROLE_RULE,
    SAFETENSORS_CODES,
    ArtifactError,
    dumps,
    tensor_entry,
)
from neuron_workbench.compare.flatten import iter_leaves
from neuron_workbench.run.measurements import provenance_of
from neuron_workbench.run.records import NotCompared, Run, recorded
from neuron_workbench.version import __version__

# JSON values the writer nests below this depth inside the manifest (whose own structure adds a few
# levels) always stay under the reader's depth limit.
_VALUE_DEPTH = 40
# A fixed zip timestamp: the artifact's creation time lives in the manifest, not in entry headers.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class _NotJson(TypeError):
    pass


def _strict_json(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data, or :class:`_NotJson` if it holds anything else."""
    if depth > _VALUE_DEPTH:
        raise _NotJson("nested too deeply")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise _NotJson("non-string key")
        return {key: _strict_json(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(item, depth + 1) for item in value]
    raise _NotJson(type(value).__name__)


def _lenient_json(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data; anything else (or too deep) becomes its ``str``.

    A ``to_dict()`` that raises leaves the value's ``str`` followed by the error, so the manifest
    says why the data is missing instead of silently holding the object's text.
    """
    if depth > _VALUE_DEPTH:
        return str(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "to_dict") and callable(value.to_dict):
        try:
            data = value.to_dict()
        except Exception as exc:  # any object can get here; its failure is recorded, not dropped
            return f"{value} (to_dict() failed: {type(exc).__name__}: {exc})"
        return _lenient_json(data, depth + 1)
    if isinstance(value, Mapping):
        return {str(key): _lenient_json(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_lenient_json(item, depth + 1) for item in value]
    return str(value)


def _float_value(value: float) -> float | str:
    value = float(value)
    return value if math.isfinite(value) else str(value)


def _origin(value: Any) -> dict[str, Any]:
    """A leaf's ``provenance`` (a measurement, a scalar made from a tensor), or nothing."""
    prov = provenance_of(value)
    if prov is None:
        return {}
    fields = {"kind": prov.kind, "source": prov.source, "unit": prov.unit, "dtype": prov.dtype}
    return {"provenance": {key: item for key, item in fields.items() if item is not None}}


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A dense, contiguous CPU tensor with the same bits, sharing no memory with anything else."""
    t = tensor.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.cpu().resolve_conj().resolve_neg()
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    # clone: safetensors refuses tensors that share storage (views of one another).
    return t.contiguous().clone()


def _as_tensor_leaf(value: Any) -> tuple[torch.Tensor, str]:
    if isinstance(value, torch.Tensor):
        return _cpu_copy(value), "torch"
    import numpy

    # np.array, not ascontiguousarray: that one turns 0-d arrays (NumPy scalars) into 1-d.
    array = numpy.array(value, copy=True, order="C")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return torch.from_numpy(array).clone(), "numpy"


def _leaves(run: Run) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor], list[dict[str, str]]]:
    """The run's outputs as manifest leaves, the tensors to store, and what could not be stored."""
    leaves: list[dict[str, Any]] = []
    tensors: dict[str, torch.Tensor] = {}
    skipped: list[dict[str, str]] = []
    seen: set[str] = set()
    for path, value in iter_leaves(run.outputs):
        if path in seen:  # two names cannot give one path, but stay safe: the first one wins
            continue
        seen.add(path)
        if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
            try:
                tensor, container = _as_tensor_leaf(value)
                dtype_name = str(tensor.dtype).removeprefix("torch.")
                if dtype_name not in DTYPES:
                    raise TypeError(f"dtype {dtype_name} cannot be stored")
            except Exception as exc:  # e.g. a NumPy object array, a quantized tensor
                skipped.append({"path": path, "reason": f"{type(exc).__name__}: {exc}"})
                continue
            key = f"t{len(tensors)}"
            stored = tensor
            if tensor.dtype not in SAFETENSORS_CODES:
                # complex128 and friends: stored as their raw bytes, typed by the manifest.
                stored = tensor.reshape(-1).view(torch.uint8)
            tensors[key] = stored
            leaves.append(
                {
                    "path": path,
                    "kind": "tensor",
                    "key": key,
                    "dtype": dtype_name,
                    "shape": list(tensor.shape),
                    "nbytes": tensor.numel() * tensor.element_size(),
                    "container": container,
                }
            )
        elif value is None:
            leaves.append({"path": path, "kind": "none"})
        elif isinstance(value, bool):
            leaves.append({"path": path, "kind": "bool", "value": value})
        elif isinstance(value, int) and not -MAX_INT < value < MAX_INT:
            # JSON writes ints as decimal digits, and Python refuses to convert one of more than
            # MAX_INT_DIGITS (sys.get_int_max_str_digits()'s default) either way: the recording is
            # written, and the output says why it is not in it (compare lists it as not compared).
            reason = f"an int of more than {MAX_INT_DIGITS} digits is not recorded"
            skipped.append({"path": path, "reason": reason})
            leaves.append({"path": path, "kind": "not-compared", "value": reason})
        elif isinstance(value, int):
            leaves.append({"path": path, "kind": "int", "value": int(value), **_origin(value)})
        elif isinstance(value, float):
            leaves.append(
                {"path": path, "kind": "float", "value": _float_value(value), **_origin(value)}
            )
        elif isinstance(value, complex):
            leaves.append(
                {
                    "path": path,
                    "kind": "complex",
                    "value": [_float_value(value.real), _float_value(value.imag)],
                }
            )
        elif isinstance(value, str):
            leaves.append({"path": path, "kind": "str", "value": str(value), **_origin(value)})
        elif isinstance(value, bytes):
            leaves.append(
                {"path": path, "kind": "bytes", "value": base64.b64encode(value).decode("ascii")}
            )
        elif isinstance(value, NotCompared):  # it could not come back: say so in the artifact too
            leaves.append({"path": path, "kind": "not-compared", "value": value.reason})
    return leaves, tensors, skipped


def _extras(run: Run) -> tuple[dict[str, Any], list[str]]:
    kept: dict[str, Any] = {}
    skipped: list[str] = []
    for name, value in run.extras.items():
        try:
            value = recorded(value)
            if hasattr(value, "to_dict") and callable(value.to_dict):
                value = value.to_dict()
            if not isinstance(value, Mapping | list | tuple):
                raise _NotJson(type(value).__name__)
            kept[str(name)] = _strict_json(value)
        except Exception:  # an instrument's result that is not data is left out, by name
            skipped.append(str(name))
    return kept, skipped


def _run_manifest(role: str, run: Run) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    leaves, tensors, skipped = _leaves(run)
    extras, extras_skipped = _extras(run)
    data = {
        "backend": _lenient_json(run.backend.to_dict()),
        "error": run.error.to_dict() if run.error is not None else None,
        "fallbacks": [_lenient_json(dict(event)) for event in run.fallbacks],
        "memory": {
            "current_bytes": run.memory.current_bytes,
            "peak_bytes": run.memory.peak_bytes,
        },
        "wall_time_s": run.wall_time_s,
        "shared_names": [str(name) for name in run.shared_names],
        "stdout": run.stdout,
        "stderr": run.stderr,
        "extras": extras,
        "extras_skipped": extras_skipped,
        # Newer Run fields, kept when present (facts explain numeric differences; steps: a curve).
        "facts": _lenient_json(getattr(run, "facts", None)),
        "steps": _lenient_json(getattr(run, "steps", None)) or [],
        "tensor_file": tensor_entry(role) if tensors else None,
        "outputs": leaves,
        "skipped_outputs": skipped,
    }
    return data, tensors


def environment() -> dict[str, Any]:
    """Versions and platform of this process, as recorded in every artifact."""
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "workbench": __version__,
    }


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _zip_info(name: str, compress: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = compress
    info.external_attr = 0o644 << 16
    return info


def save(
    path: str | os.PathLike[str],
    *,
    runs: Mapping[str, Run],
    cell_source: str,
    report: dict[str, Any] | None = None,
) -> Path:
    """Save runs of one cell as a single artifact file, atomically.

    Parameters
    ----------
    path : path-like
        The file to write (conventionally ``*.nwrun.zip``); parent folders are created. Only this file
        and a temporary sibling (renamed over it) are written.
    runs : mapping of str to Run
        Role to run, usually ``{"ref": ..., "target": ...}``; either may be missing. Each run's
        ``outputs`` are flattened into leaves (``model.fc.weight.grad``); tensors are stored bitwise in
        safetensors, numbers, strings and ``None`` in the manifest.
    cell_source : str
        The source the runs executed; its sha256 is recorded to detect a changed cell later.
    report : dict, optional
        ``Report.to_dict()`` of the comparison, when there was one.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    ArtifactError
        When the file cannot be written.
    ValueError
        For an invalid role name or no runs at all (a programming error).
    """
    if not runs:
        raise ValueError("save() needs at least one run")
    if len(runs) > MAX_ROLES:
        raise ValueError(f"at most {MAX_ROLES} runs per artifact")
    for role in runs:
        if not ROLE_PATTERN.fullmatch(role):
            raise ValueError(f"invalid run role {role!r} ({ROLE_RULE})")
    target = Path(path)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    created = created.replace("+00:00", "Z")
    run_data: dict[str, Any] = {}
    tensor_files: dict[str, bytes] = {}
    for role, run in runs.items():
        data, tensors = _run_manifest(role, run)
        run_data[role] = data
        if tensors:
            tensor_files[tensor_entry(role)] = safetensors_save(
                tensors, metadata={"format": FORMAT, "role": role}
            )
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "workbench_version": __version__,
        "created": created,
        "environment": {**environment(), "created": created},
        "cell": {
            "source": cell_source,
            "sha256": hashlib.sha256(cell_source.encode("utf-8")).hexdigest(),
        },
        "runs": run_data,
        "report": _lenient_json(report) if report is not None else None,
    }
    payload = dumps(manifest)
    tmp_name = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        # mkstemp creates 0600; give the artifact the permissions a normal new file would get.
        os.chmod(tmp_name, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            with zipfile.ZipFile(handle, "w") as archive:
                archive.writestr(
                    _zip_info(MIMETYPE_ENTRY, zipfile.ZIP_STORED), MEDIA_TYPE.encode("ascii")
                )
                archive.writestr(_zip_info(MANIFEST_ENTRY, zipfile.ZIP_DEFLATED), payload)
                for name, blob in tensor_files.items():
                    # Stored, not deflated: tensor bytes barely compress, and stored entries let
                    # the reader check declared sizes against the file exactly.
                    archive.writestr(_zip_info(name, zipfile.ZIP_STORED), blob)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
        tmp_name = None
    except OSError as exc:
        raise ArtifactError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
    return target

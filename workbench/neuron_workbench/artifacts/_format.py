"""The run-artifact format: constants, the one error type, safe JSON, and manifest validation.

An artifact is one zip file (attachable to a bug report) with exactly these entries:

``mimetype``
    First entry, stored uncompressed, holding :data:`MEDIA_TYPE` (as in ODF/EPUB), so the first bytes
    of the file identify it without parsing the zip.
``manifest.json``
    Everything but tensor data, UTF-8 JSON (see :func:`validate_manifest` for the keys).
``tensors/<role>.safetensors``
    One Hugging Face safetensors file per run that has tensor outputs, stored uncompressed.

Nothing in an artifact is ever unpickled or executed: JSON and safetensors are data-only formats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_workbench.errors import WorkbenchUsageError

#: The ``format`` value of every manifest.
FORMAT = "neuron-workbench.run-artifact"
#: The manifest layout this version writes and reads; a reader refuses newer and older layouts.
FORMAT_VERSION = 1
#: Content of the first zip entry, ``mimetype``.
MEDIA_TYPE = "application/vnd.neuron-workbench.run+zip"

MIMETYPE_ENTRY = "mimetype"
MANIFEST_ENTRY = "manifest.json"
TENSOR_DIR = "tensors/"

#: Run roles are short identifiers; they also name the tensor entries.
ROLE_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,31}")
#: What :data:`ROLE_PATTERN` allows, in words (for messages).
ROLE_RULE = "a lowercase letter, then up to 31 lowercase letters, digits, _ and -"


def is_valid_role(role: str) -> bool:
    """Whether ``role`` can name a run in an artifact (see :data:`ROLE_RULE`).

    Parameters
    ----------
    role : str
        A run role such as ``"ref"`` or ``"trn2-bf16"``.

    Returns
    -------
    bool
        True when :func:`~neuron_workbench.artifacts.save` accepts it.
    """
    return ROLE_PATTERN.fullmatch(role) is not None


def is_target_role(role: str) -> bool:
    """Whether ``role`` names a target run: ``target``, or ``target_<backend>`` for the others.

    A recording of several targets (``--target neuron,tpu``) holds the first as ``target`` and
    each other one as ``target_<backend>``; a reference run is never one of them.

    Parameters
    ----------
    role : str
        A run role such as ``"ref"``, ``"target"`` or ``"target_tpu"``.

    Returns
    -------
    bool
        True for a target run's role.
    """
    return role == "target" or role.startswith("target_")


MAX_ROLES = 8
MAX_MANIFEST_BYTES = 64 * 2**20
MAX_SAFETENSORS_HEADER = 100 * 2**20
MAX_JSON_DEPTH = 64
MAX_OUTPUTS = 1_000_000
MAX_DIMS = 32
#: The most decimal digits of an int the manifest holds: Python's default int-to-str limit
#: (``sys.get_int_max_str_digits()``), so any reader can parse what any writer wrote.
MAX_INT_DIGITS = 4300
#: The smallest magnitude an int in the manifest cannot have (10 to the ``MAX_INT_DIGITS``).
MAX_INT = 10**MAX_INT_DIGITS

#: Tensor dtypes an artifact may declare, by name (never resolved with ``getattr`` on user input).
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.complex128,
        torch.complex64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
    )
}

#: safetensors' dtype codes for dtypes it stores natively; other dtypes are stored as raw bytes (U8).
SAFETENSORS_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.complex64: "C64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}

LEAF_KINDS = (
    "tensor",
    "none",
    "bool",
    "int",
    "float",
    "complex",
    "str",
    "bytes",
    "not-compared",
)


class ArtifactError(WorkbenchUsageError):
    """A run artifact cannot be read or written; the message is one line naming the file and problem.

    This is the only exception :func:`neuron_workbench.artifacts.load` raises for bad input. It is a
    :class:`~neuron_workbench.errors.WorkbenchUsageError`, so the command line prints it as one line
    and exits with code 2, and the magics show it as a usage error.
    """

    def __init__(self, message: str) -> None:
        # One line, always: file names or JSON snippets must not break it.
        super().__init__(" ".join(str(message).split()))


def tensor_entry(role: str) -> str:
    """The zip entry name of ``role``'s tensors."""
    return f"{TENSOR_DIR}{role}.safetensors"


def dumps(data: Any) -> bytes:
    """Serialize JSON-ready ``data`` (strict: no NaN/Infinity) as UTF-8 bytes."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, indent=1).encode("utf-8")


class _JsonProblem(ValueError):
    pass


def _check_depth(text: str, limit: int) -> None:
    """Refuse nesting deeper than ``limit`` before ``json.loads`` could recurse that deep."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise _JsonProblem(f"nested deeper than {limit} levels")
        elif char in "]}":
            depth -= 1


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _JsonProblem(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise _JsonProblem(f"{name} is not valid JSON")


def parse_json(raw: bytes, where: str) -> Any:
    """Decode UTF-8 JSON from an untrusted source, with a depth limit, no duplicate keys, no NaN.

    Raises
    ------
    ArtifactError
        Naming ``where`` and the problem.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{where} is not valid UTF-8 (byte {exc.start})") from None
    try:
        _check_depth(text, MAX_JSON_DEPTH)
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _JsonProblem as exc:
        raise ArtifactError(f"{where} is not acceptable JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(
            f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except (RecursionError, ValueError) as exc:  # int too large to convert, and similar
        raise ArtifactError(f"{where} is not valid JSON: {exc}") from None


# --- manifest validation ------------------------------------------------------------------------


class _Invalid(Exception):
    """A manifest problem; becomes an ArtifactError naming the file."""


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _require(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise _Invalid(f"{where} lacks {key!r}")
    return data[key]


def _expect(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    # bool is an int in Python but never a valid count or size here.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _Invalid(f"{where} must be {what}, not a boolean")
    if not isinstance(value, kind):
        raise _Invalid(f"{where} must be {what}, not {_type_name(value)}")
    return value


def _finite_number(value: Any, where: str) -> None:
    # A JSON integer can have thousands of digits; float() of it would overflow later.
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            raise _Invalid(f"{where} is out of range") from None


def _optional_int(value: Any, where: str) -> None:
    if value is not None:
        _expect(value, int, where, "an integer or null")
        if not 0 <= value < 2**63:
            raise _Invalid(f"{where} must be a non-negative 64-bit integer")


def _check_version(manifest: Mapping[str, Any]) -> None:
    if manifest.get("format") != FORMAT:
        raise _Invalid(f"is not a neuron-workbench run artifact (format is not {FORMAT!r})")
    version = _require(manifest, "format_version", "the manifest")
    _expect(version, int, "format_version", "an integer")
    if version > FORMAT_VERSION:
        raise _Invalid(
            f"was written by a newer neuron-workbench (artifact format {version}; this version reads "
            f"format {FORMAT_VERSION}): upgrade neuron-workbench to read it"
        )
    if version < FORMAT_VERSION:
        raise _Invalid(
            f"uses artifact format {version}, which this neuron-workbench no longer reads "
            f"(it reads format {FORMAT_VERSION}): record the run again"
        )


def _check_backend(data: Any, where: str) -> None:
    _expect(data, dict, where, "an object")
    for key in ("name", "device"):
        _expect(_require(data, key, where), str, f"{where}.{key}", "a string")
    _expect(data.get("device_name", ""), str, f"{where}.device_name", "a string")
    _expect(data.get("emulated", False), bool, f"{where}.emulated", "a boolean")
    _expect(data.get("details", {}), dict, f"{where}.details", "an object")


def _check_error(data: Any, where: str) -> None:
    if data is None:
        return
    _expect(data, dict, where, "an object or null")
    for key in ("type", "message"):
        _expect(_require(data, key, where), str, f"{where}.{key}", "a string")
    _optional_int(data.get("lineno"), f"{where}.lineno")
    _expect(data.get("line", ""), str, f"{where}.line", "a string")
    site = data.get("site")
    if site is not None:
        _expect(site, dict, f"{where}.site", "an object or null")
        _expect(site.get("file", ""), str, f"{where}.site.file", "a string")
        _optional_int(site.get("line"), f"{where}.site.line")
        _expect(site.get("function", ""), str, f"{where}.site.function", "a string")


#: Leaf kinds that can carry a ``provenance`` (a measurement, a scalar made from a tensor).
PROVENANCE_LEAF_KINDS = ("int", "float", "str")


def _check_provenance(value: Any, where: str, kind: str) -> None:
    """An optional leaf ``provenance``: ``kind`` and ``source`` strings, ``unit``/``dtype`` if any."""
    if kind not in PROVENANCE_LEAF_KINDS:
        raise _Invalid(f"{where} is only allowed on {', '.join(PROVENANCE_LEAF_KINDS)} leaves")
    _expect(value, dict, where, "an object")
    for key in ("kind", "source"):
        _expect(_require(value, key, where), str, f"{where}.{key}", "a string")
    for key in ("unit", "dtype"):
        if key in value:
            _expect(value[key], str, f"{where}.{key}", "a string")


def _check_leaf(leaf: Any, where: str) -> None:
    _expect(leaf, dict, where, "an object")
    _expect(_require(leaf, "path", where), str, f"{where}.path", "a string")
    kind = _require(leaf, "kind", where)
    if kind not in LEAF_KINDS:
        raise _Invalid(f"{where}.kind must be one of {', '.join(LEAF_KINDS)}")
    if kind == "none":
        return
    if "provenance" in leaf:
        _check_provenance(leaf["provenance"], f"{where}.provenance", kind)
    if kind != "tensor":
        value = _require(leaf, "value", where)
        expected: dict[str, tuple[type | tuple[type, ...], str]] = {
            "bool": (bool, "a boolean"),
            "int": (int, "an integer"),
            "float": ((int, float, str), "a number or 'nan'/'inf'/'-inf'"),
            "complex": (list, "a list [real, imag]"),
            "str": (str, "a string"),
            "bytes": (str, "a base64 string"),
            "not-compared": (str, "the reason, a string"),
        }
        kind_type, what = expected[kind]
        _expect(value, kind_type, f"{where}.value", what)
        if kind == "float" and isinstance(value, str) and value not in ("nan", "inf", "-inf"):
            raise _Invalid(f"{where}.value must be a number or 'nan'/'inf'/'-inf'")
        if kind == "float":
            _finite_number(value, f"{where}.value")
        if kind == "complex":
            if len(value) != 2:
                raise _Invalid(f"{where}.value must be a list [real, imag]")
            for index, part in enumerate(value):
                _expect(part, (int, float, str), f"{where}.value[{index}]", "a number")
                if isinstance(part, str) and part not in ("nan", "inf", "-inf"):
                    raise _Invalid(f"{where}.value[{index}] must be a number")
                _finite_number(part, f"{where}.value[{index}]")
        return
    _expect(_require(leaf, "key", where), str, f"{where}.key", "a string")
    dtype = _require(leaf, "dtype", where)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _Invalid(f"{where}.dtype {str(dtype)[:40]!r} is not a supported tensor dtype")
    shape = _expect(_require(leaf, "shape", where), list, f"{where}.shape", "a list of sizes")
    if len(shape) > MAX_DIMS:
        raise _Invalid(f"{where}.shape has more than {MAX_DIMS} dimensions")
    for index, size in enumerate(shape):
        _expect(size, int, f"{where}.shape[{index}]", "an integer")
        if size < 0:
            raise _Invalid(f"{where}.shape[{index}] must not be negative")
    nbytes = _expect(_require(leaf, "nbytes", where), int, f"{where}.nbytes", "an integer")
    numel = 1
    for size in shape:
        numel *= size
    if nbytes != numel * DTYPES[dtype].itemsize:
        raise _Invalid(f"{where}.nbytes ({nbytes}) does not match its dtype and shape")
    if leaf.get("container", "torch") not in ("torch", "numpy"):
        raise _Invalid(f"{where}.container must be 'torch' or 'numpy'")


@dataclass(frozen=True)
class _Type:
    """The JSON type ``report.schema.json`` gives a field of a run: all the loader accepts there.

    A loaded run's fallback events and its ``compile`` and ``profile`` extras go into the report
    as they are, so a field of another type would make ``compare --json`` write a report that
    fails the schema (or a renderer crash on it): the loader refuses it like any other bad field.
    The schema itself is not read here (jsonschema is a test dependency, and the report sits above
    the artifacts); ``tests/artifacts`` checks every field it types against these tables.
    """

    kinds: tuple[type, ...]
    what: str
    minimum: int | None = None
    items: _Type | None = None  # each item of a list
    fields: Mapping[str, _Type] = field(default_factory=dict)  # known fields of an object
    values: _Type | None = None  # each value of an object (a mapping of any keys)
    length: int | None = None  # the exact length of a list


def _check_type(value: Any, spec: _Type, where: str) -> None:
    """Refuse ``value`` unless it has ``spec``'s type, and so do its items and known fields."""
    _expect(value, spec.kinds, where, spec.what)
    if isinstance(value, int | float) and not isinstance(value, bool):
        _finite_number(value, where)
        if spec.minimum is not None and value < spec.minimum:
            raise _Invalid(f"{where} must be at least {spec.minimum}")
    if isinstance(value, list) and spec.length is not None and len(value) != spec.length:
        raise _Invalid(f"{where} must have {spec.length} items, not {len(value)}")
    if isinstance(value, list) and spec.items is not None:
        for index, item in enumerate(value):
            _check_type(item, spec.items, f"{where}[{index}]")
    if isinstance(value, dict):
        for key, item_spec in spec.fields.items():
            if key in value:
                _check_type(value[key], item_spec, f"{where}.{key}")
        if spec.values is not None:
            for key, item in value.items():
                _check_type(item, spec.values, f"{where}[{key[:60]!r}]")


_NULL = type(None)
_TEXT = _Type((str,), "a string")
_INTEGER = _Type((int,), "an integer")
_SECONDS = _Type((int, float), "a number", minimum=0)
_NUMBER_OR_NULL = _Type((int, float, _NULL), "a number or null")
_OBJECTS = _Type((list,), "a list of objects", items=_Type((dict,), "an object"))
_TEXTS = _Type((list,), "a list of strings", items=_TEXT)

#: ``$defs/fallback`` of report.schema.json (``op`` and ``count`` are checked on their own).
_FALLBACK_FIELDS: dict[str, _Type] = {
    "overload": _TEXT,
    "phase": _TEXT,
    "site": _Type(
        (dict, _NULL),
        "an object or null",
        fields={"file": _TEXT, "line": _INTEGER, "function": _TEXT},
    ),
    "module": _TEXT,
    "module_type": _TEXT,
    "autograd_node": _TEXT,
    "cpu_time_s": _NUMBER_OR_NULL,
    # The schema says arrays; every reader takes them as the emulator writes them: each input's
    # shape (a list) and dtype name.
    "shapes": _Type((list,), "a list of shapes", items=_Type((list,), "a list")),
    "dtypes": _TEXTS,
}

#: One table of a profile: a row per op, as ``OpStat.to_dict`` writes them (trace/profile_data.py).
_PROFILE_ROWS = _Type(
    (list, _NULL),
    "a list of objects or null",
    items=_Type(
        (dict,),
        "an object",
        fields={
            "op": _TEXT,
            "calls": _Type((int,), "an integer", minimum=0),
            "total_time_s": _NUMBER_OR_NULL,
            "self_time_s": _NUMBER_OR_NULL,
            "shapes": _TEXT,
            "bytes_allocated": _Type((int,), "an integer"),
            "fallback": _Type((bool, _NULL), "true, false or null"),
            "overloads": _TEXTS,
            "site": _FALLBACK_FIELDS["site"],
            "module": _TEXT,
        },
    ),
)

#: The extras a report shows as fields of its run (``$defs/run`` of report.schema.json).
_EXTRA_FIELDS: dict[str, _Type] = {
    "compile": _Type(
        (dict,),
        "an object",
        fields={
            "graphs": _Type(
                (list,),
                "a list of objects",
                items=_Type(
                    (dict,),
                    "an object",
                    fields={
                        "function": _TEXT,
                        "line": _INTEGER,
                        "compile_s": _SECONDS,
                        "calls": _Type((int, _NULL), "an integer or null", minimum=0),
                        "run_s": _Type((int, float, _NULL), "a number or null", minimum=0),
                    },
                ),
            ),
            "run_s": _SECONDS,
            "graph_breaks": _OBJECTS,
            "recompiles": _OBJECTS,
            "warnings": _TEXTS,
            "errors": _TEXTS,
            "compile_s": _SECONDS,
            "summary": _TEXT,
        },
    ),
    "profile": _Type(
        (dict, _NULL),
        "an object or null",
        fields={
            "steps": _Type((int,), "an integer", minimum=1),
            "step_times_s": _Type(
                (list,), "a list of numbers", items=_Type((int, float), "a number")
            ),
            # The op tables (untyped in the schema) that the report's views and pages read.
            "rows": _PROFILE_ROWS,
            "first_call": _PROFILE_ROWS,
            "steady": _PROFILE_ROWS,
            "time_kind": _TEXT,
            "total_time_s": _NUMBER_OR_NULL,
        },
    ),
}


_BOOL = _Type((bool,), "true or false")
_TEXT_OR_NULL = _Type((str, _NULL), "a string or null")
_TOLERANCE = _Type((int, float, _NULL), "a non-negative number or null", minimum=0)
_STEPS = _Type((int,), "an integer", minimum=1)

#: ``report.options``: the settings of the recorded comparison, which ``compare`` judges the runs
#: with (``CompareOptions.from_dict``), one entry per option of the compare group of the option
#: table (``cell/options.py``, which sits above the artifacts; ``tests/artifacts`` checks every
#: option has its entry here). Only types are checked: a choice a newer version added is no damage.
_OPTION_FIELDS: dict[str, _Type] = {
    "ref": _TEXT,
    "target": _TEXT,
    "tolerance": _Type(
        (dict, _NULL),
        "an object or null",
        fields={
            "preset": _TEXT,
            "rtol": _TOLERANCE,
            "atol": _TOLERANCE,
            "per_output": _Type(
                (dict, _NULL),
                "an object or null",
                # each output pattern's [rtol, atol]
                values=_Type(
                    (list,),
                    "a list of two numbers",
                    length=2,
                    items=_Type((int, float), "a non-negative number", minimum=0),
                ),
            ),
        },
    ),
    "judge": _TEXT,
    "seed": _Type((int, _NULL), "an integer or null"),
    "keep": _TEXT,
    "layers": _BOOL,
    "layers_full": _Type((list, _NULL), "a list of strings or null", items=_TEXT),
    "steps": _STEPS,
    "max_steps": _Type((int, _NULL), "an integer or null", minimum=1),
    "rng": _TEXT,
    "what_if": _TEXT_OR_NULL,
    "ref_precision": _TEXT,
    "compile_check": _BOOL,
    "list_fallbacks": _BOOL,
    "track_per_op": _BOOL,
}


def _check_options(options: Any) -> None:
    """Refuse recorded options ``compare`` could not judge the runs with (``report.options``)."""
    _check_type(
        options, _Type((dict, _NULL), "an object or null", fields=_OPTION_FIELDS), "report.options"
    )
    tolerance = (options or {}).get("tolerance") or {}
    # A recording holds both or neither (the flags are given together): one alone is damage, and
    # would read as a usage error about flags the user never gave.
    if (tolerance.get("rtol") is None) != (tolerance.get("atol") is None):
        raise _Invalid("report.options.tolerance must have both rtol and atol, or neither")


def _check_run(role: str, run: Any) -> None:
    where = f"runs.{role}"
    _expect(run, dict, where, "an object")
    _check_backend(_require(run, "backend", where), f"{where}.backend")
    _check_error(run.get("error"), f"{where}.error")
    fallbacks = _expect(run.get("fallbacks", []), list, f"{where}.fallbacks", "a list")
    for index, event in enumerate(fallbacks):
        at = f"{where}.fallbacks[{index}]"
        _expect(event, dict, at, "an object")
        _expect(_require(event, "op", at), str, f"{at}.op", "a string")
        count = event.get("count", 0)
        _expect(count, int, f"{at}.count", "an integer")
        if not 0 <= count < 2**63:
            raise _Invalid(f"{at}.count must be a non-negative 64-bit integer")
        for key, spec in _FALLBACK_FIELDS.items():
            if key in event:
                _check_type(event[key], spec, f"{at}.{key}")
    memory = _expect(run.get("memory", {}), dict, f"{where}.memory", "an object")
    for key in ("current_bytes", "peak_bytes"):
        _optional_int(memory.get(key), f"{where}.memory.{key}")
    wall = run.get("wall_time_s")
    if wall is not None:
        _expect(wall, (int, float), f"{where}.wall_time_s", "a number or null")
        _finite_number(wall, f"{where}.wall_time_s")
    names = _expect(run.get("shared_names", []), list, f"{where}.shared_names", "a list")
    for index, name in enumerate(names):
        _expect(name, str, f"{where}.shared_names[{index}]", "a string")
    for key in ("stdout", "stderr"):
        _expect(run.get(key, ""), str, f"{where}.{key}", "a string")
    extras = _expect(run.get("extras", {}), dict, f"{where}.extras", "an object")
    for key, spec in _EXTRA_FIELDS.items():
        if key in extras:
            _check_type(extras[key], spec, f"{where}.extras.{key}")
    _expect(run.get("steps", []), list, f"{where}.steps", "a list")
    for key in ("extras_skipped", "skipped_outputs"):
        items = _expect(run.get(key, []), list, f"{where}.{key}", "a list")
        for index, item in enumerate(items):
            # Names of extras, or {"path", "reason"} of outputs that could not be stored.
            _expect(
                item,
                str if key == "extras_skipped" else dict,
                f"{where}.{key}[{index}]",
                "a string" if key == "extras_skipped" else "an object",
            )
    tensor_file = run.get("tensor_file")
    if tensor_file is not None and tensor_file != tensor_entry(role):
        raise _Invalid(f"{where}.tensor_file must be {tensor_entry(role)!r} or null")
    outputs = _expect(_require(run, "outputs", where), list, f"{where}.outputs", "a list")
    if len(outputs) > MAX_OUTPUTS:
        raise _Invalid(f"{where}.outputs has more than {MAX_OUTPUTS} entries")
    keys: set[str] = set()
    paths: set[str] = set()
    for index, leaf in enumerate(outputs):
        _check_leaf(leaf, f"{where}.outputs[{index}]")
        if leaf["path"] in paths:
            raise _Invalid(f"{where}.outputs[{index}] repeats the path {leaf['path'][:60]!r}")
        paths.add(leaf["path"])
        if leaf["kind"] == "tensor":
            if tensor_file is None:
                raise _Invalid(f"{where} has tensor outputs but no tensor_file")
            if leaf["key"] in keys:
                raise _Invalid(f"{where}.outputs[{index}] repeats the tensor key")
            keys.add(leaf["key"])


def validate_manifest(manifest: Any, name: str) -> None:
    """Check the manifest's layout, types and sizes; raise :class:`ArtifactError` naming ``name``.

    Top-level keys: ``format``, ``format_version``, ``workbench_version``, ``created``,
    ``environment`` (object), ``cell`` (``source``, ``sha256``), ``runs`` (role → run) and ``report``
    (object or null). Each run: ``backend``, ``error``, ``fallbacks``, ``memory``, ``wall_time_s``,
    ``shared_names``, ``stdout``, ``stderr``, ``extras``, ``tensor_file`` and ``outputs`` (a list of
    leaves: ``path``, ``kind`` and either ``value`` or, for tensors, ``key``, ``dtype``, ``shape``,
    ``nbytes``, ``container``). Every field of a run that the report carries, fallback events and
    the ``compile`` and ``profile`` extras included, must have the type report.schema.json gives it.
    """
    try:
        _expect(manifest, dict, "the manifest", "an object")
        _check_version(manifest)
        _expect(manifest.get("workbench_version", ""), str, "workbench_version", "a string")
        _expect(manifest.get("created", ""), str, "created", "a string")
        _expect(manifest.get("environment", {}), dict, "environment", "an object")
        cell = _expect(_require(manifest, "cell", "the manifest"), dict, "cell", "an object")
        _expect(_require(cell, "source", "cell"), str, "cell.source", "a string")
        sha = _expect(_require(cell, "sha256", "cell"), str, "cell.sha256", "a string")
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise _Invalid("cell.sha256 must be 64 lowercase hex digits")
        runs = _expect(_require(manifest, "runs", "the manifest"), dict, "runs", "an object")
        if not runs:
            raise _Invalid("holds no runs")
        if len(runs) > MAX_ROLES:
            raise _Invalid(f"holds more than {MAX_ROLES} runs")
        for role, run in runs.items():
            if not ROLE_PATTERN.fullmatch(role):
                raise _Invalid(f"run role {role[:40]!r} is not a valid role name")
            _check_run(role, run)
        report = manifest.get("report")
        if report is not None:
            _expect(report, dict, "report", "an object or null")
            # compare judges the runs with the recorded options: a damaged one is refused here,
            # not met as a TypeError deep inside the comparison
            _check_options(report.get("options"))
    except _Invalid as exc:
        raise ArtifactError(f"{name}: {exc}") from None

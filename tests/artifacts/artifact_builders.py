"""Build artifacts, valid and hostile, with plain zipfile (no workbench code in the hostile paths)."""

import json
import zipfile

import torch

from neuron_workbench.artifacts import MEDIA_TYPE
from neuron_workbench.backends import get_backend
from neuron_workbench.run import RunSpec, compile_cell, execute

CELL = """
import torch
model = torch.nn.Linear(4, 3).cuda()
x = torch.randn(5, 4, device="cuda")
out = {"logits": [model(x)], "n": 3, "lr": 0.5, "name": "lin", "none": None}
loss = out["logits"][0].sum()
loss.backward()
values, order = torch.sort(x[:, 0])
"""


def run_cell(source, backend, namespace=None):
    program = compile_cell(source)
    return execute(
        RunSpec(program, namespace if namespace is not None else {}), get_backend(backend)
    )


def bits(tensor):
    """The tensor's bytes, for bitwise comparison (NaN payloads and -0.0 included)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def write_zip(path, entries, *, mimetype=True):
    """Write ``entries`` (name -> bytes, or (bytes, compress_type)) after a proper mimetype entry."""
    with zipfile.ZipFile(path, "w") as archive:
        if mimetype:
            archive.writestr(zipfile.ZipInfo("mimetype"), MEDIA_TYPE.encode())
        for name, data in entries.items():
            compress = zipfile.ZIP_STORED
            if isinstance(data, tuple):
                data, compress = data
            info = zipfile.ZipInfo(name)
            info.compress_type = compress
            archive.writestr(info, data)
    return path


def read_entries(path):
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def rewrite(src, dst, *, manifest=None, drop=(), add=None):
    """Copy an artifact, replacing its manifest (a dict or raw bytes) and adding/dropping entries."""
    entries = read_entries(src)
    entries.pop("mimetype")
    if manifest is not None:
        entries["manifest.json"] = (
            manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
        )
    for name in drop:
        entries.pop(name, None)
    entries.update(add or {})
    return write_zip(dst, entries)


def manifest_of(path):
    return json.loads(read_entries(path)["manifest.json"])

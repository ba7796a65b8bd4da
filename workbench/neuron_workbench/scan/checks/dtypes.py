"""Dtypes and memory formats neuron lacks: float64 (NW180), complex (NW182), channels_last (NW193)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.rule import NEURON_ENV, NEURON_NOTES, NEURON_SOURCE, TPU_NOTES, Rule

NW180 = Rule(
    "NW180",
    "float64",
    "warning",
    "float64 is computed as float32 on neuron (no fp64 hardware).",
    "Use float32 on the device, or keep the fp64 part on CPU.",
    f"{NEURON_NOTES} §7 (64-bit dtypes: eager ops cast float64 to float32; {NEURON_SOURCE})",
)
NW182 = Rule(
    "NW182",
    "complex-dtype",
    "warning",
    "Complex dtypes are not supported on neuron (decomposed since 2.33) nor everywhere on TPU.",
    "Work on real and imaginary parts (`torch.view_as_real`) or keep this on CPU.",
    f"{NEURON_NOTES} §7 (complex: xfail 'Complex data types are not supported on Neuron'; "
    f"TORCH_NEURONX_COMPLEX_DECOMPOSE, {NEURON_ENV}); {TPU_NOTES} §5",
)
NW193 = Rule(
    "NW193",
    "channels-last",
    "error",
    "`channels_last` memory format is rejected on neuron.",
    "Drop `memory_format=torch.channels_last` (use contiguous tensors).",
    f"{NEURON_NOTES} §10 ('Neuron tensors only support contiguous or preserve memory format'; "
    f"{NEURON_SOURCE})",
)

_FLOAT64 = ("torch.float64", "torch.double", "torch.DoubleTensor")
_COMPLEX = (
    "torch.complex64",
    "torch.complex128",
    "torch.cfloat",
    "torch.cdouble",
    "torch.complex32",
    "torch.chalf",
)
_COMPLEX_FACTORIES = ("torch.view_as_complex", "torch.complex", "torch.polar")


def _call(scan: Scan, node: ast.Call) -> None:
    func = node.func
    qn = scan.qn(func)
    if (
        isinstance(func, ast.Attribute)
        and qn is None
        and func.attr == "double"
        and not node.args
        and not node.keywords
    ):
        scan.report(
            NW180,
            node,
            "`.double()` makes float64, computed as float32 on neuron",
            pos=scan.attr_pos(func),
        )
    elif qn in _COMPLEX_FACTORIES:
        scan.report(NW182, node, f"`{qn}` creates a complex tensor")


def _made_on_the_cpu(scan: Scan, node: ast.AST) -> bool:
    """Whether ``node`` is the ``dtype=`` of a call that names the CPU as its device.

    ``torch.zeros(2, dtype=torch.float64, device="cpu")`` stays on the host, where float64 is
    float64: the port leaves it alone.
    """
    keyword = scan.parents.get(id(node))
    call = scan.parents.get(id(keyword)) if isinstance(keyword, ast.keyword) else None
    if not (isinstance(keyword, ast.keyword) and keyword.arg == "dtype"):
        return False
    if not isinstance(call, ast.Call):
        return False
    for each in call.keywords:
        if each.arg != "device":
            continue
        value = each.value
        if isinstance(value, ast.Call) and scan.qn(value.func) == "torch.device" and value.args:
            value = value.args[0]  # device=torch.device("cpu")
        return isinstance(value, ast.Constant) and value.value == "cpu"
    return False


def _torch_name(scan: Scan, node: ast.Attribute | ast.Name, qn: str, called: bool) -> None:
    if qn in _FLOAT64:
        if not _made_on_the_cpu(scan, node):
            scan.report(NW180, node, f"`{qn}` is computed as float32 on neuron")
    elif qn in _COMPLEX:
        scan.report(NW182, node, f"`{qn}`: complex dtypes are not supported on neuron")
    elif qn.startswith("torch.fft.") and called:
        scan.report(
            NW182,
            node,
            f"`{qn}` produces complex tensors; FFT has no Neuron "
            "kernel in the April-2026 source and runs on CPU (torchneuron.md §12)",
        )
    elif qn in ("torch.channels_last", "torch.channels_last_3d"):
        scan.report(NW193, node, f"`{qn}` is rejected on neuron")


AREA = Area("dtypes", (NW180, NW182, NW193), {ast.Call: _call}, torch_name=_torch_name)

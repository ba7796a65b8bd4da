"""``torch.compile`` options that target CUDA: mode (NW150), dynamic (NW151), backend (NW152)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.context import is_true, kwarg, str_value
from neuron_workbench.scan.rule import NEURON_COMPILE, NEURON_NOTES, TPU_NOTES, Rule

NW150 = Rule(
    "NW150",
    "compile-mode",
    "warning",
    "A CUDA-only `torch.compile` mode (autotune / CUDA graphs).",
    "Drop `mode=`; only the default mode exists on neuron (others warn and fall back).",
    f"{NEURON_NOTES} §5 ({NEURON_COMPILE}: mode only default)",
)
NW151 = Rule(
    "NW151",
    "compile-dynamic",
    "error",
    "`torch.compile(dynamic=True)` is rejected by the neuron backend.",
    "Drop `dynamic=True`; each new input shape compiles once (pad or bucket shapes).",
    f"{NEURON_NOTES} §5 ({NEURON_COMPILE}: dynamic=True is rejected); {TPU_NOTES} §2 (dynamic "
    f"defaults to False)",
)
NW152 = Rule(
    "NW152",
    "compile-backend",
    "error",
    "A `torch.compile` backend that targets CUDA (Inductor/Triton, CUDA graphs).",
    '`backend="neuron"` (or omit it: neuron is auto-selected for neuron tensors); `"tpu"` on TPU.',
    f'{NEURON_NOTES} §5 (backend="neuron"; no Inductor; {NEURON_COMPILE}); {TPU_NOTES} §2 '
    f'(backend="inductor" '
    f"with TPU inputs raises)",
)

_COMPILE_BACKENDS_CUDA = {"inductor", "cudagraphs", "tensorrt", "torch_tensorrt", "onnxrt"}


def _call(scan: Scan, node: ast.Call) -> None:
    if scan.qn(node.func) != "torch.compile":
        return
    mode = str_value(kwarg(node, "mode"))
    if mode and mode != "default":
        scan.report(
            NW150,
            kwarg(node, "mode") or node,
            f'`torch.compile(mode="{mode}")`: neuron has only the default mode',
            "drop `mode=` (other modes warn and fall back to default on neuron; "
            "TorchTPU's handling is not in the notes)",
        )
    if is_true(kwarg(node, "dynamic")):
        scan.report(
            NW151,
            kwarg(node, "dynamic") or node,
            "`torch.compile(dynamic=True)` is rejected by the neuron backend",
        )
    backend = str_value(kwarg(node, "backend"))
    if backend in _COMPILE_BACKENDS_CUDA:
        scan.report(
            NW152,
            kwarg(node, "backend") or node,
            f'`torch.compile(backend="{backend}")` targets CUDA',
            f'use `backend="{scan.target}"` or omit `backend=`',
        )


AREA = Area("torch_compile", (NW150, NW151, NW152), {ast.Call: _call})

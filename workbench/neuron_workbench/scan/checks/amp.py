"""Mixed precision: CUDA autocast and its float16 defaults (NW110-NW112), CUDA GradScaler (NW113)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import TARGETS, Area, Scan
from neuron_workbench.scan.checks.devices import CUDA_DEVICE, check_device
from neuron_workbench.scan.context import arg, kwarg, str_value
from neuron_workbench.scan.rule import (
    NEURON_LANDING,
    NEURON_NOTES,
    NEURON_SOURCE,
    TPU_DOCS,
    TPU_NOTES,
    Rule,
)

NW110 = Rule(
    "NW110",
    "autocast-device",
    "info",
    "Autocast on the CUDA device type.",
    '`torch.autocast("neuron", ...)`; the dtype is kept as written.',
    f'{NEURON_NOTES} §10 (`torch.autocast(device_type="neuron")`); {NEURON_LANDING}',
    fixable=True,
)
NW111 = Rule(
    "NW111",
    "autocast-fp16-default",
    "warning",
    "Autocast without `dtype=` uses float16 on the target (PrivateUse1's default).",
    "Pass `dtype=torch.bfloat16` explicitly, as the Neuron docs advise.",
    f"{NEURON_NOTES} §7 (autocast: PyTorch's PrivateUse1 default is at::kHalf; TorchNeuron does "
    f"not call "
    f"set_autocast_dtype; {NEURON_SOURCE}); {NEURON_NOTES} §10 ({NEURON_LANDING}); {TPU_NOTES} §5",
)
NW112 = Rule(
    "NW112",
    "autocast-fp16",
    "info",
    "Autocast to float16; bfloat16 is the recommended mixed-precision type on the target.",
    "Consider `dtype=torch.bfloat16` (then a GradScaler is usually unnecessary).",
    f"{NEURON_NOTES} §10 (give dtype=torch.bfloat16; {NEURON_LANDING}); {TPU_NOTES} §5 (float16 "
    f"'not yet supported' "
    f"in places; {TPU_DOCS})",
)
NW113 = Rule(
    "NW113",
    "gradscaler-device",
    "info",
    "A GradScaler for CUDA (`torch.cuda.amp.GradScaler`, or `GradScaler()` defaulting to cuda).",
    '`torch.amp.GradScaler("neuron")`. Whether TorchNeuron supports GradScaler is not documented.',
    f"{NEURON_NOTES} §7 (GradScaler: not mentioned in any reviewed doc page; unknown)",
    fixable=True,
)

_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
_CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
_GRADSCALER = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
_CUDA_GRADSCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
#: The positional parameters of ``torch.cuda.amp.autocast``, which the rewrite names.
CUDA_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


def _call(scan: Scan, node: ast.Call) -> None:
    qn = scan.qn(node.func)
    if qn in _AUTOCAST or qn in _CUDA_AUTOCAST:
        scan.device_arg_checked.add(id(node))
        _autocast(scan, node, qn)
    elif qn in _GRADSCALER or qn in _CUDA_GRADSCALER:
        scan.device_arg_checked.add(id(node))
        _gradscaler(scan, node, qn)


def _autocast(scan: Scan, node: ast.Call, qn: str) -> None:
    if qn in _CUDA_AUTOCAST:
        torch_name = _torch_root(scan, node.func)
        fixable = (
            torch_name is not None
            and not any(isinstance(a, ast.Starred) for a in node.args)
            and len(node.args) <= 3
        )
        fix = (
            scan.fix(
                "autocast_call", node, "Call", func=f"{torch_name}.autocast", device=scan.target
            )
            if fixable
            else None
        )
        scan.report(
            NW110,
            node,
            f"`{qn}` is CUDA-only autocast",
            f'use `torch.autocast("{scan.target}", ...)`',
            fix,
        )
        device_is_accel = True
    else:
        device = arg(node, 0, "device_type")
        check_device(scan, device, NW110, message=lambda text: f"autocast on device type {text}")
        value = str_value(device)
        device_is_accel = (
            value is None
            or CUDA_DEVICE.fullmatch(value) is not None
            or (value.split(":")[0] in TARGETS)
        )
    if not device_is_accel:
        return
    dtype = kwarg(node, "dtype")
    if qn in _CUDA_AUTOCAST and dtype is None and len(node.args) >= 2:
        dtype = node.args[1]
    if dtype is None:
        scan.report(
            NW111,
            node,
            f"autocast without `dtype=` runs float16 on {scan.target} (PrivateUse1 default)",
            "pass `dtype=torch.bfloat16` explicitly",
        )
    elif scan.qn(dtype) in ("torch.float16", "torch.half"):
        scan.report(NW112, dtype, "autocast to float16", NW112.suggestion)


def _torch_root(scan: Scan, func: ast.AST) -> str | None:
    # For T.cuda.amp.X reuse T; for a name imported from torch.cuda.amp use an imported torch.
    node = func
    while isinstance(node, ast.Attribute):
        node = node.value
    if (
        isinstance(node, ast.Name)
        and node is not func
        and (scan.ctx.imports.get(node.id, "torch" if node.id == "torch" else None) == "torch")
    ):
        return node.id
    return scan.ctx.torch_alias


def _gradscaler(scan: Scan, node: ast.Call, qn: str) -> None:
    undocumented = f"GradScaler support on {scan.target} is not documented"
    if qn in _CUDA_GRADSCALER:
        torch_name = _torch_root(scan, node.func)
        fix = (
            scan.fix(
                "gradscaler_call",
                node,
                "Call",
                func=f"{torch_name}.amp.GradScaler",
                device=scan.target,
            )
            if torch_name is not None
            else None
        )
        scan.report(
            NW113,
            node,
            f"`{qn}` scales for CUDA",
            f'use `torch.amp.GradScaler("{scan.target}")`; {undocumented}',
            fix,
        )
        return
    device = arg(node, 0, "device")
    if device is None and not any(isinstance(a, ast.Starred) for a in node.args):
        scan.report(
            NW113,
            node,
            "`GradScaler()` without a device defaults to cuda",
            f'use `GradScaler("{scan.target}")`; {undocumented}',
            scan.fix("insert_device", node, "Call", device=scan.target),
        )
    else:
        check_device(
            scan,
            device,
            NW113,
            message=lambda text: f"GradScaler for device {text}",
            suggestion=lambda new: f"use {new}; {undocumented}",
        )


AREA = Area("amp", (NW110, NW111, NW112, NW113), {ast.Call: _call})

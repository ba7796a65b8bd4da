"""CUDA backend settings: ``torch.backends.cudnn`` (NW120) and ``torch.backends.cuda`` (NW121)."""

from __future__ import annotations

import ast

from neuron_workbench.scan.checks.base import Area, Scan
from neuron_workbench.scan.rule import NEURON_NOTES, NEURON_SOURCE, TPU_NOTES, Rule

NW120 = Rule(
    "NW120",
    "cudnn-flags",
    "info",
    "`torch.backends.cudnn` settings have no effect on the target.",
    "Delete the setting; for determinism use `torch.use_deterministic_algorithms(True)`.",
    f"{NEURON_NOTES} §10 (no equivalent of torch.backends.cudnn; {NEURON_SOURCE}); {NEURON_NOTES} "
    f"§6.6 "
    f"(use_deterministic_algorithms disables fusion)",
)
NW121 = Rule(
    "NW121",
    "cuda-backend-flags",
    "info",
    "`torch.backends.cuda` settings (TF32, SDPA kernel choice) have no effect on the target.",
    "Delete the setting. Neuron compiles fp32 matmuls without auto-cast; on TPU use "
    "`torch.set_float32_matmul_precision` or `torch.tpu.precision`.",
    f"{NEURON_NOTES} §10 (no equivalent of cuda.matmul.allow_tf32); {NEURON_NOTES} §7 "
    f"(--auto-cast=none; {NEURON_SOURCE}); "
    f"{TPU_NOTES} §5",
)


def _torch_name(scan: Scan, node: ast.Attribute | ast.Name, qn: str, called: bool) -> None:
    if qn.startswith("torch.backends.cudnn."):
        scan.report(NW120, node, f"`{qn}` has no effect on {scan.target}")
    elif qn.startswith("torch.backends.cuda."):
        scan.report(NW121, node, f"`{qn}` has no effect on {scan.target}")


AREA = Area("backend_flags", (NW120, NW121), torch_name=_torch_name)
